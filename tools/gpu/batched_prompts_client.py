"""Batched completions prompts through `pagoda serve`, with an independent HTTP client (http.client only).
Usage: batched_prompts_client.py PORT MODEL [PROMPTS] [BATCH]
A client that sends its work one request at a time (as lm-evaluation-harness's local-completions does, one
request in flight) with BATCH prompts per request against one prompt per request, on PROMPTS (default 256)
token-id prompts of 200-456 tokens:
  score:    echo + logprobs 0 + max_tokens 0 (a loglikelihood request: the prompt's tokens scored),
  generate: greedy, 32 tokens each (ignore_eos).
Prints wall time, prompts/s and tokens/s of each, and compares every prompt's result in a batch with the
result it gets alone (how many texts are equal, the largest logprob difference: a batch runs its rows through
other kernel shapes than one row alone, GEMM instead of GEMV, so bf16 rounding differs)."""
import http.client, json, sys, time

PORT, MODEL = int(sys.argv[1]), sys.argv[2]
PROMPTS = int(sys.argv[3]) if len(sys.argv) > 3 else 256
BATCH = int(sys.argv[4]) if len(sys.argv) > 4 else 32
VOCAB = int(sys.argv[5]) if len(sys.argv) > 5 else 30000
conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=900)  # keep-alive, one request at a time


def post(body):
    conn.request("POST", "/v1/completions", json.dumps(body), {"content-type": "application/json"})
    r = conn.getresponse()
    d = r.read()
    if r.status != 200:
        raise RuntimeError(f"{r.status}: {d[:300]}")
    return json.loads(d)


def prompt(k):
    return [(31 * i + 977 * k + 11) % VOCAB + 100 for i in range(200 + (k * 37) % 257)]


prompts = [prompt(k) for k in range(PROMPTS)]
KINDS = {"score": {"max_tokens": 0, "echo": True, "logprobs": 0},
         "generate": {"max_tokens": 32, "temperature": 0, "ignore_eos": True, "logprobs": 0}}
for kind, extra in KINDS.items():
    results = {}
    for batch in (1, BATCH):
        t0 = time.time()
        choices, tokens = [], 0
        for at in range(0, PROMPTS, batch):
            group = prompts[at:at + batch]
            r = post({"model": MODEL, "prompt": group if batch > 1 else group[0], **extra})
            assert len(r["choices"]) == len(group), r
            assert [c["index"] for c in r["choices"]] == list(range(len(group))), "choices in prompt order"
            choices += r["choices"]
            tokens += r["usage"]["prompt_tokens"] + r["usage"]["completion_tokens"]
        dt = time.time() - t0
        results[batch] = choices
        print(f"{kind:8s} {PROMPTS} prompts, {batch:3d} per request: {dt:7.2f} s, {PROMPTS / dt:8.1f} prompts/s, "
              f"{tokens / dt:9.0f} tok/s (prompt + output)", flush=True)
    same_text, diff = 0, 0.0
    for a, b in zip(results[1], results[BATCH]):
        same_text += a["text"] == b["text"]
        for x, y in zip(a["logprobs"]["token_logprobs"], b["logprobs"]["token_logprobs"]):
            if x is not None and y is not None:
                diff = max(diff, abs(x - y))
    print(f"{kind:8s} batched vs alone: text equal for {same_text}/{PROMPTS}, max |logprob diff| {diff:.2e}",
          flush=True)
conn.request("GET", "/metrics")
m = conn.getresponse().read().decode()
print([l for l in m.splitlines() if l.startswith("pagoda_kv_blocks_in_use")])
