#!/usr/bin/env python3
"""Reference outputs of Hugging Face `tokenizers` / transformers for pagoda's tokenizer tests.

Run on the GPU machine (Python with `tokenizers` and `transformers`, no network):

    python3 tools/make_tokenizer_fixtures.py --npm-dir .cache/npm \
        --corpus tests/fixtures/tokenizer/corpus.jsonl --out $OUT/tokenizer

For each tokenizer (qwen3, llama3, llama2: <npm-dir>/<name>/package/models/, plus any
--model NAME=DIR, e.g. --model pagoda-tiny=models/pagoda-tiny) it writes
<out>/<name>.json holding, per corpus line:
  ids            Tokenizer.encode(text, add_special_tokens=False).ids   (`tokenizers`)
  ids_special    Tokenizer.encode(text, add_special_tokens=True).ids
  decode         Tokenizer.decode(ids_special, skip_special_tokens=False)
  decode_skip    Tokenizer.decode(ids_special, skip_special_tokens=True)
  transformers   only the fields where AutoTokenizer (transformers) differs from the above
plus, per tokenizer, the class AutoTokenizer picked and the pipeline it runs (its backend's
normalizer, pre-tokenizer, post-processor, decoder and model settings, without the vocabulary),
plus byte-level decode cases (invalid / truncated UTF-8 through byte tokens) decoded with
errors=replace semantics, special ids, and a one-thread timing of `tokenizers` encoding one
~4 MiB string built from the corpus (same recipe as bench/tokenizer: every corpus text joined
with "\\n", plus "\\n", repeated until at least 4 MiB).

Outputs stay small (ids of a ~10 KB corpus), a few hundred KB in all.
"""

import argparse
import hashlib
import json
import os
import sys
import time
import traceback

# One thread: the speed figure pagoda compares against is single-threaded.
os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

TOKENIZER_NAMES = ["qwen3", "llama3", "llama2"]
BENCH_MIN_BYTES = 4 * 1024 * 1024

# Byte sequences fed to the decoder as single-byte tokens: truncated, invalid and surrogate UTF-8.
BYTE_DECODE_CASES = {
    "truncated_3byte": [0xE2, 0x82],
    "truncated_then_ascii": [0xE2, 0x82, 0x41],
    "lone_continuation": [0x80, 0x41, 0xBF],
    "invalid_ff": [0x41, 0xFF, 0x42],
    "overlong_c0_80": [0xC0, 0x80],
    "surrogate_ed_a0_80": [0xED, 0xA0, 0x80],
    "truncated_4byte_then_ascii": [0xF0, 0x9F, 0x98, 0x78],
    "valid_euro_then_truncated_emoji": [0xE2, 0x82, 0xAC, 0xF0, 0x9F],
    "above_max_f4_90": [0xF4, 0x90, 0x80, 0x80],
    "valid_emoji": [0xF0, 0x9F, 0x98, 0x80],
}


