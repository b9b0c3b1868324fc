#!/usr/bin/env python3
"""Checks train.py's torch code paths on the CPU with small torch models (no transformers, no
tokenizers): the training loop with recall sequences mixed into the batches, checkpoint selection,
windowed perplexity, and the two recall measures, whose indexing is checked against an induction
oracle (a model that predicts whatever followed the last earlier occurrence of the current token,
so it recalls every list perfectly) and a model that always predicts one token.

Run: python3 tools/train/torch_selftest.py   (skips when torch is not importable; on Debian,
`apt-get install python3-torch` and run it with /usr/bin/python3)
"""

import json
import math
import os
import random
import sys
import time
import types
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gap_copy  # noqa: E402
import recall_data  # noqa: E402
import train  # noqa: E402

try:
    import torch
except ImportError:  # pragma: no cover - depends on the machine
    torch = None

VOCAB = 2100


def word_encode():
    """One id per distinct string (the intro, the terminator and every " word" get one id each,
    all below 1000; filler ids are 1000 and up)."""
    ids = {}

    def encode(text):
        if text not in ids:
            ids[text] = 10 + len(ids)
        return [ids[text]]
    return encode


if torch is not None:
    class TinyLM(torch.nn.Module):
        """Embedding, one causal attention layer, head: trainable, with the call shape train.py uses."""

        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(VOCAB, 32)
            self.attn = torch.nn.MultiheadAttention(32, 4, batch_first=True)
            self.head = torch.nn.Linear(32, VOCAB)

        def forward(self, input_ids, use_cache=False):
            x = self.embed(input_ids)
            t = input_ids.shape[1]
            mask = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
            y, _ = self.attn(x, x, x, attn_mask=mask, need_weights=False)
            return types.SimpleNamespace(logits=self.head(x + y))

    class InductionOracle(torch.nn.Module):
        def forward(self, input_ids, use_cache=False):
            b, t = input_ids.shape
            logits = torch.zeros(b, t, VOCAB)
            rows = input_ids.tolist()
            for i, row in enumerate(rows):
                last = {}
                for j, token in enumerate(row):
                    if token in last:
                        logits[i, j, row[last[token] + 1]] = 10.0
                    last[token] = j
            return types.SimpleNamespace(logits=logits)

    class Constant(torch.nn.Module):
        def forward(self, input_ids, use_cache=False):
            logits = torch.zeros(*input_ids.shape, VOCAB)
            logits[..., 7] = 1.0
            return types.SimpleNamespace(logits=logits)


