#!/usr/bin/env python3
"""CPU sanity for stage 2 (docs/MODEL.md): loads models/pagoda-tiny in plain torch (safetensors read by
hand; Debian python3-torch, no transformers), checks 8 greedy tokens against transformers' in
train_report.json, then continues training on 256-token rows (2 plain, 3 with a passage of training
text repeated later, 1 with a random-token span repeated later; lr 1e-3 after 10 warm-up steps) and
logs every 10 steps the copy accuracy on held-out rows built the same way (the repeated span's
tokens after its first). Run from the repository root: /usr/bin/python3 tools/train/continue_cpu_check.py [STEPS]
(needs .cache/train-data from extract_text.py and python3-regex)."""
import json, math, os, random, struct, sys, time
sys.path.insert(0, "tools/train")
import torch, torch.nn.functional as F
import selftest, train
torch.set_num_threads(2)
M = "models/pagoda-tiny"
import plain_llama
cfg, P, forward = plain_llama.load(M)
rep = json.load(open(f"{M}/train_report.json"))
pr = rep["greedy"]["prompts"][0]
ids = list(pr["prompt_ids"])
with torch.no_grad():
    for _ in range(8):
        ids.append(int(forward(torch.tensor([ids]))[0, -1].argmax()))
got = ids[len(pr["prompt_ids"]):]
print("plain-torch greedy", got, "transformers", pr["output_ids"][:8], "match", got == pr["output_ids"][:8], flush=True)
bpe = selftest.MiniBpe(f"{M}/tokenizer.json")
data = ".cache/train-data"
tr = [json.loads(l)["text"] for l in open(f"{data}/train.jsonl")]
rng = random.Random(5)
train_ids = [t for d in rng.sample(tr, 20) for t in bpe.encode(d[:30000])]
held_ids = bpe.encode(open(f"{data}/heldout_sample.txt").read()[:60000])
vocab_ids = list(range(6, 4096))
T = 256
def row(src, r, kind):
    s = r.randrange(0, len(src) - 400); base = src[s:s + T + 1]
    plen = r.randint(24, 64); a = r.randint(0, 40)
    span = base[a:a + plen] if kind == "text" else [r.choice(vocab_ids) for _ in range(plen)]
    b = r.randint(a + plen + 20, T + 1 - plen)
    x = base[:a] + span + base[a + plen:b] + span
    x = (x + base[len(x):])[:T + 1]
    return x, b, plen
def evaluate(kind, n=12):
    r = random.Random(99 if kind == "text" else 98); hit = tot = 0
    rows = [row(held_ids, r, kind) for _ in range(n)]
    with torch.no_grad():
        lg = forward(torch.tensor([x[:-1] for x, _, _ in rows]))
    for (x, b, plen), l in zip(rows, lg):
        pred = l.argmax(-1)
        for j in range(b + 1, b + plen):  # the copy's tokens after its first
            hit += int(pred[j - 1] == x[j]); tot += 1
    return hit / tot
print("before: copy acc text", round(evaluate("text"), 3), "random", round(evaluate("random"), 3), flush=True)
opt = torch.optim.AdamW(P.values(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
r = random.Random(1); steps = int(sys.argv[1]) if len(sys.argv) > 1 else 60; t0 = time.time()
for step in range(1, steps + 1):
    for g in opt.param_groups: g["lr"] = 1e-3 * min(1, step / 10)
    rows = []
    for i in range(6):
        kind = "plain" if i < 2 else ("random" if i == 5 else "text")
        if kind == "plain":
            s = r.randrange(0, len(train_ids) - T - 2); rows.append(train_ids[s:s + T + 1])
        else:
            rows.append(row(train_ids, r, kind)[0])
    x = torch.tensor(rows)
    loss = F.cross_entropy(forward(x[:, :-1]).reshape(-1, 4096), x[:, 1:].reshape(-1))
    loss.backward(); torch.nn.utils.clip_grad_norm_(P.values(), 1.0); opt.step(); opt.zero_grad()
    if step % 10 == 0:
        print(f"step {step} loss {loss.item():.3f} copy acc text {evaluate('text'):.3f} random {evaluate('random'):.3f} ({time.time() - t0:.0f}s)", flush=True)
