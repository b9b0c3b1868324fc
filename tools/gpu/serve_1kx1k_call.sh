#!/usr/bin/env bash
# 1,000 x 1,000 in / 1,000 out, all at once, through pagoda serve + pagoda bench serve (issue 23's goal).
# Usage: DEST=.device/X tools/gpu/serve_measure_call.sh bundle; cp tools/gpu/serve_1kx1k_call.sh .device/X/;
#   run(command="PARTS=fp8 bash .device/X/serve_1kx1k_call.sh", carry=[".device/X"]). PARTS=fp8 skips the bf16 run;
#   SEQS (default 384) is --max-num-seqs; BENCH_LIMIT caps the client (s).
set -u
dir=$(cd "$(dirname "$0")" && pwd); b=$dir/bundle
[ -x "$b/run.sh" ] || tar xzf "$dir/bundle.tar.gz" -C "$dir"
out=${OUT:-/tmp/tput}; mkdir -p "$out"
echo "commit $(cat $b/commit) $(date -u +%T)"; nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
run() {  # label, serve flags...
  local label=$1; shift; local t0=$(date +%s)
  "$b/run.sh" pagoda serve --model "$b/llama3-8b-random" --load-format random --device cuda --host 127.0.0.1 --port 0 --max-queued 1024 "$@" > "$out/serve_$label.log" 2>&1 &
  local pid=$! port=""
  for i in $(seq 1 120); do port=$(grep -oP 'listening on http://[0-9.]+:\K[0-9]+' "$out/serve_$label.log" | head -1); [ -n "$port" ] && python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/health', timeout=1)" 2>/dev/null && break; sleep 1; done
  echo "$label: serve up after $(( $(date +%s) - t0 )) s on port $port"
  timeout ${BENCH_LIMIT:-150} "$b/run.sh" pagoda bench serve --url "http://127.0.0.1:$port" --concurrency 1000 --requests 1000 --prompt-tokens 1000 --output-tokens 1000 --token-high 120000 --warmup 1 --label "$label" --csv "$out/tput.csv" --no-progress 2>&1 | tail -12
  kill $pid; wait $pid 2>/dev/null
  grep -iE "error|step time|preempt" "$out/serve_$label.log" | tail -3
}
run fp8w_fp8kv --quantization fp8 --kv-cache-dtype fp8 --max-num-seqs ${SEQS:-384}
[ "${PARTS:-all}" = fp8 ] || run bf16w_bf16kv --kv-cache-dtype bf16 --max-num-seqs ${SEQS:-384}
cat "$out/tput.csv"