@unittest.skipIf(torch is None, "torch not installed")
class TorchPathsTest(unittest.TestCase):
    def setUp(self):
        rng = random.Random(3)
        self.stream = [1000 + rng.randrange(1000) for _ in range(20_000)]
        self.heldout = [1000 + rng.randrange(1000) for _ in range(3_000)]
        self.encode = word_encode()
        self.words = [f"word{i}" for i in range(60)]
        self.trials = recall_data.recall_trials(self.heldout, self.encode, self.words[:20], 200,
                                                [60, 150], 3, 8, 5)
        self.device = torch.device("cpu")

    def test_recall_measures_against_an_oracle_and_a_constant(self):
        for fn in (lambda m: train.teacher_forced_recall(m, self.trials, self.device, 4),
                   lambda m: train.greedy_recall(m, self.trials, self.device, 4)[0]):
            self.assertEqual(fn(InductionOracle()), 1.0)
            self.assertEqual(fn(Constant()), 0.0)
        accuracy, by_depth, rows = train.greedy_recall(InductionOracle(), self.trials,
                                                       self.device, 4)
        self.assertEqual(by_depth, {"60": 1.0, "150": 1.0})
        self.assertEqual(len(rows), 6)
        self.assertEqual(rows[0]["produced"], rows[0]["expected"])

    def test_copy_probe_against_an_oracle_and_a_constant(self):
        # Drawn ids disjoint from the filler's (1000-1999): the oracle finds only the span.
        probes = recall_data.copy_trials(self.heldout, list(range(2000, 2100)), 200, [40, 120],
                                         3, 16, 9)
        counts = {}
        self.assertEqual(train.teacher_forced_recall(InductionOracle(), probes, self.device, 4,
                                                     by_depth=counts), 1.0)
        self.assertEqual(counts, {40: [45, 45], 120: [45, 45]})
        self.assertEqual(train.teacher_forced_recall(Constant(), probes, self.device, 4), 0.0)

    def test_score_text_windows(self):
        ppl, count, nll = train.score_text(Constant(), self.heldout[:100], 32, self.device, 2)
        self.assertEqual(count, 3 * 31 + 3)  # windows 32, 32, 32, 4
        self.assertAlmostEqual(math.log(ppl), nll)

    def test_training_mixes_recall_rows_and_selects(self):
        args = train.parse_args(["--data", "d", "--out", "o", "--context", "128",
                                 "--recall-context", "96", "--recall-depths", "30,50",
                                 "--batch-size", "8", "--max-steps", "12", "--eval-every", "5",
                                 "--log-every", "5", "--warmup", "2", "--val-tokens", "600",
                                 "--recall-fraction", "0.5", "--no-autocast"])
        source = recall_data.RecallSequences(self.stream, self.encode, self.words[20:],
                                             args.context, 11)
        monitor = recall_data.recall_trials(self.heldout, self.encode, self.words[:20],
                                            args.recall_context, args.recall_depth_list, 2, 4, 6)
        torch.manual_seed(0)
        model = TinyLM()
        summary, rows = train.train(args, model, self.stream, self.heldout, self.device, 1000.0,
                                    time.time() + 120, "t", source, monitor)
        self.assertEqual(summary["steps"], 12)
        self.assertEqual(summary["recall_rows_per_step"], 4)
        self.assertEqual(sum(summary["recall_sequences"].values()), 48)
        self.assertIn(summary["best_step"], (5, 10, 12))
        self.assertEqual(summary["selection_key"][0], 0)  # the tiny model recalls nothing
        best_val = min(r[5] for r in rows if r[5] is not None)
        self.assertAlmostEqual(summary["best_val_loss"], best_val, places=4)  # ties: by loss
        evaluated = [r for r in rows if r[5] is not None]
        self.assertEqual([r[1] for r in evaluated], [5, 10, 12])
        self.assertTrue(all(0.0 <= r[7] <= 1.0 for r in evaluated))
        self.assertTrue(all(math.isfinite(r[4]) for r in rows if r[4] is not None))
        # A curriculum with random-token rows: the share falls from 6 rows to 2, all kinds come.
        args.recall_fraction_start, args.recall_fraction, args.curriculum = 0.75, 0.25, 0.5
        args.recall_max_depth, args.curriculum_start_depth = 90, 40
        args.recall_kind_weights = {"list": 1.0, "passage": 1.0, "random": 2.0}
        source = recall_data.RecallSequences(self.stream, self.encode, self.words[20:],
                                             args.context, 12, max_depth=90,
                                             weights=args.recall_kind_weights,
                                             random_ids=list(range(1000, 2000)))
        probes = recall_data.copy_trials(self.heldout, list(range(1000, 2000)), 96, [20, 60],
                                         2, 8, 9)
        summary, rows = train.train(args, TinyLM(), self.stream, self.heldout, self.device,
                                    1000.0, time.time() + 120, "curriculum", source, monitor,
                                    probes)
        logged = [json.loads(r[8]) for r in rows if r[8]]
        self.assertEqual(len(logged), 3)
        self.assertTrue(all(set(m) == {"greedy", "copy20", "copy60"} for m in logged), logged)
        self.assertTrue(all(0.0 <= m["greedy"] <= 1.0 for m in logged), logged)
        self.assertEqual(summary["recall_rows_per_step"], 6)
        self.assertEqual(summary["recall_rows_last_step"], 2)
        # Steps 0-5 move from 6 rows towards 2 (rounded): 6+5+5+4+3+3, then 2 per step: 6*2.
        self.assertEqual(sum(summary["recall_sequences"].values()), 38)
        self.assertGreater(summary["recall_sequences"]["random"], 0)
        self.assertEqual(source.max_depth, 90)  # the distance reached its end
        # A copy warm-up of 3 steps of tiled rows comes before the 12 steps of the schedule.
        args.copy_warmup_steps, args.copy_warmup_alphabet = 3, 16
        source.rng.seed(12)
        summary, rows = train.train(args, TinyLM(), self.stream, self.heldout, self.device,
                                    1000.0, time.time() + 120, "warm", source, monitor, probes,
                                    copy_pool=list(range(1000, 2000)))
        self.assertEqual(summary["steps"], 15)
        self.assertEqual(summary["recall_sequences"]["tiled"], 3 * 8)
        self.assertEqual(sum(v for k, v in summary["recall_sequences"].items()
                             if k != "tiled"), 38)  # the schedule after the warm-up as above
        self.assertGreater(summary["best_step"], 3)
        # --copy-rows keeps 2 tiled rows in each of the schedule's 12 batches, besides the
        # recall rows; the plain crops give way to them.
        args.copy_rows = 2
        source.rng.seed(12)
        summary, rows = train.train(args, TinyLM(), self.stream, self.heldout, self.device,
                                    1000.0, time.time() + 120, "warm", source, monitor, probes,
                                    copy_pool=list(range(1000, 2000)))
        self.assertEqual(summary["steps"], 15)
        self.assertEqual(summary["recall_sequences"]["tiled"], 3 * 8 + 12 * 2)
        self.assertEqual(sum(v for k, v in summary["recall_sequences"].items()
                             if k != "tiled"), 38)
        args.copy_rows = 0
        with self.assertRaises(ValueError):
            train.train(args, TinyLM(), self.stream, self.heldout, self.device, 1000.0,
                        time.time() + 120, "warm", source, monitor, probes)
        args.copy_warmup_steps = 0
        # Without recall rows or a monitor the loop is the plain one, chosen by loss.
        args.recall_fraction = 0.0
        summary, _ = train.train(args, TinyLM(), self.stream, self.heldout, self.device, 1000.0,
                                 time.time() + 120, "plain", None, None)
        self.assertEqual(summary["recall_rows_per_step"], 0)
        self.assertEqual(summary["selection_key"][0], 1)


