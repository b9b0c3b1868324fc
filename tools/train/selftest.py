#!/usr/bin/env python3
"""Checks the training tools' pure logic without torch, transformers or tokenizers.

Run: python3 tools/train/selftest.py   (jinja2, when installed, also checks the chat template
renders exactly like the Python twin the training data is built with).
"""

import math
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import chat_samples  # noqa: E402
import extract_text  # noqa: E402
import train  # noqa: E402


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


class RecallPiecesTest(unittest.TestCase):
    def test_the_list_repeats_after_the_gap(self):
        import random
        filler = list(range(1000, 1500))
        words = [[7], [8, 9], [10], [11], [12]]
        piece = train.make_recall_piece(random.Random(3), filler, words, [1, 2], [3], 3, gap=40, head=20)
        listed_len = (len(piece) - 60) // 2
        first, second = piece[20:20 + listed_len], piece[20 + listed_len + 40:]
        self.assertEqual(first, second)
        self.assertEqual(first[:2], [1, 2])
        self.assertEqual(first[-1], 3)
        self.assertTrue(all(t >= 1000 for t in piece[:20] + piece[20 + listed_len:20 + listed_len + 40]))

    def test_pieces_fit_a_window_and_reach_the_total(self):
        import random
        pieces = train.recall_pieces(random.Random(1), list(range(5000)), [[w] for w in range(10, 60)],
                                     [1, 2, 3], [4], 8, 256, 5000)
        self.assertGreaterEqual(sum(len(p) for p in pieces), 5000)
        self.assertTrue(all(len(p) <= 256 for p in pieces))
        with self.assertRaises(ValueError):
            train.recall_pieces(random.Random(1), list(range(5000)), [[w] for w in range(10, 60)],
                                [1, 2, 3], [4], 8, 24, 100)

    def test_recall_words_are_frequent_lowercase_words(self):
        self.assertEqual(train.recall_words(["the cat and the dog", "The cat sat; the end"], 2), ["the", "cat"])

    def test_recall_share_defaults_off(self):
        self.assertEqual(train.parse_args(["--data", "d", "--out", "o"]).recall_share, 0.0)


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
        head_dim = args.hidden // args.heads
        params = (2 * args.vocab_size * args.hidden + args.layers * (
            2 * args.hidden * args.hidden + 2 * args.hidden * args.kv_heads * head_dim
            + 3 * args.hidden * args.intermediate + 2 * args.hidden) + args.hidden)
        self.assertTrue(5e6 <= params <= 10e6, params)
        self.assertLess(params * 2, 24 * 2**20)  # bf16 export under 24 MB
        self.assertEqual(args.context, 1024)
        self.assertLess(args.kv_heads, args.heads)  # GQA

    def test_bad_epochs_are_rejected(self):
        with self.assertRaises(SystemExit):
            train.parse_args(["--data", "d", "--out", "o", "--epochs", "4,-1"])


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


if __name__ == "__main__":
    unittest.main()
