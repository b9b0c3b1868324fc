#!/usr/bin/env python3
"""Checks the training tools' pure logic without torch, transformers or tokenizers.

Run: python3 tools/train/selftest.py   (jinja2, when installed, also checks the chat template
renders exactly like the Python twin the training data is built with).
"""

import json
import math
import os
import random
import sys
import tempfile
import types
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import chat_samples  # noqa: E402
import extract_text  # noqa: E402
import gap_copy  # noqa: E402
import recall_data  # noqa: E402
import rope_base_bound  # noqa: E402
import short_copy  # noqa: E402
import train  # noqa: E402

TINY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "models", "pagoda-tiny")


class MiniBpe:
    """Byte-level BPE encode/decode of a tokenizer.json, enough to check the recall data with the
    bundled model's real tokenizer (needs the `regex` module for the split pattern)."""

    def __init__(self, path):
        import regex
        with open(path, encoding="utf-8") as f:
            model = json.load(f)["model"]
        self.vocab = model["vocab"]
        self.inverse = {i: t for t, i in self.vocab.items()}
        self.ranks = {tuple(m if isinstance(m, list) else m.split(" ")): r
                      for r, m in enumerate(model["merges"])}
        chars = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
        mapped, extra = list(chars), 0
        for b in range(256):
            if b not in chars:
                chars.append(b)
                mapped.append(256 + extra)
                extra += 1
        self.byte_char = {b: chr(c) for b, c in zip(chars, mapped)}
        self.char_byte = {v: k for k, v in self.byte_char.items()}
        self.split = regex.compile(train.SPLIT_PATTERN)
        self.cache = {}

    def _piece(self, piece):
        if piece in self.cache:
            return self.cache[piece]
        parts = [self.byte_char[b] for b in piece.encode("utf-8")]
        while len(parts) > 1:
            pairs = [(self.ranks.get((a, b), 1 << 30), i) for i, (a, b) in
                     enumerate(zip(parts, parts[1:]))]
            rank, i = min(pairs)
            if rank == 1 << 30:
                break
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        ids = [self.vocab[p] for p in parts]
        self.cache[piece] = ids
        return ids

    def encode(self, text):
        return [t for piece in self.split.findall(text) for t in self._piece(piece)]

    def decode(self, ids):
        return bytes(self.char_byte[c] for i in ids for c in self.inverse[i]).decode(
            "utf-8", errors="replace")


def fake_encode(text):
    """A stand-in tokenizer: one id per character (ids 10..), so lengths are easy to reason about."""
    return [10 + ord(c) % 500 for c in text]