@unittest.skipIf(torch is None, "torch is not importable")
class SelfSampledInputsTest(unittest.TestCase):
    def setUp(self):
        # Two rows of 12: copies at targets 3-7 and 9-10 (row 0), 0-4 (row 1).
        self.mask = torch.zeros(2, 12, dtype=torch.bool)
        self.mask[0, 3:8] = True
        self.mask[0, 9:11] = True
        self.mask[1, 0:5] = True
        self.read = torch.arange(24).reshape(2, 12)
        self.guess = 100 + torch.arange(24).reshape(2, 12)  # every guess wrong and recognisable

    def test_every_inner_copy_token_read_as_the_guess_before_it(self):
        g = torch.Generator().manual_seed(1)
        out = train.self_sampled_inputs(self.read, self.guess, self.mask, 1.0, g)
        for r in range(2):
            for k in range(12):
                inner = k > 0 and bool(self.mask[r, k - 1]) and bool(self.mask[r, k])
                want = int(self.guess[r, k - 1]) if inner else int(self.read[r, k])
                self.assertEqual(int(out[r, k]), want, (r, k))
        # row 0: positions 4-7 and 10; row 1: 1-4 (a copy's first token and the text never change)
        changed = (out != self.read).nonzero().tolist()
        self.assertEqual(changed, [[0, 4], [0, 5], [0, 6], [0, 7], [0, 10],
                                   [1, 1], [1, 2], [1, 3], [1, 4]])
        self.assertTrue(torch.equal(self.read, torch.arange(24).reshape(2, 12)))  # not in place

    def test_share_zero_and_right_guesses_change_nothing(self):
        g = torch.Generator().manual_seed(2)
        self.assertTrue(torch.equal(train.self_sampled_inputs(self.read, self.guess, self.mask, 0.0, g),
                                    self.read))
        right = torch.cat([self.read[:, 1:], self.read[:, -1:]], dim=1)  # guesses of the next token
        self.assertTrue(torch.equal(train.self_sampled_inputs(self.read, right, self.mask, 1.0, g),
                                    self.read))

    def test_share_is_a_rate(self):
        g = torch.Generator().manual_seed(3)
        mask = torch.ones(64, 200, dtype=torch.bool)
        read = torch.zeros(64, 200, dtype=torch.long)
        out = train.self_sampled_inputs(read, torch.ones_like(read), mask, 0.3, g)
        rate = out[:, 1:].float().mean().item()
        self.assertTrue(0.27 < rate < 0.33, rate)
        self.assertEqual(int(out[:, 0].sum()), 0)

    def test_training_with_gap_rows_reads_its_own_guesses(self):
        rng = random.Random(4)
        stream = [1000 + rng.randrange(1000) for _ in range(20_000)]
        heldout = [1000 + rng.randrange(1000) for _ in range(3_000)]
        words = [[10 + 2 * i, 11 + 2 * i] for i in range(40)]
        args = train.parse_args(["--data", "d", "--out", "o", "--context", "128",
                                 "--batch-size", "4", "--max-steps", "4", "--eval-every", "2",
                                 "--log-every", "2", "--warmup", "1", "--val-tokens", "600",
                                 "--recall-fraction", "0", "--no-autocast",
                                 "--recall-context", "96", "--recall-depths", "30,50", "--gap-self-share", "0.5"])
        seen = []

        class Recording(TinyLM):
            def forward(self, input_ids, use_cache=False):
                seen.append((torch.is_grad_enabled(), input_ids.shape))
                return super().forward(input_ids, use_cache)

        gap_rows = gap_copy.GapRows(stream, [0, 16], 128, 3, 0.5, list(range(1000, 2000)), words,
                                    [900, 901], [902], 0.5, 5)
        torch.manual_seed(0)
        summary, _ = train.train(args, Recording(), stream, heldout, torch.device("cpu"), 1000.0,
                                 time.time() + 120, "self", None, None, gap_rows=gap_rows)
        self.assertEqual(summary["steps"], 4)
        # Each step: the text rows (with grad), the gap rows without grad (the guesses), then the
        # gap rows with grad, in that order.
        trained = [(grad, shape) for grad, shape in seen if grad]
        guessed = [shape for grad, shape in seen if not grad and shape[0] == 3]
        self.assertGreaterEqual(len(guessed), 4)
        self.assertEqual(sum(1 for _, shape in trained if shape[0] == 3), 4)
        with self.assertRaises(SystemExit):
            train.parse_args(["--data", "d", "--out", "o", "--gap-self-share", "1.5"])


