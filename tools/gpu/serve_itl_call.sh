#!/usr/bin/env bash
# Batch-1 inter-token latency through `pagoda serve` (issue 23's goal is measured over HTTP): the Llama-3-8B
# shape with random weights, bf16 + bf16 KV and fp8 + fp8 KV, with PAGODA_PDL=1 (the default) and 0, each
# measured by `pagoda bench serve --concurrency 1` and by an independent stdlib-Python streaming client
# (the gaps between its SSE chunks, one token each).
# Bundle: DEST=/work/main/.device/<name> tools/gpu/serve_measure_call.sh bundle; cp this script there.
# Run (carry .device/<name>): bash .device/<name>/serve_itl_call.sh
set -u
dir=$(cd "$(dirname "$0")" && pwd); b=$dir/bundle
[ -x "$b/run.sh" ] || tar xzf "$dir/bundle.tar.gz" -C "$dir"
out=${OUT:-/tmp/serve_itl}; mkdir -p "$out"
echo "commit $(cat "$b/commit") $(date -u +%T)"; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
cat > "$out/client.py" <<'PY'
import http.client, json, statistics, sys, time
port, n = int(sys.argv[1]), int(sys.argv[2])
c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
c.request("GET", "/v1/models")
model = json.loads(c.getresponse().read())["data"][0]["id"]
c.close()
gaps = []
for r in range(n):
    body = json.dumps({"model": model, "prompt": [1000 + 7 * i + r for i in range(128)], "max_tokens": 256,
                       "stream": True, "ignore_eos": True, "temperature": 0})
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    resp = c.getresponse()
    assert resp.status == 200, resp.read()
    last = None; buf = b""
    while True:
        chunk = resp.read1(65536)
        if not chunk: break
        buf += chunk
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            if not event.startswith(b"data: ") or event == b"data: [DONE]": continue
            now = time.perf_counter()
            if last is not None and r > 0: gaps.append(now - last)  # request 0 is the warm-up
            last = now
    c.close()
gaps.sort()
print(f"python client: {len(gaps)} gaps, ITL p50 {1e3 * statistics.median(gaps):.2f} ms, "
      f"mean {1e3 * statistics.fmean(gaps):.2f} ms, p90 {1e3 * gaps[int(0.9 * len(gaps))]:.2f} ms")
PY
run() {  # label pdl serve-flags...
  local label=$1 pdl=$2; shift 2; local t0; t0=$(date +%s)
  PAGODA_PDL=$pdl "$b/run.sh" pagoda serve --model "$b/llama3-8b-random" --load-format random --device cuda \
    --host 127.0.0.1 --port 0 "$@" > "$out/serve_$label.log" 2>&1 &
  local pid=$! port=""
  for _ in $(seq 1 120); do
    port=$(grep -oP 'listening on http://[0-9.]+:\K[0-9]+' "$out/serve_$label.log" | head -1)
    [ -n "$port" ] && python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/health', timeout=1)" 2>/dev/null && break
    sleep 1
  done
  echo "== $label PDL=$pdl: serve up after $(( $(date +%s) - t0 )) s"
  timeout 60 "$b/run.sh" pagoda bench serve --url "http://127.0.0.1:$port" --concurrency 1 --requests 6 \
    --prompt-tokens 128 --output-tokens 256 --warmup 1 --label "$label" --csv "$out/itl.csv" --no-progress 2>&1 | tail -4
  timeout 60 python3 "$out/client.py" "$port" 5
  kill $pid; wait $pid 2>/dev/null
}
for pdl in 1 0; do
  run "bf16_pdl$pdl" $pdl --kv-cache-dtype bf16 --max-num-seqs 64
  run "fp8_pdl$pdl" $pdl --quantization fp8 --kv-cache-dtype fp8 --max-num-seqs 64
done
cat "$out/itl.csv"
cd "$out" && tar czf logs.tar.gz ./*.log && rm -f ./*.log