class RenderChatTest(unittest.TestCase):
    def test_format(self):
        messages = [{"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "Hello"}]
        self.assertEqual(train.render_chat(messages, add_generation_prompt=True),
                         "<|bos|><|system|>\nBe brief.<|eos|>\n<|user|>\nHello<|eos|>\n"
                         "<|assistant|>\n")
        self.assertFalse(train.render_chat(messages).endswith("<|assistant|>\n"))

    def test_roles_are_special_tokens(self):
        for role in ("system", "user", "assistant"):
            self.assertIn(f"<|{role}|>", train.SPECIAL_TOKENS)

    def test_jinja_template_matches_python_twin(self):
        try:
            import jinja2
        except ImportError:
            self.skipTest("jinja2 not installed")
        # transformers renders chat templates with these settings.
        env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
        template = env.from_string(train.CHAT_TEMPLATE)
        conversations = [
            [{"role": "user", "content": "Hi"}],
            [{"role": "system", "content": "S"}, {"role": "user", "content": "a\nb"},
             {"role": "assistant", "content": "c"}],
        ]
        for messages in conversations:
            for generation in (False, True):
                rendered = template.render(messages=messages, bos_token=train.BOS,
                                           add_generation_prompt=generation)
                self.assertEqual(rendered, train.render_chat(messages, generation))


class WindowsTest(unittest.TestCase):
    def test_windows_cover_text_without_overlap(self):
        ids = list(range(10))
        self.assertEqual(train.make_windows(ids, 4), [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]])

    def test_one_token_tail_is_dropped(self):
        self.assertEqual(train.make_windows(list(range(9)), 4), [[0, 1, 2, 3], [4, 5, 6, 7]])

    def test_bad_window_is_rejected(self):
        with self.assertRaises(ValueError):
            train.make_windows([1, 2, 3], 1)


class LearningRateTest(unittest.TestCase):
    def test_warmup_peak_and_floor(self):
        lr = [train.learning_rate(s, 1000, 1e-3, 100, 0.1) for s in range(1001)]
        self.assertAlmostEqual(lr[0], 1e-5)
        self.assertAlmostEqual(lr[99], 1e-3)
        self.assertTrue(all(a <= b for a, b in zip(lr[:100], lr[1:100])))
        self.assertTrue(all(a >= b for a, b in zip(lr[100:], lr[101:])))
        self.assertAlmostEqual(lr[1000], 1e-4)
        self.assertAlmostEqual(lr[550], 1e-4 + 0.9e-3 * 0.5, places=8)

    def test_past_the_end_stays_at_floor(self):
        self.assertAlmostEqual(train.learning_rate(5000, 1000, 1.0, 10, 0.2), 0.2)


class ArgsTest(unittest.TestCase):
    def test_defaults_fit_the_brief(self):
        args = train.parse_args(["--data", "d", "--out", "o"])
        head_dim = args.head_dim
        self.assertEqual(head_dim, args.hidden // args.heads)
        params = (2 * args.vocab_size * args.hidden + args.layers * (
            2 * args.hidden * args.hidden + 2 * args.hidden * args.kv_heads * head_dim
            + 3 * args.hidden * args.intermediate + 2 * args.hidden) + args.hidden)
        self.assertTrue(5e6 <= params <= 10e6, params)
        self.assertLess(params * 2, 24 * 2**20)  # bf16 export under 24 MB
        self.assertEqual(args.context, 2048)
        self.assertGreater(args.recall_fraction, 0)
        self.assertLessEqual(args.recall_context + 32, args.context)
        self.assertGreaterEqual(min(args.recall_depth_list), 1000)
        self.assertLess(args.kv_heads, args.heads)  # GQA

    def test_head_dim_defaults_to_hidden_over_heads_and_may_be_set(self):
        args = train.parse_args(["--data", "d", "--out", "o", "--heads", "4", "--kv-heads", "4"])
        self.assertEqual(args.head_dim, 64)
        args = train.parse_args(["--data", "d", "--out", "o", "--heads", "8", "--kv-heads", "4",
                                 "--head-dim", "64"])
        self.assertEqual((args.heads, args.head_dim), (8, 64))  # q_proj 256 -> 512
        args = train.parse_args(["--data", "d", "--out", "o", "--heads", "6", "--kv-heads", "2",
                                 "--head-dim", "64"])  # 256 / 6 does not divide: fine with a head_dim
        self.assertEqual(args.head_dim, 64)
        for bad in (["--head-dim", "63"], ["--head-dim", "-2"], ["--heads", "6", "--kv-heads", "2"]):
            with self.assertRaises(SystemExit):
                train.parse_args(["--data", "d", "--out", "o"] + bad)

    def test_final_recall_trials_and_eval_seed(self):
        args = train.parse_args(["--data", "d", "--out", "o", "--seed", "5"])
        self.assertEqual((args.final_recall_trials, args.eval_seed), (0, 1234))  # lists apart from --seed
        args = train.parse_args(["--data", "d", "--out", "o", "--final-recall-trials", "48"])
        self.assertEqual(args.final_recall_trials, 48)
        with self.assertRaises(SystemExit):
            train.parse_args(["--data", "d", "--out", "o", "--final-recall-trials", "-1"])

    def test_list_accuracy_standard_error(self):
        def rows(*hits):
            return [{"hits": h, "expected": [0] * 4} for h in hits]
        self.assertEqual(train.list_accuracy_standard_error(rows(4)), 0.0)
        self.assertEqual(train.list_accuracy_standard_error(rows(2, 2, 2)), 0.0)
        # Lists at 1.0 and 0.0: per-list sd sqrt(0.5) ... over 2 lists, s.e. 0.5.
        self.assertAlmostEqual(train.list_accuracy_standard_error(rows(4, 0)), 0.5)
        # Four lists at 1, 1, 0, 0: sample sd sqrt(1/3), s.e. sqrt(1/12).
        self.assertAlmostEqual(train.list_accuracy_standard_error(rows(4, 4, 0, 0)), (1 / 12) ** 0.5)

    def test_smoke_settings_are_consistent(self):
        args = train.parse_args(["--data", "d", "--out", "o", "--smoke"])
        self.assertLess(max(args.recall_depth_list), args.recall_context)

    def test_init_from_needs_a_whole_checkpoint(self):
        args = train.parse_args(["--data", "d", "--out", "o", "--init-from", TINY,
                                 "--rope-theta", "40000"])
        self.assertEqual((args.init_from, args.rope_theta), (TINY, 40000.0))
        with tempfile.TemporaryDirectory() as empty:
            for flags in (["--init-from", empty], ["--rope-theta", "-1"]):
                with self.assertRaises(SystemExit, msg=flags):
                    train.parse_args(["--data", "d", "--out", "o"] + flags)

    def test_init_from_keeps_the_tokenizer_verbatim(self):
        with tempfile.TemporaryDirectory() as out:
            config = train.init_tokenizer_files(TINY, out, 2048)
            for name in ("tokenizer.json",):
                with open(os.path.join(TINY, name), "rb") as a, \
                        open(os.path.join(out, name), "rb") as b:
                    self.assertEqual(a.read(), b.read())
            with open(os.path.join(TINY, "tokenizer_config.json")) as f:
                source = json.load(f)
            with open(os.path.join(out, "tokenizer_config.json")) as f:
                written = json.load(f)
            self.assertEqual(written, config)
            self.assertEqual(written["model_max_length"], 2048)
            self.assertEqual({k: v for k, v in written.items() if k != "model_max_length"},
                             {k: v for k, v in source.items() if k != "model_max_length"})

    def test_rope_theta_in_both_spellings(self):
        v5 = types.SimpleNamespace(rope_parameters={"rope_type": "default", "rope_theta": 1e4})
        train.set_rope_theta(v5, 4e4)
        self.assertEqual(v5.rope_parameters, {"rope_type": "default", "rope_theta": 4e4})
        v4 = types.SimpleNamespace(rope_theta=1e4)
        train.set_rope_theta(v4, 4e4)
        self.assertEqual(v4.rope_theta, 4e4)

    def test_bad_recall_flags_are_rejected(self):
        for flags in (["--recall-fraction", "1.5"], ["--recall-depths", "1000,x"],
                      ["--recall-context", "2040"], ["--recall-depths", "2000"]):
            with self.assertRaises(SystemExit, msg=flags):
                train.parse_args(["--data", "d", "--out", "o"] + flags)

    def test_bad_curriculum_flags_are_rejected(self):
        for flags in (["--recall-kinds", "list=1,echo=2"], ["--recall-kinds", "list=-1"],
                      ["--recall-kinds", "list=0"], ["--recall-kinds", "list=x"],
                      ["--curriculum", "1.5"], ["--recall-fraction-start", "-0.1"],
                      ["--curriculum-start-depth", "3"]):
            with self.assertRaises(SystemExit, msg=flags):
                train.parse_args(["--data", "d", "--out", "o"] + flags)
        args = train.parse_args(["--data", "d", "--out", "o", "--recall-kinds",
                                 "list=1,random=2.5"])
        self.assertEqual(args.recall_kind_weights, {"list": 1.0, "random": 2.5})

    def test_recall_schedule_moves_share_and_distance(self):
        args = train.parse_args(["--data", "d", "--out", "o", "--batch-size", "16",
                                 "--recall-fraction", "0.25", "--recall-fraction-start", "0.75",
                                 "--curriculum", "0.5", "--curriculum-start-depth", "200"])
        self.assertEqual(train.recall_schedule(args, 0, 1000, 1800, True), (12, 200))
        self.assertEqual(train.recall_schedule(args, 250, 1000, 1800, True), (8, 1000))
        self.assertEqual(train.recall_schedule(args, 500, 1000, 1800, True), (4, 1800))
        self.assertEqual(train.recall_schedule(args, 900, 1000, 1800, True), (4, 1800))
        self.assertEqual(train.recall_schedule(args, 0, 1000, 1800, False)[0], 0)
        plain = train.parse_args(["--data", "d", "--out", "o", "--batch-size", "16"])
        self.assertEqual(plain.curriculum, 0.0)  # without a curriculum: constant, as before
        for step in (0, 500):
            self.assertEqual(train.recall_schedule(plain, step, 1000, 1800, True), (6, 1800))

    def test_restarted_schedule_after_the_copy_warmup(self):
        base = ["--data", "d", "--out", "o", "--copy-warmup-steps", "1000", "--warmup", "100",
                "--lr", "2e-3", "--min-lr-ratio", "0.1"]
        # One schedule (the default): warm-up and cosine over warm-up and schedule together.
        args = train.parse_args(base)
        self.assertAlmostEqual(train.step_learning_rate(args, 1000, 2000),
                               train.learning_rate(1000, 2000, 2e-3, 100, 0.1))
        # Restarted: the warm-up holds its own peak, the schedule starts over after it.
        args = train.parse_args(base + ["--restart-schedule", "--copy-warmup-lr", "3e-3"])
        self.assertAlmostEqual(train.step_learning_rate(args, 0, 2000), 3e-5)
        self.assertAlmostEqual(train.step_learning_rate(args, 999, 2000), 3e-3)
        self.assertAlmostEqual(train.step_learning_rate(args, 1000, 2000), 2e-5)
        self.assertAlmostEqual(train.step_learning_rate(args, 1099, 2000), 2e-3)
        self.assertAlmostEqual(train.step_learning_rate(args, 2000, 2000), 2e-4)
        args.copy_warmup_lr = 0.0  # 0: the warm-up uses --lr
        self.assertAlmostEqual(train.step_learning_rate(args, 500, 2000), 2e-3)
        args.copy_warmup_steps = 0  # no warm-up: the one schedule
        self.assertAlmostEqual(train.step_learning_rate(args, 500, 2000),
                               train.learning_rate(500, 2000, 2e-3, 100, 0.1))

    def test_copy_warmup_alphabet_and_period_grow(self):
        args = train.parse_args(["--data", "d", "--out", "o", "--copy-warmup-steps", "100",
                                 "--copy-warmup-alphabet", "128"])
        pool = list(range(4000))
        first, high = train.copy_warmup_stage(args, 0, pool, 2048)
        self.assertEqual((first, high), (pool[:128], 32))
        half, high = train.copy_warmup_stage(args, 50, pool, 2048)
        self.assertEqual((len(half), high), (2064, 528))
        last, high = train.copy_warmup_stage(args, 100, pool, 2048)
        self.assertEqual((last, high), (pool, 1024))
        args.copy_warmup_alphabet = 0  # the default: every token from the start
        self.assertEqual(train.copy_warmup_stage(args, 0, pool, 2048), (pool, 32))
        for flags in (["--copy-warmup-steps", "-1"], ["--copy-warmup-alphabet", "1"],
                      ["--copy-warmup-alphabet", "-5"], ["--copy-warmup-lr", "-1"],
                      ["--copy-rows", "16"], ["--copy-rows", "-1"]):
            with self.assertRaises(SystemExit, msg=flags):
                train.parse_args(["--data", "d", "--out", "o"] + flags)

    def test_bad_epochs_are_rejected(self):
        with self.assertRaises(SystemExit):
            train.parse_args(["--data", "d", "--out", "o", "--epochs", "4,-1"])


class ShortCopyTest(unittest.TestCase):
    def test_rows_are_tiled_and_the_mask_marks_the_copies(self):
        rng = random.Random(3)
        for length in (32, 128, 512, 2048):
            low, high = short_copy.period_range(length)
            self.assertEqual(low, 8)
            self.assertEqual(high, min(48 * length // 128, length // 2))
            for _ in range(20):
                ids, period = short_copy.tiled(rng, length, list(range(100, 4000)))
                self.assertEqual(len(ids), length + 1)
                self.assertTrue(low <= period <= high)
                mask = short_copy.copy_mask([period], length)[0]
                # target k is token k + 1: copyable exactly when it repeats the token a period back
                for k in range(length):
                    if mask[k]:
                        self.assertEqual(ids[k + 1], ids[k + 1 - period])
                self.assertEqual(mask.count(False), period - 1)

    def test_curriculum_advances_on_the_bar_and_keeps_tokens(self):
        cur = short_copy.Curriculum([128, 256, 2048], 256, 0.5, list(range(4000)), 0, 1)
        self.assertEqual((cur.length, cur.rows()), (128, 256))
        ids, mask = cur.batch()
        self.assertEqual((len(ids), len(ids[0]), len(mask[0])), (256, 129, 128))
        self.assertFalse(cur.observe(0.1, 10))
        self.assertFalse(cur.observe(0.9, 20))  # smoothed 0.34: not yet
        self.assertTrue(cur.observe(0.9, 30))   # smoothed 0.508
        self.assertEqual((cur.length, cur.rows()), (256, 128))
        self.assertFalse(cur.observe(0.4, 40))  # smoothing restarts at the new length
        self.assertTrue(cur.observe(0.9, 50))   # smoothed 0.55
        self.assertEqual((cur.length, cur.rows()), (2048, 16))
        self.assertFalse(cur.observe(1.0, 60))  # the last length stays
        self.assertEqual([h["from"] for h in cur.history], [128, 256])
        small = short_copy.Curriculum([128, 256], 4, 0.5, list(range(4000)), 64, 1)
        self.assertTrue(all(t < 64 for row in small.batch()[0] for t in row))

    def test_bad_short_copy_flags_are_rejected(self):
        for flags in (["--short-copy-rows", "-1"], ["--short-copy-lengths", "256,128"],
                      ["--short-copy-lengths", "16"], ["--short-copy-lengths", "a"],
                      ["--short-copy-rows", "8", "--short-copy-lengths", "128,4096"],
                      ["--short-copy-advance", "0"], ["--short-copy-alphabet", "1"],
                      ["--init-tokenizer-only"]):
            with self.assertRaises(SystemExit, msg=flags):
                train.parse_args(["--data", "d", "--out", "o"] + flags)
        args = train.parse_args(["--data", "d", "--out", "o", "--short-copy-rows", "256"])
        self.assertEqual(args.short_copy_length_list, [128, 256, 512, 2048])


class GapCopyTest(unittest.TestCase):
    INTRO, TERM = [900, 901, 902, 903, 904], [905]

    def make(self, gaps=(0, 16, 64, 256, 1024, 1750), rows=8, list_share=0.5, seed=1, below=0.0,
             corrupt=0.0, corrupt_from="pool", distractors=0):
        rng = random.Random(seed)
        stream = [rng.randrange(10, 800) for _ in range(20000)]  # "text": ids below 800
        words = [[1000 + 3 * i, 1001 + 3 * i][: 1 + i % 2] for i in range(200)]
        return gap_copy.GapRows(stream, list(gaps), 2048, rows, 0.5, list(range(2000, 4000)),
                                words, self.INTRO, self.TERM, list_share, seed, below, corrupt,
                                corrupt_from, distractors)

    def test_corrupt_share_changes_only_inner_copy_tokens_as_read(self):
        clean, noisy = self.make(), self.make(corrupt=0.3)
        for rows in (clean, noisy):
            rows.stage = 5
        ids_c, mask_c, read_c = clean.batch()
        ids_n, mask_n, read_n = noisy.batch()
        # the rows themselves (targets and masks) are drawn exactly as without corruption
        self.assertEqual((ids_c, mask_c), (ids_n, mask_n))
        self.assertEqual(read_c, [ids[:-1] for ids in ids_c])
        changed = inner = 0
        for ids, mask, read in zip(ids_n, mask_n, read_n):
            self.assertEqual(len(read), len(mask))
            for k, token in enumerate(read):
                eligible = k > 0 and mask[k - 1] and mask[k]
                inner += eligible
                if token != ids[k]:
                    changed += 1
                    self.assertTrue(eligible, k)  # never the text, a copy's first or last token
                    self.assertTrue(2000 <= token < 4000)  # a pool token
        self.assertTrue(0.2 * inner < changed < 0.4 * inner, (changed, inner))
        with self.assertRaises(ValueError):
            self.make(corrupt=1.0)

    def test_corrupt_from_words_reads_other_words_tokens(self):
        rows = self.make(corrupt=0.5, corrupt_from="words")
        rows.stage = 5
        word_tokens = {t for w in rows.words for t in w}
        changed = 0
        for ids, mask, read in zip(*rows.batch()):
            for k, token in enumerate(read):
                if token != ids[k]:
                    changed += 1
                    self.assertIn(token, word_tokens)
        self.assertGreater(changed, 0)
        with self.assertRaises(ValueError):
            self.make(corrupt=0.2, corrupt_from="text")

    def check_rows(self, rows, stage_range, list_expected):
        kinds = set()
        for _ in range(30):
            ids, mask, pairs = rows.make_row()
            self.assertEqual((len(ids), len(mask)), (rows.length + 1, rows.length))
            self.assertTrue(pairs)
            expected = [False] * rows.length
            for pair in pairs:
                kinds.add(pair["kind"])
                s, t, n = pair["source"], pair["target"], pair["span"]
                self.assertEqual(ids[s:s + n], ids[t:t + n])
                self.assertGreaterEqual(s, gap_copy.HEAD_ROOM)
                seg = ids[t:t + n]
                if pair["kind"] == "random":
                    self.assertTrue(all(2000 <= x < 4000 for x in seg))
                    first = 1  # the copy's first token has no cue
                    self.assertEqual(t - (s + n), pair["gap"])
                else:
                    self.assertEqual(seg[:5], self.INTRO)
                    self.assertEqual(seg[-1:], self.TERM)
                    first = len(self.INTRO)  # the words and TERMINATOR after the cue
                    # the recall depth: end of the first TERMINATOR to the end of the cue
                    self.assertEqual(t + len(self.INTRO) - (s + n), pair["gap"])
                low, high = stage_range
                self.assertTrue(low <= pair["gap"] <= max(high, len(self.INTRO)), pair)
                for offset in range(first, n):
                    expected[t + offset - 1] = True
            # the mask marks exactly the copyable targets, and each is the source's token
            self.assertEqual(mask, expected)
            for k, on in enumerate(mask):
                if on:
                    pair = next(p for p in pairs if p["target"] <= k + 1 < p["target"] + p["span"])
                    self.assertEqual(ids[k + 1], ids[k + 1 - pair["target"] + pair["source"]])
            # outside the pairs the row is the text crop
            inside = {i for p in pairs for r in (p["source"], p["target"])
                      for i in range(r, r + p["span"])}
            self.assertTrue(all(ids[i] < 800 for i in range(len(ids)) if i not in inside))
        self.assertEqual("list" in kinds, list_expected)
        self.assertIn("random", kinds)

    def test_below_share_draws_gaps_under_the_band_too(self):
        rows = self.make(below=0.5)
        rows.stage = 5  # band 1,024-1,750
        self.check_rows(rows, (0, 1750), True)
        gaps = [p["gap"] for _ in range(60) for p in rows.make_row()[2]]
        under = sum(g < 1024 for g in gaps)
        self.assertTrue(0 < under < len(gaps), (under, len(gaps)))
        self.assertTrue(any(g < 256 for g in gaps))
        banded = self.make()
        banded.stage = 5
        self.assertTrue(all(p["gap"] >= 1024 for _ in range(30) for p in banded.make_row()[2]))
        with self.assertRaises(ValueError):
            self.make(below=1.5)

    def test_rows_mask_and_gaps_at_every_stage(self):
        rows = self.make()
        self.assertEqual(rows.lengths, [128, 128, 256, 512, 2048, 2048])
        for stage in range(len(rows.gaps)):
            rows.stage = stage
            self.check_rows(rows, rows.gap_range(), stage > 0)
        self.assertEqual(rows.list_fraction(), 0.5)
        rows.stage = 0
        self.assertEqual(rows.list_fraction(), 0.0)
        only_random = self.make(list_share=0.0)
        only_random.stage = 5
        self.check_rows(only_random, only_random.gap_range(), False)

    def test_curriculum_advances_on_the_bar_and_keeps_tokens(self):
        rows = self.make(rows=64)
        self.assertEqual((rows.gap, rows.length, rows.rows()), (0, 128, 64))
        ids, mask, _ = rows.batch()
        self.assertEqual((len(ids), len(ids[0]), len(mask[0])), (64, 129, 128))
        self.assertFalse(rows.observe(0.1, 10))
        self.assertFalse(rows.observe(0.9, 20))  # smoothed 0.34: not yet
        self.assertTrue(rows.observe(0.9, 30))   # smoothed 0.508
        self.assertEqual((rows.gap, rows.length, rows.rows()), (16, 128, 64))
        self.assertFalse(rows.observe(0.4, 40))  # smoothing restarts at the new gap
        for step, gap, rows_now in ((50, 64, 32), (60, 256, 16), (70, 1024, 4), (80, 1750, 4)):
            self.assertTrue(rows.observe(0.9, step) or rows.observe(0.9, step + 1))
            self.assertEqual((rows.gap, rows.rows()), (gap, rows_now))
        self.assertFalse(rows.observe(1.0, 90))  # the last gap stays
        self.assertFalse(rows.observe(1.0, 100))
        self.assertEqual([h["from_gap"] for h in rows.history], [0, 16, 64, 256, 1024])
        again = self.make(rows=64)  # seeded: the same rows
        self.assertEqual(again.batch(), self.make(rows=64).batch())

    def test_cues_mark_each_list_copys_first_recalled_token(self):
        rows = self.make(list_share=1.0)
        rows.stage = 5
        ids, mask, read, cues = rows.batch_with_cues()
        self.assertTrue(any(cues))
        for row_ids, row_mask, row_cues in zip(ids, mask, cues):
            for k in row_cues:
                self.assertTrue(row_mask[k])
                self.assertEqual(row_ids[k - len(self.INTRO) + 1:k + 1], self.INTRO)  # read at the cue
                self.assertGreaterEqual(row_ids[k + 1], 1000)  # the target: a word's first token
                self.assertFalse(row_mask[k - 1])  # nothing before it in the copy is a target
        again = self.make(list_share=1.0)
        again.stage = 5
        self.assertEqual(again.batch(), (ids, mask, read))  # batch() is the same rows

    def test_distractors_repeat_list_words_between_the_pair_only(self):
        plain, noisy = self.make(list_share=1.0), self.make(list_share=1.0, distractors=6)
        plain.stage = noisy.stage = 5
        placed = 0
        for _ in range(6):
            (ids_p, mask_p, pairs_p), (ids_n, mask_n, pairs_n) = plain.make_row(), noisy.make_row()
            self.assertEqual((mask_p, pairs_p), (mask_n, pairs_n))  # the same pairs, targets and mask
            changed = [k for k, (a, b) in enumerate(zip(ids_p, ids_n)) if a != b]
            for k in changed:  # only text between a list and its copy, and only to a word's token
                self.assertTrue(any(p["kind"] == "list" and p["source"] + p["span"] <= k < p["target"]
                                    for p in pairs_n), k)
                self.assertTrue(1000 <= ids_n[k] < 1600, ids_n[k])
                self.assertFalse(any(p["source"] <= k < p["source"] + p["span"] or
                                     p["target"] <= k < p["target"] + p["span"] for p in pairs_n))
            placed += len(changed)
        self.assertGreater(placed, 0)
        with self.assertRaises(ValueError):
            self.make(distractors=-1)

    def test_bad_gap_arguments_are_rejected(self):
        for gaps in ("", "16,0", "0,0", "-1,4", "a"):
            with self.assertRaises(ValueError, msg=gaps):
                gap_copy.parse_gaps(gaps)
        with self.assertRaises(ValueError):
            gap_copy.row_length(2000, 40, 2048)
        with self.assertRaises(ValueError):
            self.make(rows=0)
        with self.assertRaises(ValueError):
            self.make(list_share=1.5)
        for flags in (["--gap-rows", "-1"], ["--gap-gaps", "64,16"], ["--gap-gaps", "x"],
                      ["--gap-rows", "8", "--gap-gaps", "0,4000"], ["--gap-advance", "0"],
                      ["--gap-advance", "1.5"], ["--gap-weight", "-1"],
                      ["--gap-list-share", "2"], ["--gap-below-share", "-0.1"]):
            with self.assertRaises(SystemExit, msg=flags):
                train.parse_args(["--data", "d", "--out", "o"] + flags)
        args = train.parse_args(["--data", "d", "--out", "o", "--gap-rows", "64"])
        self.assertEqual(args.gap_list, [0, 16, 64, 256, 1024, 1750])

    def test_lists_fit_with_the_real_tokenizer(self):
        try:
            bpe = MiniBpe(os.path.join(TINY, "tokenizer.json"))
        except ImportError:
            self.skipTest("the regex module is not installed")
        words = ["house", "sister", "morning", "temple", "garden"] * 3
        rows = gap_copy.GapRows(list(range(10, 5000)) * 2, [0, 64, 1750], 2048, 8, 0.5,
                                list(range(6, 4096)), [bpe.encode(" " + w) for w in words],
                                bpe.encode(recall_data.INTRO), bpe.encode(recall_data.TERMINATOR),
                                1.0, 2)
        rows.stage = 2
        self.assertEqual(rows.length, 2048)
        ids, mask, pairs = rows.make_row()
        self.assertTrue(any(p["kind"] == "list" for p in pairs))


class ExtractTest(unittest.TestCase):
    def test_unwrap_joins_lines_and_drops_italic_markers(self):
        lines = ["It is a truth", "universally _acknowledged_.", "", "", "Next."]
        self.assertEqual(extract_text.unwrap_paragraphs(lines),
                         ["It is a truth universally acknowledged.", "Next."])

    def test_split_holds_out_the_tail(self):
        units = [f"Paragraph number {i} " + "x" * 80 for i in range(100)]
        doc = {"source": "austen", "title": "Book", "units": units}
        train_doc, heldout = extract_text.split_document(doc, 0.05)
        self.assertIn("Paragraph number 94 ", train_doc["text"])
        self.assertNotIn("Paragraph number 95 ", train_doc["text"])
        self.assertTrue(heldout["text"].startswith("Paragraph number 95 "))
        self.assertIn("Paragraph number 99 ", heldout["text"])
        self.assertTrue(train_doc["text"].startswith("Book\n\n"))

    def test_sample_takes_from_every_source(self):
        docs = [{"source": s, "title": "", "text": f"{s} line {i}\n" * 400}
                for s in ("austen", "kjv") for i in range(3)]
        sample = extract_text.heldout_sample(docs, 6000)
        self.assertIn("austen line", sample)
        self.assertIn("kjv line", sample)
        self.assertLess(len(sample), 7000)


class ChatSamplesTest(unittest.TestCase):
    def test_abbreviations_do_not_end_sentences(self):
        self.assertEqual(chat_samples.split_sentences("Mrs. Bennet came. Mr. Darcy left!"),
                         ["Mrs. Bennet came.", "Mr. Darcy left!"])

    def test_build_is_deterministic_and_near_the_fraction(self):
        paragraph = ("Emma was handsome and clever and rich. She had lived nearly twenty-one "
                     "years in the world. Very little had distressed her.")
        docs = [{"source": "austen", "title": "E", "text": "\n\n".join([paragraph] * 400)}]
        a = chat_samples.build(docs, 0.05, 7)
        self.assertEqual(a, chat_samples.build(docs, 0.05, 7))
        size = sum(len(m["content"]) for c in a for m in c["messages"])
        self.assertTrue(0.04 <= size / len(docs[0]["text"]) <= 0.07)
        for conversation in a:
            self.assertEqual(conversation["messages"][-1]["role"], "assistant")


class RecallDataTest(unittest.TestCase):
    def setUp(self):
        self.stream = [1000 + (i * 7919) % 3000 for i in range(50_000)]
        self.words = [f"w{i:03d}x" for i in range(200)]

    def check_sequence(self, ids, info, encode, total):
        self.assertEqual(len(ids), total)
        if info["kind"] == "list":
            intro, term = encode(recall_data.INTRO), encode(recall_data.TERMINATOR)
            start, n, recall = info["list_start"], info["list_tokens"], info["recall_start"]
            self.assertEqual(ids[start - len(intro):start], intro)
            self.assertEqual(ids[recall - len(intro):recall], intro)
            self.assertEqual(ids[start:start + n], ids[recall:recall + n])
            self.assertEqual(ids[start:start + n],
                             [t for w in info["words"] for t in encode(" " + w)])
            self.assertEqual(ids[start + n:start + n + len(term)], term)
            self.assertEqual(ids[recall + n:recall + n + len(term)], term)
            self.assertEqual(recall - (start + n + len(term)), info["depth"])
        else:
            self.assertTrue(info["pairs"])
            for pair in info["pairs"]:
                src, dst, span = pair["source"], pair["target"], pair["span"]
                self.assertEqual(ids[src:src + span], ids[dst:dst + span])
                self.assertEqual(dst - src - span, pair["gap"])
            regions = sorted(r for p in info["pairs"] for r in
                             [(p["source"], p["source"] + p["span"]),
                              (p["target"], p["target"] + p["span"])])
            for (_, end), (start, _) in zip(regions, regions[1:]):
                self.assertLessEqual(end, start)

    def test_sequences_hold_their_recall_and_are_seeded(self):
        a = recall_data.RecallSequences(self.stream, fake_encode, self.words, 2048, 5)
        b = recall_data.RecallSequences(self.stream, fake_encode, self.words, 2048, 5)
        depths, kinds = [], {"list": 0, "passage": 0}
        for _ in range(400):
            ids, info = a.next()
            self.assertEqual((ids, info), b.next())
            self.check_sequence(ids, info, fake_encode, 2049)
            kinds[info["kind"]] += 1
            if info["kind"] == "list":
                depths.append(info["depth"])
            else:
                depths += [p["gap"] for p in info["pairs"]]
        self.assertTrue(150 < kinds["list"] < 250, kinds)
        self.assertLessEqual(max(depths), 1800)
        self.assertGreater(max(depths), 1500)  # spread up to the maximum
        self.assertLess(min(depths), 300)
        self.assertGreater(sum(d >= 1000 for d in depths), 100)
        pairs = [len(seq[1]["pairs"]) for seq in (a.next() for _ in range(200))
                 if seq[1]["kind"] == "passage"]
        self.assertGreater(sum(p > 1 for p in pairs), len(pairs) // 4)

    def test_random_kind_copies_drawn_tokens_and_obeys_max_depth(self):
        pool = list(range(9000, 9100))  # disjoint from the stream's ids
        seqs = recall_data.RecallSequences(self.stream, fake_encode, self.words, 2048, 4,
                                           weights={"list": 1, "random": 3}, random_ids=pool)
        kinds, gaps = {"list": 0, "random": 0}, []
        for _ in range(200):
            ids, info = seqs.next()
            self.check_sequence(ids, info, fake_encode, 2049)
            kinds[info["kind"]] += 1
            if info["kind"] == "random":
                for pair in info["pairs"]:
                    src, span = pair["source"], pair["span"]
                    self.assertTrue(all(t in pool for t in ids[src:src + span]))
                    gaps.append(pair["gap"])
                self.assertLessEqual(len(info["pairs"]), recall_data.RANDOM_PAIRS)
        self.assertTrue(110 < kinds["random"] < 190, kinds)
        self.assertGreater(max(gaps), 1200)
        seqs.max_depth = 100  # the curriculum's first stage
        for _ in range(100):
            ids, info = seqs.next()
            self.check_sequence(ids, info, fake_encode, 2049)
            depths = ([info["depth"]] if info["kind"] == "list"
                      else [p["gap"] for p in info["pairs"]])
            self.assertLessEqual(max(depths), 100)

    def test_copy_trials_repeat_a_drawn_span(self):
        pool = list(range(9000, 9100))
        trials = recall_data.copy_trials(self.stream, pool, 600, [50, 400], 3, 24, 8)
        self.assertEqual(len(trials), 6)
        for trial in trials:
            prompt, expected, d = trial["prompt"], trial["expected"], trial["depth"]
            self.assertEqual(len(prompt), 600)
            self.assertEqual(len(expected), 23)
            span_start = 600 - 1 - d - 24
            self.assertEqual(prompt[span_start:span_start + 24], prompt[-1:] + expected)
            self.assertTrue(all(t in pool for t in prompt[-1:] + expected))
        self.assertEqual(trials, recall_data.copy_trials(self.stream, pool, 600, [50, 400], 3,
                                                         24, 8))
        with self.assertRaises(ValueError):
            recall_data.copy_trials(self.stream, pool, 100, [90], 1, 24, 1)

    def test_tiled_rows_repeat_their_period(self):
        rng = random.Random(2)
        for _ in range(50):
            ids, period = recall_data.tiled_row(rng, 2049, [7, 8, 9], 4, 64)
            self.assertEqual(len(ids), 2049)
            self.assertTrue(4 <= period <= 64)
            self.assertEqual(ids[period:], ids[:-period])
            self.assertTrue(set(ids) <= {7, 8, 9})
        self.assertLessEqual(recall_data.tiled_row(rng, 20, [1], 4, 64)[1], 10)
        with self.assertRaises(ValueError):
            recall_data.tiled_row(rng, 20, [], 4, 8)

    def test_bad_kind_weights_are_rejected(self):
        for weights, pool in (({"echo": 1}, None), ({"list": -1, "passage": 2}, None),
                              ({"list": 0}, None), ({"random": 1}, None)):
            with self.assertRaises(ValueError, msg=weights):
                recall_data.RecallSequences(self.stream, fake_encode, self.words, 2048, 1,
                                            weights=weights, random_ids=pool)

    def test_short_sequences_still_fit(self):
        seqs = recall_data.RecallSequences(self.stream, fake_encode, self.words, 128, 1)
        for _ in range(100):
            ids, info = seqs.next()
            self.check_sequence(ids, info, fake_encode, 129)

    def test_word_split_keeps_eval_words_out_of_training(self):
        words = recall_data.vocabulary_words(["the apple and the river " * 5 + "zebra " * 2])
        self.assertEqual(words, ["and", "apple", "river", "the"])
        train_words, heldout = recall_data.split_words(words + ["candle", "meadow"] +
                                                       [f"word{i}" for i in range(100)])
        for word in recall_data.EVAL_WORDS:
            self.assertNotIn(word, train_words)
            self.assertNotIn(word, heldout)
        self.assertFalse(set(train_words) & set(heldout))
        self.assertTrue(3 <= len(heldout) <= 25, heldout)

    def test_trials_match_the_eval_format(self):
        trials = recall_data.recall_trials(self.stream, fake_encode, recall_data.EVAL_WORDS,
                                           2000, [1000, 1750], 3, 8, 9)
        self.assertEqual(len(trials), 6)
        intro, term = fake_encode(recall_data.INTRO), fake_encode(recall_data.TERMINATOR)
        for t in trials:
            prompt, listed = t["prompt"], t["expected"]
            self.assertEqual(len(prompt), 2000)
            self.assertEqual(prompt[-len(intro):], intro)
            self.assertEqual(len(t["words"]), 8)
            end = len(prompt) - t["depth"]  # just after the list's terminator
            self.assertEqual(prompt[end - len(term):end], term)
            self.assertEqual(prompt[end - len(term) - len(listed):end - len(term)], listed)
        with self.assertRaises(ValueError):
            recall_data.recall_trials(self.stream, fake_encode, recall_data.EVAL_WORDS,
                                      2000, [1995], 1, 8, 9)

    def test_in_place_accuracy(self):
        self.assertEqual(recall_data.in_place_accuracy([1, 2, 3, 4], [1, 9, 3]), (2, 4))


@unittest.skipUnless(os.path.exists(os.path.join(TINY, "tokenizer.json")), "no models/pagoda-tiny")
class RopeBaseBoundTest(unittest.TestCase):
    def test_discrimination_at_distance_zero_is_the_pair_count(self):
        self.assertAlmostEqual(rope_base_bound.discrimination(10000.0, 32, 0), 16.0)

    def test_head_dim_32_needs_a_larger_base_than_10000_for_2048_tokens(self):
        first, lowest = rope_base_bound.first_negative(10000.0, 32, 2048)
        self.assertEqual(first, 474)  # the old model's recall failed from ~500 tokens
        self.assertLess(lowest, 0.0)
        first, lowest = rope_base_bound.first_negative(1e6, 32, 2048)
        self.assertIsNone(first)
        self.assertGreater(lowest, 0.0)

    def test_larger_head_dims_hold_longer_at_one_base(self):
        self.assertGreater(rope_base_bound.first_negative(10000.0, 64, 2048)[0],
                           rope_base_bound.first_negative(10000.0, 32, 2048)[0])


class RecallWithRealTokenizerTest(unittest.TestCase):
    def test_sequences_decode_to_the_eval_format(self):
        try:
            bpe = MiniBpe(os.path.join(TINY, "tokenizer.json"))
        except ImportError:
            self.skipTest("regex not installed")
        with open(os.path.join(TINY, "heldout.txt"), encoding="utf-8") as f:
            stream = bpe.encode(f.read())
        self.assertEqual(bpe.decode(stream[:50]), bpe.decode(stream[:50]))
        words = recall_data.split_words(recall_data.vocabulary_words([bpe.decode(stream)]))[0]
        seqs = recall_data.RecallSequences(stream, bpe.encode, words, 2048, 3)
        for _ in range(20):
            ids, info = seqs.next()
            RecallDataTest.check_sequence(self, ids, info, bpe.encode, 2049)
            if info["kind"] == "list":
                text = bpe.decode(ids)
                listed = "The words to remember are: " + " ".join(info["words"]) + ".\n"
                self.assertEqual(text.count(listed), 2, text)


if __name__ == "__main__":
    unittest.main()
