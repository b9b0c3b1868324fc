#!/usr/bin/env bash
# Overlapped steps under a mixed HTTP load on the GPU (issue 23): `pagoda serve --device cuda` on the
# bundled model with --overlap-steps off, then with the default (auto: on over CUDA), then the default on a
# KV pool of 8 MiB (1,024 tokens; there the greedy and seeded requests run 300 tokens and all 96 arrive at
# once: preemption by recompute under overlap, which must show in pagoda_preemptions_total). Each server gets
#   1. eight greedy completions one at a time (batch 1: the token streams must be equal across the two);
#   2. a concurrent mix of 96 requests: greedy, seeded sampling, streams the client drops after three
#      chunks, stop strings, n = 2 with logprobs (host-sampled rows), json_object and json_schema chat,
#      max_tokens 1; every answer is checked (status, the object opened / the schema's value given, stop
#      string absent, two choices, logprobs present, one token), and afterwards the server must still answer and hold no KV block in use
#      (pagoda_kv_blocks_in_use 0 on /metrics: nothing leaked by dropped or late-stopped rows); with the
#      default, pagoda_engine_overlapped_steps_total must be above 0.
# Bundle: tests/e2e/run_cli_gpu_tests.sh bundle (-> .device/cli/bundle.tar.xz); copy this script there.
# Run (carry .device/cli): bash .device/cli/overlap_stress_call.sh
set -u
dir=$(cd "$(dirname "$0")" && pwd); root=$(cd "$dir/../.." && pwd); b=$dir/bundle
[ -x "$b/run.sh" ] || tar xJf "$dir/bundle.tar.xz" -C "$dir"
out=${OUT:-/tmp/overlap_stress}; mkdir -p "$out"
echo "commit $(cat "$b/commit") $(date -u +%T) $(nvidia-smi --query-gpu=name --format=csv,noheader)"
cat > "$out/stress.py" <<'PY'
import http.client, json, random, sys, threading, time
port, phase, result_file = int(sys.argv[1]), sys.argv[2], sys.argv[3]
def post(path, body, timeout=120):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse(); data = r.read(); c.close()
    return r.status, data
def get(path):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", path); r = c.getresponse(); data = r.read(); c.close()
    return r.status, data.decode()
model = json.loads(get("/v1/models")[1])["data"][0]["id"]
prompts = ["It is a truth universally acknowledged", "In the beginning God created", "She was the youngest",
           "The morning was fine and", "Mr. Darcy walked", "And the earth was without form",
           "Her mother had died", "They came to the house"]
failures = []
# Under pressure the greedy and seeded requests run 300 tokens past eos and arrive at once, so that their
# KV outgrows the small pool and the scheduler preempts (short requests finish too fast on a GPU).
long_run = "preempts" in sys.argv[4:]
gen = {"max_tokens": 300, "ignore_eos": True} if long_run else {"max_tokens": 64}
def fail(what): failures.append(what); print("FAIL", what, flush=True)
if phase == "sequential":
    texts = []
    for p in prompts:
        s, d = post("/v1/completions", {"model": model, "prompt": p, "max_tokens": 48, "temperature": 0})
        if s != 200: fail(f"sequential {p!r}: status {s}"); texts.append(None); continue
        texts.append(json.loads(d)["choices"][0]["text"])
    json.dump(texts, open(result_file, "w"))
    sys.exit(1 if failures else 0)
jobs = []
def greedy(i):
    s, d = post("/v1/completions", {"model": model, "prompt": prompts[i % 8], "temperature": 0, **gen})
    if s != 200: fail(f"greedy {i}: {s} {d[:200]}")
def seeded(i):
    s, d = post("/v1/completions", {"model": model, "prompt": prompts[i % 8], "temperature": 0.8, "top_p": 0.9,
                                     "seed": 7 + i, **gen})
    if s != 200: fail(f"seeded {i}: {s} {d[:200]}")