def bytes_to_unicode():
    """GPT-2's byte -> printable code point table (the ByteLevel alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def byte_token_id(tokenizer, byte, is_byte_level):
    token = bytes_to_unicode()[byte] if is_byte_level else "<0x%02X>" % byte
    return tokenizer.token_to_id(token)


def read_corpus(path):
    cases = []
    with open(path, encoding="utf-8") as f:
        for line_number, line in enumerate(f, 1):
            if not line.strip():
                continue
            record = json.loads(line)
            if "text" not in record:
                sys.exit(f"{path}:{line_number}: no 'text' field")
            cases.append(record)
    return cases


def bench_text(cases):
    unit = "\n".join(c["text"] for c in cases) + "\n"
    unit_bytes = len(unit.encode("utf-8"))
    repeats = -(-BENCH_MIN_BYTES // unit_bytes)
    return unit * repeats


def time_encode(tokenizer, text, runs=3):
    best = None
    num_tokens = 0
    for _ in range(runs):
        start = time.perf_counter()
        encoding = tokenizer.encode(text, add_special_tokens=False)
        elapsed = time.perf_counter() - start
        num_tokens = len(encoding.ids)
        best = elapsed if best is None else min(best, elapsed)
    num_bytes = len(text.encode("utf-8"))
    return {
        "bytes": num_bytes,
        "tokens": num_tokens,
        "best_seconds": round(best, 4),
        "mb_per_s": round(num_bytes / 1e6 / best, 3),
        "runs": runs,
        "threads": 1,
    }


def load_transformers(model_dir):
    try:
        from transformers import AutoTokenizer
        return AutoTokenizer.from_pretrained(model_dir, local_files_only=True), None
    except Exception:  # recorded, not fatal: `tokenizers` is the primary reference
        return None, traceback.format_exc(limit=3)


def make_fixture(name, model_dir, cases, with_timing):
    import tokenizers
    from tokenizers import Tokenizer

    tokenizer_path = os.path.join(model_dir, "tokenizer.json")
    with open(tokenizer_path, "rb") as f:
        sha256 = hashlib.sha256(f.read()).hexdigest()

    start = time.perf_counter()
    tokenizer = Tokenizer.from_file(tokenizer_path)
    load_seconds = time.perf_counter() - start

    hf, hf_error = load_transformers(model_dir)
    with open(tokenizer_path, encoding="utf-8") as f:
        spec = json.load(f)
    is_byte_level = "ByteLevel" in json.dumps(spec.get("decoder"))

    out_cases = []
    for case in cases:
        text = case["text"]
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        ids_special = tokenizer.encode(text, add_special_tokens=True).ids
        record = {
            "name": case.get("name", ""),
            "text": text,
            "ids": ids,
            "ids_special": ids_special,
            "decode": tokenizer.decode(ids_special, skip_special_tokens=False),
            "decode_skip": tokenizer.decode(ids_special, skip_special_tokens=True),
        }
        if hf is not None:
            hf_record = {
                "ids": hf(text, add_special_tokens=False)["input_ids"],
                "ids_special": hf(text, add_special_tokens=True)["input_ids"],
                "decode": hf.decode(ids_special, skip_special_tokens=False),
                "decode_skip": hf.decode(ids_special, skip_special_tokens=True),
            }
            diff = {k: v for k, v in hf_record.items() if v != record[k]}
            if diff:
                record["transformers"] = diff
        out_cases.append(record)

    byte_cases = []
    for case_name, byte_values in BYTE_DECODE_CASES.items():
        ids = [byte_token_id(tokenizer, b, is_byte_level) for b in byte_values]
        if any(i is None for i in ids):
            byte_cases.append({"name": case_name, "bytes": byte_values, "error": "no byte token"})
            continue
        record = {"name": case_name, "bytes": byte_values, "ids": ids,
                  "decode": tokenizer.decode(ids, skip_special_tokens=False),
                  "python_replace": bytes(byte_values).decode("utf-8", errors="replace")}
        if hf is not None:
            record["transformers_decode"] = hf.decode(ids, skip_special_tokens=False)
        byte_cases.append(record)

    special = {}
    pipeline = None
    if hf is not None:
        backend = json.loads(hf.backend_tokenizer.to_str())
        model_settings = {k: v for k, v in backend.get("model", {}).items() if k not in ("vocab", "merges")}
        pipeline = {"class": type(hf).__name__,
                    "normalizer": backend.get("normalizer"),
                    "pre_tokenizer": backend.get("pre_tokenizer"),
                    "post_processor": backend.get("post_processor"),
                    "decoder": backend.get("decoder"),
                    "model": model_settings}
        special = {
            "bos_token": hf.bos_token, "bos_token_id": hf.bos_token_id,
            "eos_token": hf.eos_token, "eos_token_id": hf.eos_token_id,
            "pad_token_id": hf.pad_token_id, "unk_token_id": hf.unk_token_id,
            "all_special_ids": sorted(set(hf.all_special_ids)),
        }

    fixture = {
        "tokenizer": name,
        "tokenizer_json_sha256": sha256,
        "versions": {"tokenizers": tokenizers.__version__, "python": sys.version.split()[0]},
        "vocab_size_with_added": tokenizer.get_vocab_size(with_added_tokens=True),
        "load_seconds": round(load_seconds, 4),
        "special": special,
        "transformers_pipeline": pipeline,
        "cases": out_cases,
        "byte_decode_cases": byte_cases,
    }
    if hf is not None:
        import transformers
        fixture["versions"]["transformers"] = transformers.__version__
    else:
        fixture["transformers_error"] = hf_error
    if with_timing:
        fixture["encode_timing"] = time_encode(tokenizer, bench_text(cases))
    return fixture


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--npm-dir", required=True, help="holds <name>/package/models/tokenizer.json")
    parser.add_argument("--corpus", required=True, help="JSONL, one {\"name\", \"text\"} per line")
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--no-timing", action="store_true", help="skip the 4 MiB encode timing")
    parser.add_argument("--model", action="append", default=[], metavar="NAME=DIR",
                        help="another tokenizer directory (tokenizer.json + tokenizer_config.json)")
    args = parser.parse_args()
    model_dirs = [(name, os.path.join(args.npm_dir, name, "package", "models")) for name in TOKENIZER_NAMES]
    for entry in args.model:
        if "=" not in entry:
            sys.exit(f"--model {entry}: expected NAME=DIR")
        name, directory = entry.split("=", 1)
        model_dirs.append((name, directory))

    cases = read_corpus(args.corpus)
    os.makedirs(args.out, exist_ok=True)
    failures = 0
    for name, model_dir in model_dirs:
        if not os.path.isfile(os.path.join(model_dir, "tokenizer.json")):
            print(f"{name}: no tokenizer.json under {model_dir}", file=sys.stderr)
            failures += 1
            continue
        try:
            fixture = make_fixture(name, model_dir, cases, not args.no_timing)
        except Exception:
            traceback.print_exc()
            failures += 1
            continue
        out_path = os.path.join(args.out, f"{name}.json")
        with open(out_path, "w", encoding="utf-8") as f:
            json.dump(fixture, f, ensure_ascii=False, separators=(",", ":"))
            f.write("\n")
        timing = fixture.get("encode_timing", {})
        print(f"{name}: {len(fixture['cases'])} cases, load {fixture['load_seconds']} s, "
              f"encode {timing.get('mb_per_s', '-')} MB/s -> {out_path} "
              f"({os.path.getsize(out_path)} bytes)"
              + ("" if "transformers_error" not in fixture else " [transformers failed to load]"))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
