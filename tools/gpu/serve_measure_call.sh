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
#   BUILD_DIR=build-cuda tools/gpu/serve_measure_call.sh bundle
#     packs DEST (default .device/serve; a helper's calls send the session's checkout, so
#     DEST=<that checkout>/.device/<name>) with the binary, the model folder and this script
#   run(command="bash .device/serve/serve_measure_call.sh run", carry=[".device/serve"], timeout_s=220)
#   PARTS=structured: the first measurement only; PARTS=router: the second only (fits one 220 s call).
# Every server listens on a port the kernel picks (--port 0) and the script reads it from the
# server's "listening on http://HOST:PORT" line, then waits for /health: no port is reused
# right after another process released it.
# Results: $OUT/structured.csv, $OUT/router.csv, $OUT/logs.tar.gz.
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD_DIR:-$here/build}

if [ "${1:-}" = bundle ]; then
  set -e
  dir=${DEST:-$here/.device/serve}
  rm -rf "$dir" && mkdir -p "$dir"
  bash "$here/scripts/device-bundle.sh" "$dir/bundle" "$build/pagoda"
  strip "$dir/bundle/bin/pagoda" || true
  model=$dir/bundle/llama3-8b-random
  mkdir -p "$model"
  cp "$here/tools/gpu_backend/llama3_8b_config.json" "$model/config.json"
  cp "$here/.cache/npm/llama3/package/models/tokenizer.json" "$here/.cache/npm/llama3/package/models/tokenizer_config.json" "$model/"
  cp "$here/bench/router/multi_turn.py" "$here/models/pagoda-tiny/heldout.txt" "$dir/bundle/"
  git -C "$here" rev-parse --short HEAD > "$dir/bundle/commit"
  tar czf "$dir/bundle.tar.gz" -C "$dir" bundle
  rm -rf "$dir/bundle"
  cp "$0" "$dir/serve_measure_call.sh"
  ls -la "$dir"
  exit 0
fi

[ "${1:-}" = run ] || { echo "usage: $0 bundle|run" >&2; exit 2; }
dir=$(cd "$(dirname "$0")" && pwd)  # the bundle sits beside this copy of the script
bundle=$dir/bundle
[ -x "$bundle/run.sh" ] || tar xzf "$dir/bundle.tar.gz" -C "$dir"
out=${OUT:-/tmp/serve-measure}
logs=$out/logs
mkdir -p "$logs"
# A local dry run on the CPU: MODEL=models/pagoda-tiny MODEL_NAME=pagoda-tiny MODEL_FLAGS= KV_MEMORY=64MiB
#   ROUTER_CONVERSATIONS=4 ROUTER_TURNS=2 CONTEXT_CHARS=1200 PARTS=router bash .device/serve/serve_measure_call.sh run
model=${MODEL:-$bundle/llama3-8b-random}
model_name=${MODEL_NAME:-llama3-8b-random}
model_flags=${MODEL_FLAGS---load-format random --device cuda --kv-cache-dtype fp8}
pids=()
echo "date: $(date -u +%Y-%m-%dT%H:%MZ)  commit: $(cat "$bundle/commit")"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader

# port_of LOG PID: the port from the process's "listening on http://HOST:PORT" line, once it is
# there (the process prints it when it accepts connections); fails if the process exits first.
port_of() {
  local p
  for _ in $(seq 900); do
    p=$(grep -o 'listening on http://[^ ]*' "$logs/$1" 2>/dev/null | head -1 | sed 's/.*://; s/[^0-9]//g')
    [ -n "$p" ] && { echo "$p"; return 0; }
    kill -0 "$2" 2>/dev/null || { echo "process of $1 exited" >&2; return 1; }
    sleep 0.2
  done
  echo "no port in $1" >&2
  return 1
}
wait_health() {  # wait_health PORT
  for _ in $(seq 300); do
    python3 -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$1/health', timeout=1)" \
      2>/dev/null && return 0
    sleep 0.2
  done
  echo "nothing healthy on port $1" >&2
  return 1
}
serve() {  # serve LOG FLAGS...: starts a replica on a free port; $! is its pid
  local log=$1; shift
  # shellcheck disable=SC2086
  "$bundle/run.sh" pagoda serve --model "$model" $model_flags --host 127.0.0.1 --port 0 "$@" > "$logs/$log" 2>&1 &
  pids+=($!)
}
stop_all() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  pids=()
}
trap stop_all EXIT