@unittest.skipIf(torch is None, "torch is not importable")
class InitFromTest(unittest.TestCase):
    def test_init_weights_are_loaded_exactly_and_mismatches_refused(self):
        torch.manual_seed(1)
        source = TinyLM()
        state = {k: v.to(torch.bfloat16) for k, v in source.state_dict().items()}
        torch.manual_seed(2)
        target = TinyLM()
        train.apply_init_weights(target, state)
        for name, tensor in target.state_dict().items():
            self.assertEqual(tensor.dtype, torch.float32, name)  # float32 master weights
            self.assertTrue(torch.equal(tensor, state[name].float()), name)
        # The continued model computes what the checkpoint computes.
        x = torch.randint(0, VOCAB, (2, 16))
        bf16_source = TinyLM()
        bf16_source.load_state_dict({k: v.float() for k, v in state.items()})
        self.assertTrue(torch.equal(target(x).logits, bf16_source(x).logits))
        before = {k: v.clone() for k, v in target.state_dict().items()}
        missing = dict(state)
        missing.pop("head.bias")
        extra = dict(state, **{"other.weight": torch.zeros(1)})
        wrong = dict(state, **{"head.bias": torch.zeros(VOCAB + 1)})
        for bad in (missing, extra, wrong):
            with self.assertRaises(ValueError):
                train.apply_init_weights(target, bad)
            for name, tensor in target.state_dict().items():  # never half-loaded
                self.assertTrue(torch.equal(tensor, before[name]), name)


if __name__ == "__main__":
    unittest.main()
