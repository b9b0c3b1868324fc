"""Batched completions prompts through `pagoda serve`, with an independent HTTP client (http.client only).
Usage: batched_prompts_client.py PORT MODEL [PROMPTS] [BATCH] [VOCAB]
PROMPTS (default 256) token-id prompts of 200-456 tokens (ids below VOCAB, default 30000), each
  score:    echo + logprobs 0 + max_tokens 0 (a loglikelihood request: the prompt's tokens scored),
  generate: greedy, 32 tokens each (ignore_eos),
sent by one client one request at a time (as lm-evaluation-harness's local-completions sends) with one prompt
per request, then with BATCH prompts per request, then by BATCH clients at once with one prompt each. Prints wall time, prompts/s and tokens/s of each,
and compares every prompt's result batched and sent concurrently with the result it gets alone, one request at
a time (equal texts, equal first tokens, the largest difference of the first logprob: batched and concurrent
rows run through other kernel shapes than one row alone, GEMM instead of GEMV, so bf16 rounding differs)."""
import http.client, json, sys, threading, time

PORT, MODEL = int(sys.argv[1]), sys.argv[2]
PROMPTS = int(sys.argv[3]) if len(sys.argv) > 3 else 256
BATCH = int(sys.argv[4]) if len(sys.argv) > 4 else 32
VOCAB = int(sys.argv[5]) if len(sys.argv) > 5 else 30000
conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=900)  # keep-alive, one request at a time


def prompt(k):
    return [(31 * i + 977 * k + 11) % VOCAB + 100 for i in range(200 + (k * 37) % 257)]


prompts = [prompt(k) for k in range(PROMPTS)]
KINDS = {"score": {"max_tokens": 0, "echo": True, "logprobs": 0},
         "generate": {"max_tokens": 32, "temperature": 0, "ignore_eos": True, "logprobs": 0}}
def run(kind, extra, batch, threads=1):
    """Every prompt, `batch` per request, from `threads` clients (each one request at a time)."""
    choices, tokens = [None] * PROMPTS, [0] * threads

    def client(t):
        c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=900) if threads > 1 else conn
        for at in range(t * batch, PROMPTS, batch * threads):
            group = prompts[at:at + batch]
            c.request("POST", "/v1/completions", json.dumps({"model": MODEL, "prompt": group if batch > 1 else group[0],
                                                             **extra}), {"content-type": "application/json"})
            r = c.getresponse()
            body = r.read()
            if r.status != 200:
                raise RuntimeError(f"{r.status}: {body[:300]}")
            r = json.loads(body)
            assert [c["index"] for c in r["choices"]] == list(range(len(group))), "choices in prompt order"
            choices[at:at + batch] = r["choices"]
            tokens[t] += r["usage"]["prompt_tokens"] + r["usage"]["completion_tokens"]

    t0 = time.time()
    ths = [threading.Thread(target=client, args=(t,)) for t in range(threads)]
    [t.start() for t in ths]
    [t.join() for t in ths]
    dt = time.time() - t0
    label = f"{batch:3d} per request" + (f", {threads} clients" if threads > 1 else "")
    print(f"{kind:8s} {PROMPTS} prompts, {label:28s}: {dt:7.2f} s, {PROMPTS / dt:8.1f} prompts/s, "
          f"{sum(tokens) / dt:9.0f} tok/s (prompt + output)", flush=True)
    return choices


def compare(kind, what, alone, other):
    same_text = sum(a["text"] == b["text"] for a, b in zip(alone, other))
    first, diff = 0, 0.0
    for a, b in zip(alone, other):
        x, y = a["logprobs"]["tokens"], b["logprobs"]["tokens"]
        first += kind == "generate" and bool(x) and bool(y) and x[0] == y[0]
        for u, v in zip(a["logprobs"]["token_logprobs"], b["logprobs"]["token_logprobs"]):
            if u is not None and v is not None:
                diff = max(diff, abs(u - v))
                if kind == "generate":
                    break  # after the first token the texts may differ: compare the first only
    extra = f", first token equal for {first}/{PROMPTS}" if kind == "generate" else ""
    print(f"{kind:8s} {what} vs alone one at a time: text equal for {same_text}/{PROMPTS}{extra}, "
          f"max |first logprob diff| {diff:.2e}" if kind == "generate" else
          f"{kind:8s} {what} vs alone one at a time: max |logprob diff| {diff:.2e}", flush=True)


for kind, extra in KINDS.items():
    alone = run(kind, extra, 1)
    compare(kind, "batched", alone, run(kind, extra, BATCH))
    compare(kind, "concurrent", alone, run(kind, extra, 1, BATCH))
conn.request("GET", "/metrics")
m = conn.getresponse().read().decode()
print([l for l in m.splitlines() if l.startswith("pagoda_kv_blocks_in_use")])