# 1. Structured outputs at concurrency 64: plain, grammar, plain again (drift check).
if [ "${PARTS:-all}" != router ]; then
t0=$(date +%s)
serve serve_structured.log --max-num-seqs 256
if sport=$(port_of serve_structured.log $!) && wait_health "$sport"; then
  echo "serve up after $(( $(date +%s) - t0 )) s"
  bench=(pagoda bench serve --url "http://127.0.0.1:$sport" --concurrency 64 --requests 256 --prompt-tokens 128
         --output-tokens 256 --csv "$out/structured.csv" --no-progress)
  "$bundle/run.sh" "${bench[@]}" --label plain
  "$bundle/run.sh" "${bench[@]}" --label 'guided_regex [a-z ,.]*' --extra-body '{"guided_regex": "[a-z ,.]*"}'
  "$bundle/run.sh" "${bench[@]}" --label 'plain again'
fi
stop_all
grep -iE "sampler|host" "$logs/serve_structured.log" | tail -5
fi

if [ "${PARTS:-all}" = structured ]; then
  tar czf "$out/logs.tar.gz" -C "$out" logs && rm -rf "$logs"
  exit 0
fi

# 2. Router smoke: two replicas on the one GPU, each with a KV pool of 4 GiB (fp8: about 65k tokens),
#    which holds the half of the workload that kv-aware sends it but not all of it (round-robin sends
#    every replica every conversation), as a cluster whose cache is the scarce resource.
#    48 conversations x 4 turns = 192 requests per policy.
for policy in round-robin kv-aware; do
  t0=$(date +%s)
  serve "replica1_$policy.log" --kv-cache-memory "${KV_MEMORY:-4GiB}" --max-queued 256
  pid1=$!
  serve "replica2_$policy.log" --kv-cache-memory "${KV_MEMORY:-4GiB}" --max-queued 256
  pid2=$!
  if ! { p1=$(port_of "replica1_$policy.log" $pid1) && p2=$(port_of "replica2_$policy.log" $pid2) &&
         wait_health "$p1" && wait_health "$p2"; }; then
    tail -20 "$logs/replica1_$policy.log" "$logs/replica2_$policy.log"
    exit 1
  fi
  "$bundle/run.sh" pagoda route --model "$model" --policy "$policy" --host 127.0.0.1 --port 0 \
    --backend "http://127.0.0.1:$p1" --backend "http://127.0.0.1:$p2" > "$logs/route_$policy.log" 2>&1 &
  pids+=($!)
  if ! { rport=$(port_of "route_$policy.log" $!) && wait_health "$rport"; }; then
    tail -20 "$logs/route_$policy.log"
    exit 1
  fi
  echo "replicas ($p1, $p2) + router ($rport) up after $(( $(date +%s) - t0 )) s"
  sleep 1
  timeout 75 python3 "$bundle/multi_turn.py" --url "http://127.0.0.1:$rport" --model "$model_name" \
    --text "$bundle/heldout.txt" --conversations "${ROUTER_CONVERSATIONS:-48}" --turns "${ROUTER_TURNS:-4}" \
    --concurrency 16 --max-tokens 32 \
    --context-chars "${CONTEXT_CHARS:-6000}" --timeout 60 --label "h200 2 replicas $policy" --csv "$out/router.csv"
  python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:$rport/metrics').read().decode())" \
    > "$logs/router_metrics_$policy.txt" 2>&1
  grep -E '^pagoda_router_(backend_requests_total|retries_total|backend_healthy|backend_tokenizer_match|prefix_match_tokens_sum|routed_prompt_tokens_total)' \
    "$logs/router_metrics_$policy.txt" | head -20
  stop_all
done
tar czf "$out/logs.tar.gz" -C "$out" logs && rm -rf "$logs"
cat "$out/structured.csv" "$out/router.csv" 2>/dev/null
