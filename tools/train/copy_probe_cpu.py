#!/usr/bin/env python3
"""Copy probes of checkpoints on the CPU (plain torch, tools/train/plain_llama.py; Debian python3-torch
and python3-regex): `short128` (16 held-out tiled random-token rows of 128 tokens, as train.py's
monitor, accuracy on the copyable targets) and `copy100` (8 spans of 24 distinct random tokens in
held-out text, repeated 100 tokens later in a 400-token prompt; teacher-forced accuracy after the
copy's first token, as train.py's probe). Tells whether a checkpoint has a copy circuit at all.

Run from the repository root: /usr/bin/python3 tools/train/copy_probe_cpu.py MODEL_DIR... [--data DIR]
(DIR: extract_text.py's folder, default .cache/train-data)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
import plain_llama  # noqa: E402
import recall_data  # noqa: E402
import selftest  # noqa: E402
import short_copy  # noqa: E402

torch.set_num_threads(2)
args = sys.argv[1:]
data = ".cache/train-data"
if "--data" in args:
    i = args.index("--data")
    data = args[i + 1]
    del args[i:i + 2]
for model_dir in args:
    cfg, params, forward = plain_llama.load(model_dir)
    pool = list(range(6, 4096))  # every id but the special ones
    ids, mask = short_copy.monitor_rows([128], pool, 16, 99)[128]
    x = torch.tensor(ids)
    with torch.no_grad():
        logits = forward(x[:, :-1])
    short = float(short_copy.masked_accuracy(logits, x[:, 1:], torch.tensor(mask)))
    bpe = selftest.MiniBpe(os.path.join(model_dir, "tokenizer.json"))
    held = bpe.encode(open(os.path.join(data, "heldout_sample.txt")).read()[:20000])
    hits = total = 0
    with torch.no_grad():
        for trial in recall_data.copy_trials(held, pool, 400, [100], 8, 24, 5):
            row = torch.tensor([trial["prompt"] + trial["expected"]])
            got = forward(row)[0, len(trial["prompt"]) - 1:-1].argmax(-1).tolist()
            h, n = recall_data.in_place_accuracy(trial["expected"], got)
            hits, total = hits + h, total + n
    print(f"{model_dir}: short128 {short:.3f} copy100 {hits / total:.3f}", flush=True)