def dropped_stream(i):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("POST", "/v1/completions", json.dumps({"model": model, "prompt": prompts[i % 8], "max_tokens": 400,
              "temperature": 0, "stream": True, "ignore_eos": True}), {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200: fail(f"stream {i}: {r.status}"); return
    chunks = 0
    while chunks < 3:
        line = r.fp.readline()
        if not line: fail(f"stream {i}: ended after {chunks} chunks"); break
        if line.startswith(b"data: "): chunks += 1
    c.sock.close()  # the client walks away mid-generation
def stopped(i):
    stop = [" the", "."]
    s, d = post("/v1/completions", {"model": model, "prompt": prompts[i % 8], "max_tokens": 64, "temperature": 0,
                                     "stop": stop})
    if s != 200: fail(f"stop {i}: {s}"); return
    text = json.loads(d)["choices"][0]["text"]
    if any(x in text for x in stop): fail(f"stop {i}: stop string in {text!r}")
def two_with_logprobs(i):
    s, d = post("/v1/completions", {"model": model, "prompt": prompts[i % 8], "max_tokens": 24, "temperature": 0.7,
                                     "n": 2, "logprobs": 3})
    if s != 200: fail(f"n=2 {i}: {s} {d[:200]}"); return
    ch = json.loads(d)["choices"]
    if len(ch) != 2: fail(f"n=2 {i}: {len(ch)} choices")
    for c in ch:
        if not c.get("logprobs") or not c["logprobs"].get("top_logprobs"): fail(f"n=2 {i}: no logprobs")
def json_chat(i):
    # Even: json_object (the tiny model writes long strings, so these mostly end by length: the text must open
    # an object); odd: a schema of two strings, which always ends, and must give one of them.
    fmt = ({"type": "json_object"} if i % 2 == 0 else
           {"type": "json_schema", "json_schema": {"name": "answer", "schema": {"type": "string", "enum": ["yes", "no"]}}})
    s, d = post("/v1/chat/completions", {"model": model, "max_tokens": 48, "temperature": 0,
               "messages": [{"role": "user", "content": prompts[i % 8]}], "response_format": fmt})
    if s != 200: fail(f"json {i}: {s} {d[:200]}"); return
    body = json.loads(d); text = body["choices"][0]["message"]["content"]; done = body["choices"][0]["finish_reason"]
    if i % 2 == 0:
        if not text.lstrip().startswith("{"): fail(f"json_object {i}: {text!r}")
        if done == "stop":
            try: json.loads(text)
            except Exception: fail(f"json_object {i}: not json {text!r}")
    else:
        try: ok = done == "stop" and json.loads(text) in ("yes", "no")
        except Exception: ok = False
        if not ok: fail(f"json_schema {i}: {done} {text!r}")
def one_token(i):
    s, d = post("/v1/completions", {"model": model, "prompt": prompts[i % 8], "max_tokens": 1, "temperature": 0})
    if s != 200: fail(f"one {i}: {s}"); return
    if json.loads(d)["usage"]["completion_tokens"] != 1: fail(f"one {i}: {d[:200]}")
for f, n in [(greedy, 24), (seeded, 16), (dropped_stream, 16), (stopped, 12), (two_with_logprobs, 8),
             (json_chat, 8), (one_token, 12)]:
    jobs += [(f, i) for i in range(n)]
random.Random(1).shuffle(jobs)
t0 = time.time(); threads = []
for f, i in jobs:
    def run(f=f, i=i):
        try: f(i)
        except Exception as e: fail(f"{f.__name__} {i}: {e!r}")
    t = threading.Thread(target=run); t.start(); threads.append(t)
    if not long_run: time.sleep(0.01)
for t in threads: t.join()
print(f"{len(jobs)} requests in {time.time() - t0:.1f} s, {len(failures)} failures", flush=True)
in_use = None
for _ in range(50):  # the dropped streams are noticed at their next write; give the engine a moment
    m = get("/metrics")[1]
    in_use = [float(l.split()[-1]) for l in m.splitlines() if l.startswith("pagoda_kv_blocks_in_use")]
    if in_use and in_use[0] == 0: break
    time.sleep(0.2)
print("pagoda_kv_blocks_in_use", in_use,
      [l for l in m.splitlines() if l.startswith(("pagoda_client_disconnects_total", "pagoda_engine_", "pagoda_preemptions_total"))])
overlapped = [float(l.split()[-1]) for l in m.splitlines() if l.startswith("pagoda_engine_overlapped_steps_total")]
if sys.argv[4:5] == ["overlapped"] and not (overlapped and overlapped[0] > 0): fail(f"no overlapped steps: {overlapped}")
preempted = [float(l.split()[-1]) for l in m.splitlines() if l.startswith("pagoda_preemptions_total")]
if sys.argv[5:6] == ["preempts"] and not (preempted and preempted[0] > 0): fail(f"no preemptions: {preempted}")
if not in_use or in_use[0] != 0: fail(f"blocks still in use: {in_use}")
if get("/health")[0] != 200: fail("health")
sys.exit(1 if failures else 0)
PY
rc_all=0
for ov in off default pressure; do
  args=(); [ "$ov" = off ] && args=(--overlap-steps off)
  [ "$ov" = pressure ] && args=(--kv-cache-memory 8MiB)
  "$b/run.sh" pagoda serve --model "$root/models/pagoda-tiny" --device cuda --host 127.0.0.1 --port 0 "${args[@]}" \
    > "$out/serve_$ov.log" 2>&1 &
  pid=$!; port=""
  for _ in $(seq 1 60); do
    port=$(grep -oP 'listening on http://[0-9.]+:\K[0-9]+' "$out/serve_$ov.log" | head -1)
    [ -n "$port" ] && python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/health', timeout=1)" 2>/dev/null && break
    sleep 1
  done
  grep -E "engine steps" "$out/serve_$ov.log" | head -2
  timeout 120 python3 "$out/stress.py" "$port" sequential "$out/seq_$ov.json"; r1=$?
  expect=""; [ "$ov" = default ] && expect=overlapped; [ "$ov" = pressure ] && expect="overlapped preempts"
  timeout 240 python3 "$out/stress.py" "$port" mixed "$out/mixed_$ov.json" $expect; r2=$?
  kill -0 $pid 2>/dev/null || { echo "server ($ov) died"; rc_all=1; }
  kill $pid; wait $pid 2>/dev/null
  echo "== overlap $ov: sequential rc=$r1 mixed rc=$r2"
  [ $r1 = 0 ] && [ $r2 = 0 ] || rc_all=1
done
if cmp -s "$out/seq_off.json" "$out/seq_default.json"; then echo "sequential greedy texts: equal"
else echo "sequential greedy texts: DIFFER"; rc_all=1; fi
exit $rc_all
