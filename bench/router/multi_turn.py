#!/usr/bin/env python3
"""Multi-turn chat load against an OpenAI-compatible endpoint (a `pagoda route`
router or one `pagoda serve`), standard library only.

Each conversation has its own context (a slice of a text file, a few hundred
tokens) behind a short shared system prompt, then `--turns` user questions;
every turn resends the whole history plus the model's previous answers, as a
chat client does. Conversations take turns (a conversation's next question
queues behind every other conversation's), and `--concurrency` requests are
in flight at once. Every request is a streamed chat
completion with usage; the first SSE event marks the time to first token, the
usage event gives prompt and cached tokens (the backend's own count).

Prints one JSON object: requests, failures (split into those started before
and after `--kill-pid` was killed, if given), cached-token share, TTFT p50/p90,
wall time; `--csv` appends a row.

  bench/router/multi_turn.py --url http://127.0.0.1:8000 --label kv-aware
"""

import argparse
import csv
import http.client
import json
import os
import random
import signal
import statistics
import sys
import threading
import time
import urllib.parse

SYSTEM = "You are a helpful assistant. Answer the user's questions about the text they gave you."
QUESTIONS = [
    "What is the text about?",
    "Who are the people in it?",
    "What happens next in the story?",
    "Summarize the second half in one sentence.",
    "Which word in the text is the rarest?",
    "What would you change in the text?",
    "Is there anything surprising in it?",
    "Describe the mood of the text.",
]


def percentile(values, q):
    if not values:
        return float("nan")
    values = sorted(values)
    k = (len(values) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def chat_stream(host, port, body, timeout):
    """One streamed chat completion: (ttft_s, usage dict or None, text, error or None)."""
    start = time.monotonic()
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("POST", "/v1/chat/completions", body=json.dumps(body),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            return None, None, "", f"HTTP {resp.status}: {resp.read()[:200]!r}"
        ttft, usage, text, done = None, None, [], False
        for raw in resp:
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if ttft is None:
                ttft = time.monotonic() - start
            if data == "[DONE]":
                done = True
                break
            event = json.loads(data)
            if "error" in event:
                return ttft, usage, "".join(text), f"error event: {event['error']}"
            if event.get("usage"):
                usage = event["usage"]
            for choice in event.get("choices", []):
                text.append(choice.get("delta", {}).get("content") or "")
        if not done:
            return ttft, usage, "".join(text), "stream ended without [DONE]"
        return ttft, usage, "".join(text), None
    except (OSError, http.client.HTTPException, ValueError) as e:
        return None, None, "", f"{type(e).__name__}: {e}"
    finally:
        conn.close()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True)
    p.add_argument("--model", default="pagoda-tiny")
    p.add_argument("--conversations", type=int, default=24)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--concurrency", type=int, default=6)
    p.add_argument("--max-tokens", type=int, default=24)
    p.add_argument("--context-chars", type=int, default=1400, help="per-conversation context taken from --text")
    p.add_argument("--text", default=os.path.join(os.path.dirname(__file__), "../../models/pagoda-tiny/heldout.txt"))
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("--kill-pid", type=int, default=0, help="SIGKILL this process (a replica) mid-run")
    p.add_argument("--kill-after", type=float, default=0.4, help="... after this share of the requests finished")
    p.add_argument("--label", default="")
    p.add_argument("--csv", default="")
    args = p.parse_args()

    url = urllib.parse.urlparse(args.url)
    host, port = url.hostname, url.port or 80
    rng = random.Random(args.seed)
    with open(args.text, encoding="utf-8") as f:
        corpus = " ".join(f.read().split())
    contexts = []
    for _ in range(args.conversations):
        at = rng.randrange(0, max(1, len(corpus) - args.context_chars))
        contexts.append(corpus[at:at + args.context_chars])

    total = args.conversations * args.turns
    lock = threading.Lock()
    results = []  # (start, end, ttft, prompt, cached, error)
    killed_at = [None]

    def maybe_kill():
        if args.kill_pid and killed_at[0] is None and len(results) >= args.kill_after * total:
            killed_at[0] = time.monotonic()
            try:
                os.kill(args.kill_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    # Conversations take turns: a conversation's next question joins the back
    # of the queue once its answer is in, as users with think time would, so
    # every conversation's history stays live at once (the cache must hold
    # all of them, not a few at a time).
    conversations = []
    for c in range(args.conversations):
        conversations.append([{"role": "system", "content": SYSTEM},
                              {"role": "user", "content": "Here is a text: " + contexts[c]}])
    queue = list((c, 0) for c in range(args.conversations))
    ready = threading.Condition(lock)
    in_progress = [0]

    def worker():
        while True:
            with ready:
                while not queue and in_progress[0] > 0:
                    ready.wait()
                if not queue:
                    ready.notify_all()
                    return
                c, turn = queue.pop(0)
                in_progress[0] += 1
            messages = conversations[c]
            question = QUESTIONS[(c + turn) % len(QUESTIONS)]
            if turn == 0:
                messages[-1]["content"] += "\n" + question
            else:
                messages.append({"role": "user", "content": question})
            body = {"model": args.model, "messages": messages, "max_tokens": args.max_tokens,
                    "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
            start = time.monotonic()
            ttft, usage, text, error = chat_stream(host, port, body, args.timeout)
            end = time.monotonic()
            prompt = usage["prompt_tokens"] if usage else 0
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0) if usage else 0
            with ready:
                results.append((start, end, ttft, prompt, cached, error))
                maybe_kill()
                in_progress[0] -= 1
                # A failed turn ends its conversation: it cannot go on without the answer.
                if error is None and turn + 1 < args.turns:
                    messages.append({"role": "assistant", "content": text})
                    queue.append((c, turn + 1))
                ready.notify_all()

    began = time.monotonic()
    threads = [threading.Thread(target=worker) for _ in range(args.concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - began

    ok = [r for r in results if r[5] is None]
    failed = [r for r in results if r[5] is not None]
    k = killed_at[0]
    prompt_tokens = sum(r[3] for r in ok)
    cached_tokens = sum(r[4] for r in ok)
    ttfts = [r[2] for r in ok if r[2] is not None]
    summary = {
        "label": args.label,
        "requests": len(results),
        "ok": len(ok),
        "failed": len(failed),
        "failed_started_before_kill": sum(1 for r in failed if k is not None and r[0] < k),
        "failed_started_after_kill": sum(1 for r in failed if k is not None and r[0] >= k),
        "prompt_tokens": prompt_tokens,
        "cached_tokens": cached_tokens,
        "cached_share": round(cached_tokens / prompt_tokens, 4) if prompt_tokens else 0.0,
        "ttft_p50_s": round(percentile(ttfts, 0.5), 4),
        "ttft_p90_s": round(percentile(ttfts, 0.9), 4),
        "wall_s": round(wall, 2),
        "errors": sorted({r[5] for r in failed})[:5],
    }
    print(json.dumps(summary))
    if args.csv:
        new = not os.path.exists(args.csv)
        with open(args.csv, "a", newline="") as f:
            w = csv.writer(f)
            if new:
                w.writerow([key for key in summary if key != "errors"])
            w.writerow([summary[key] for key in summary if key != "errors"])
    return 0 if not failed or args.kill_pid else 1


if __name__ == "__main__":
    sys.exit(main())
