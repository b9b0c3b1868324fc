#!/usr/bin/env python3
"""Restart-and-replay through `pagoda serve` with the disk KV tier (issue #19).

Run 1 starts a server on an empty --kv-offload-disk DIR and sends N distinct long prompts (streaming,
max_tokens 1, greedy); the server is stopped (SIGTERM: the index is written); run 2 starts a fresh
process on the same DIR and replays them; run 3 is a control: a fresh process without the disk tier.
Prints per run: mean / median time to first token (first SSE chunk) and prompt tokens computed vs
served from cache, as a markdown table.

  bench/serve/disk_tier_replay.py --pagoda build/pagoda --model models/pagoda-tiny [--prompts 16]
  # random weights (no tokenizer): token-id prompts; extra serve flags; a bundled binary
  bench/serve/disk_tier_replay.py --pagoda ".device/x/run.sh pagoda" --token-prompts 2048 \
      --serve-args "--device cuda --load-format random --config tools/gpu_backend/llama3_8b_config.json"
"""
import argparse
import http.client
import json
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import tempfile
import time


def start(pagoda, args):
    p = subprocess.Popen(shlex.split(pagoda) + ["serve", "--host", "127.0.0.1", "--port", "0"] + args,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    for line in p.stdout:
        if "listening on http://" in line:
            return p, int(line.rsplit(":", 1)[1])
    raise RuntimeError("pagoda serve did not start")


def stop(p):
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=60)


def ttft(port, model, prompt):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": True}})
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    first = None
    usage = None
    for raw in r:
        line = raw.decode().strip()
        if not line.startswith("data:") or line == "data: [DONE]":
            continue
        event = json.loads(line[5:])
        if first is None and event.get("choices"):
            first = time.perf_counter() - t0
        if event.get("usage"):
            usage = event["usage"]
    c.close()
    cached = (usage or {}).get("prompt_tokens_details", {}).get("cached_tokens", 0) or 0
    return first, (usage or {}).get("prompt_tokens", 0), cached


def served_model(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/v1/models")
    name = json.loads(c.getresponse().read())["data"][0]["id"]
    c.close()
    return name


def run(pagoda, flags, prompts):
    p, port = start(pagoda, flags)
    try:
        model = served_model(port)
        return [ttft(port, model, q) for q in prompts]
    finally:
        stop(p)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pagoda", default="build/pagoda")
    ap.add_argument("--model", default="models/pagoda-tiny")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--chars", type=int, default=3000)
    ap.add_argument("--token-prompts", type=int, default=0, help="token-id prompts of this length (no tokenizer)")
    ap.add_argument("--serve-args", default="", help="extra pagoda serve flags")
    ap.add_argument("--offload-memory", default="64MiB")
    ap.add_argument("--disk-size", default="1GiB")
    ap.add_argument("--dir", default="", help="disk tier directory (default: a temporary one, removed)")
    args = ap.parse_args()
    if args.token_prompts > 0:
        prompts = [[(j * 7919 + i * 104729 + 13) % 32000 for j in range(args.token_prompts)] for i in range(args.prompts)]
        base = []
        name = "token prompts of %d" % args.token_prompts
    else:
        text = open(os.path.join(args.model, "heldout.txt"), encoding="utf-8").read()
        prompts = [text[i * args.chars:(i + 1) * args.chars] for i in range(args.prompts)]
        base = ["--model", args.model]
        name = os.path.basename(os.path.normpath(args.model))
    tmp = tempfile.mkdtemp(prefix="pagoda_replay_", dir=args.dir or None)
    base += ["--kv-offload-memory", args.offload_memory] + shlex.split(args.serve_args)
    disk = ["--kv-offload-disk", os.path.join(tmp, "kv"), "--kv-offload-disk-size", args.disk_size]
    try:
        results = [("1: first run, empty disk tier", run(args.pagoda, base + disk, prompts)),
                   ("2: restarted, same disk tier", run(args.pagoda, base + disk, prompts)),
                   ("3: restarted, no disk tier (control)", run(args.pagoda, base, prompts))]
        files = len(os.listdir(os.path.join(tmp, "kv", "blocks")))
    finally:
        shutil.rmtree(tmp)
    print(f"{len(prompts)} prompts, {name}; {files} block files on disk after the runs\n")
    print("| run | mean TTFT ms | median TTFT ms | prompt tokens | computed | from cache |")
    print("|---|---:|---:|---:|---:|---:|")
    for label, rows in results:
        t = [r[0] * 1000 for r in rows]
        total = sum(r[1] for r in rows)
        cached = sum(r[2] for r in rows)
        print(f"| {label} | {statistics.mean(t):.1f} | {statistics.median(t):.1f} | {total} | {total - cached} | {cached} |")
    # Per request, in the order sent: a run's first request also pays the process's warm-up.
    print()
    for label, rows in results:
        print(f"{label}: TTFT ms per request: " + " ".join(f"{r[0] * 1000:.1f}" for r in rows))


if __name__ == "__main__":
    main()
