#!/usr/bin/env python3
"""CPU check of the short copy rows (docs/MODEL.md, fifth attempt): the real model shape in plain torch
(Debian python3-torch, no transformers), started from models/pagoda-tiny (SCRATCH=1: random weights of
the same shape), trained on short tiled random-token rows only (short_copy.tiled: a segment of 8 to
48 * LEN / 128 tokens from the whole vocabulary repeated to fill LEN tokens), BATCH rows a step, lr LR
after 10 warm-up steps; every 10 steps the copy accuracy (copyable targets, short_copy.copy_mask) on 16
fixed held-out rows. Run from the repository root:
  [SCRATCH=1] [LEN=64] [BATCH=16] [LR=1e-3] /usr/bin/python3 tools/train/short_copy_cpu_check.py [STEPS]"""
import json, math, os, random, struct, sys, time
sys.path.insert(0, "tools/train")
import torch, torch.nn.functional as F
import selftest, train
torch.set_num_threads(2)
M = "models/pagoda-tiny"
import plain_llama
cfg, P, forward = plain_llama.load(M)
import short_copy
if os.environ.get("SCRATCH"):
    torch.manual_seed(0)
    for k, p in P.items():
        with torch.no_grad():
            if p.dim() == 2: p.normal_(0, 0.02)
            else: p.fill_(1.0)
LEN, BATCH = int(os.environ.get("LEN", 64)), int(os.environ.get("BATCH", 16))
LR = float(os.environ.get("LR", 1e-3))
pool = list(range(6, cfg["vocab_size"]))
held = short_copy.monitor_rows([LEN], pool, 16, 99)[LEN]
def evaluate():
    ids, mask = held
    x = torch.tensor(ids)
    with torch.no_grad():
        lg = forward(x[:, :-1])
    return float(short_copy.masked_accuracy(lg, x[:, 1:], torch.tensor(mask)))
print(f"len {LEN} periods {short_copy.period_range(LEN)} batch {BATCH} lr {LR} scratch "
      f"{bool(os.environ.get('SCRATCH'))}: before copy acc {evaluate():.3f}", flush=True)
opt = torch.optim.AdamW(P.values(), lr=LR, betas=(0.9, 0.95), weight_decay=0.1)
r = random.Random(1); steps = int(sys.argv[1]) if len(sys.argv) > 1 else 100; t0 = time.time()
for step in range(1, steps + 1):
    for g in opt.param_groups: g["lr"] = LR * min(1, step / 10)
    x = torch.tensor([short_copy.tiled(r, LEN, pool)[0] for _ in range(BATCH)])
    loss = F.cross_entropy(forward(x[:, :-1]).reshape(-1, cfg["vocab_size"]), x[:, 1:].reshape(-1))
    loss.backward(); torch.nn.utils.clip_grad_norm_(P.values(), 1.0); opt.step(); opt.zero_grad()
    if step % 10 == 0:
        print(f"step {step} loss {loss.item():.3f} held-out copy acc {evaluate():.3f} "
              f"({time.time() - t0:.0f}s)", flush=True)
