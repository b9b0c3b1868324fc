#!/usr/bin/env bash
# Two HTTP measurements on the H200 in one device call, both through `pagoda serve` with an
# independent client, on the Llama-3-8B shape (random bf16 weights, fp8 KV, the Llama 3 tokenizer):
#   1. the throughput cost of structured outputs at concurrency 64 (issue #25): `pagoda bench serve`
#      with and without a grammar that never ends early (rows with a grammar are masked and sampled
#      on the host, so their logits cross PCIe);
#   2. the router smoke test (issue #24): two replicas sharing the GPU (4 GiB of KV each) behind `pagoda route`, the
#      multi-turn chat workload of bench/router/multi_turn.py under round-robin and kv-aware (fresh
#      replicas for each policy, so both start from cold caches).
#
#   BUILD_DIR=build-cuda tools/gpu/serve_measure_call.sh bundle   # here: .device/serve/bundle.tar.gz
#   run(command="tools/gpu/serve_measure_call.sh run", carry=[".device/serve"], timeout_s=480)
#   (PARTS=structured: the first measurement only)
# Results: $OUT/structured.csv, $OUT/router.csv, $OUT/logs.tar.gz.
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
dir=$here/.device/serve
build=${BUILD_DIR:-$here/build}

if [ "${1:-}" = bundle ]; then
  set -e
  rm -rf "$dir" && mkdir -p "$dir"
  bash "$here/scripts/device-bundle.sh" "$dir/bundle" "$build/pagoda"
  model=$dir/bundle/llama3-8b-random
  mkdir -p "$model"
  cp "$here/tools/gpu_backend/llama3_8b_config.json" "$model/config.json"
  cp "$here/.cache/npm/llama3/package/models/tokenizer.json" "$here/.cache/npm/llama3/package/models/tokenizer_config.json" "$model/"
  git -C "$here" rev-parse --short HEAD > "$dir/bundle/commit"
  tar czf "$dir/bundle.tar.gz" -C "$dir" bundle
  rm -rf "$dir/bundle"
  ls -la "$dir"
  exit 0
fi

[ "${1:-}" = run ] || { echo "usage: $0 bundle|run" >&2; exit 2; }
bundle=$dir/bundle
[ -x "$bundle/run.sh" ] || tar xzf "$dir/bundle.tar.gz" -C "$dir"
out=${OUT:-/tmp/serve-measure}
logs=$out/logs
mkdir -p "$logs"
model=$bundle/llama3-8b-random
pids=()
echo "date: $(date -u +%Y-%m-%dT%H:%MZ)  commit: $(cat "$bundle/commit")"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader

wait_health() {  # wait_health PORT
  for _ in $(seq 600); do
    python3 -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$1/health', timeout=1)" \
      2>/dev/null && return 0
    sleep 0.2
  done
  echo "nothing healthy on port $1" >&2
  return 1
}
serve() {  # serve PORT LOG FLAGS...
  local port=$1 log=$2; shift 2
  "$bundle/run.sh" pagoda serve --model "$model" --load-format random --device cuda --kv-cache-dtype fp8 \
    --port "$port" "$@" > "$logs/$log" 2>&1 &
  pids+=($!)
}
stop_all() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  pids=()
}
trap stop_all EXIT

# 1. Structured outputs at concurrency 64: plain, grammar, plain again (drift check).
t0=$(date +%s)
serve 18800 serve_structured.log --max-num-seqs 256
if wait_health 18800; then
  echo "serve up after $(( $(date +%s) - t0 )) s"
  bench=(pagoda bench serve --url http://127.0.0.1:18800 --concurrency 64 --requests 256 --prompt-tokens 128
         --output-tokens 256 --csv "$out/structured.csv" --no-progress)
  "$bundle/run.sh" "${bench[@]}" --label plain
  "$bundle/run.sh" "${bench[@]}" --label 'guided_regex [a-z ,.]*' --extra-body '{"guided_regex": "[a-z ,.]*"}'
  "$bundle/run.sh" "${bench[@]}" --label 'plain again'
fi
stop_all
grep -iE "sampler|host" "$logs/serve_structured.log" | tail -5

[ "${PARTS:-all}" = structured ] && exit 0

# 2. Router smoke: two replicas on the one GPU, each with a KV pool of 4 GiB, which holds about the
#    workload's half that kv-aware sends it but not all of it (round-robin sends every replica every
#    conversation), as a cluster whose cache is the scarce resource.
for policy in round-robin kv-aware; do
  t0=$(date +%s)
  serve 18801 "replica1_$policy.log" --kv-cache-memory 4GiB --max-queued 256
  serve 18802 "replica2_$policy.log" --kv-cache-memory 4GiB --max-queued 256
  wait_health 18801 && wait_health 18802 || { tail -20 "$logs/replica1_$policy.log" "$logs/replica2_$policy.log"; exit 1; }
  "$bundle/run.sh" pagoda route --model "$model" --policy "$policy" --port 18810 \
    --backend http://127.0.0.1:18801 --backend http://127.0.0.1:18802 > "$logs/route_$policy.log" 2>&1 &
  pids+=($!)
  wait_health 18810 || { tail -20 "$logs/route_$policy.log"; exit 1; }
  echo "replicas + router up after $(( $(date +%s) - t0 )) s"
  sleep 1
  python3 "$here/bench/router/multi_turn.py" --url http://127.0.0.1:18810 --model llama3-8b-random \
    --conversations 64 --turns 5 --concurrency 16 --max-tokens 32 --context-chars 6000 \
    --label "h200 2 replicas $policy" --csv "$out/router.csv"
  python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:18810/metrics').read().decode())" \
    > "$logs/router_metrics_$policy.txt" 2>&1
  grep -E '^pagoda_router_(requests_total|retries_total|backend_healthy)' "$logs/router_metrics_$policy.txt" | head
  stop_all
done
tar czf "$out/logs.tar.gz" -C "$out" logs && rm -rf "$logs"
cat "$out/structured.csv" "$out/router.csv" 2>/dev/null
