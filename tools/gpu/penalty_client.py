"""Penalties and top logprobs through `pagoda serve` with an independent HTTP client (http.client only).
Usage: penalty_client.py PORT MODEL OUT.json [CONCURRENCY]
Writes the greedy outputs of fixed requests (tokens, logprobs, top logprobs) to OUT.json, so two servers
(rows on the device, rows on the host) can be compared, and prints output tok/s of CONCURRENCY (default 16)
concurrent requests of 256 prompt tokens x 64 out at temperature 0.8: plain, with penalties, with top 5
logprobs, with logit_bias, with penalties and top logprobs."""
import http.client, json, sys, threading, time

PORT, MODEL, OUT = int(sys.argv[1]), sys.argv[2], sys.argv[3]
CONC = int(sys.argv[4]) if len(sys.argv) > 4 else 16


def post(body):
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=900)
    c.request("POST", "/v1/completions", json.dumps(body), {"content-type": "application/json"})
    r = c.getresponse()
    d = r.read()
    c.close()
    if r.status != 200:
        raise RuntimeError(f"{r.status}: {d[:300]}")
    return json.loads(d)


def prompt(n, salt):
    return [(37 * i + 101 * salt + 7) % 30000 + 100 for i in range(n)]


fixed = [
    {"presence_penalty": 1.5},
    {"frequency_penalty": 1.2, "logprobs": 5},
    {"repetition_penalty": 1.3, "logprobs": 2},
    {"repetition_penalty": 0.8, "frequency_penalty": 0.5, "presence_penalty": 0.5, "logprobs": 20},
    {"logprobs": 5},
    {"logit_bias": {"1000": 5.0, "1001": -100}, "logprobs": 3},
    {"min_tokens": 12, "stop_token_ids": [2000, 2001], "presence_penalty": 0.3},
    {"bad_words": ["the", " of the"]},
    {},
]
results = []
for i, extra in enumerate(fixed):
    body = {"model": MODEL, "prompt": prompt(40 + 13 * i, i), "max_tokens": 24, "temperature": 0,
            "ignore_eos": True, **extra}
    choice = post(body)["choices"][0]
    lp = choice.get("logprobs") or {}
    results.append({"extra": extra, "text": choice["text"], "token_logprobs": lp.get("token_logprobs"),
                    "top_logprobs": lp.get("top_logprobs")})
json.dump(results, open(OUT, "w"))
print("fixed requests:", [len(r["text"]) for r in results])

for label, extra in (("plain", {}), ("penalties", {"presence_penalty": 0.5, "frequency_penalty": 0.3,
                                                  "repetition_penalty": 1.1}),
                     ("top5", {"logprobs": 5}),
                     ("bias", {"logit_bias": {"1000": 2.0, "1001": -100, "1002": 1.5}}),
                     ("both", {"presence_penalty": 0.5, "frequency_penalty": 0.3, "logprobs": 5})):
    tokens = [0] * CONC

    def one(k):
        r = post({"model": MODEL, "prompt": prompt(256, 1000 + k), "max_tokens": 64, "temperature": 0.8,
                  "seed": k, "ignore_eos": True, **extra})
        tokens[k] = r["usage"]["completion_tokens"]

    t0 = time.time()
    ths = [threading.Thread(target=one, args=(k,)) for k in range(CONC)]
    [t.start() for t in ths]
    [t.join() for t in ths]
    dt = time.time() - t0
    print(f"{label:10s} {CONC} x 64 tokens at T=0.8: {dt:6.2f} s, {sum(tokens) / dt:8.0f} output tok/s")
c = http.client.HTTPConnection("127.0.0.1", PORT)
c.request("GET", "/metrics")
m = c.getresponse().read().decode()
print([l for l in m.splitlines() if l.startswith("pagoda_kv_blocks_in_use")])
