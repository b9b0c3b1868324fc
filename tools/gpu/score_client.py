"""Prompt scoring through `pagoda serve` with an independent HTTP client (http.client only): echo and
prompt_logprobs agree with the logprobs of the same tokens generated, and what scoring a long prompt costs.
Usage: score_client.py PORT MODEL"""
import http.client, json, sys, time, threading

PORT, MODEL = int(sys.argv[1]), sys.argv[2]


def post(body, path="/v1/completions"):
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=600)
    c.request("POST", path, json.dumps(body), {"content-type": "application/json"})
    r = c.getresponse()
    d = r.read()
    c.close()
    return r.status, json.loads(d) if r.status == 200 else d[:300]


prompt = list(range(1000, 1032))
text = "It is a truth universally acknowledged, that a single man in possession of a good fortune"
st, gen = post({"model": MODEL, "prompt": text, "max_tokens": 16, "temperature": 0, "logprobs": 1})
assert st == 200, gen
gen_lp = gen["choices"][0]["logprobs"]["token_logprobs"]
# The prompt and the generated text scored together (a text round trip through the tokenizer): where the
# tokens come back the same, the tail's logprobs are the generated tokens' (prefill rows vs decode rows).
st, sc = post({"model": MODEL, "prompt": text + gen["choices"][0]["text"], "max_tokens": 0, "echo": True,
               "logprobs": 1})
lp = sc["choices"][0]["logprobs"]["token_logprobs"]
n_prompt = gen["usage"]["prompt_tokens"]
print("first token null:", lp[0] is None, "| scored", len(lp), "tokens for", n_prompt, "+", len(gen_lp))
if len(lp) == n_prompt + len(gen_lp):
    tail = lp[-len(gen_lp):]
    print("max |generated - rescored| logprob:", max(abs(a - b) for a, b in zip(tail, gen_lp)))
st, pl = post({"model": MODEL, "prompt": prompt + [1500] * 8, "max_tokens": 1, "prompt_logprobs": 3})
print("prompt_logprobs", st, len(pl["choices"][0]["prompt_logprobs"]) if st == 200 else pl)
for length, k, conc in ((2000, 0, 1), (2000, 5, 1), (4000, 1, 1), (2000, 1, 8)):
    body = {"model": MODEL, "prompt": [(7 * i) % 30000 + 100 for i in range(length)], "max_tokens": 0,
            "prompt_logprobs": k}
    t0 = time.time()
    ths = [threading.Thread(target=post, args=(body,)) for _ in range(conc)]
    [t.start() for t in ths]
    [t.join() for t in ths]
    dt = time.time() - t0
    print(f"score {conc} x {length} tokens, k={k}: {dt:.2f} s, {conc * length / dt:.0f} prompt tok/s")
t0 = time.time()
post({"model": MODEL, "prompt": [(11 * i) % 30000 + 100 for i in range(2000)], "max_tokens": 1})
print(f"a 2000-token prompt not cached, without scoring (prefill + 1 token): {time.time() - t0:.2f} s")
c = http.client.HTTPConnection("127.0.0.1", PORT)
c.request("GET", "/metrics")
m = c.getresponse().read().decode()
print([l for l in m.splitlines() if l.startswith("pagoda_kv_blocks_in_use") or 'reason="not_read"' in l])
