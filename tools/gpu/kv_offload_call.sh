#!/usr/bin/env bash
# The host KV tier on the H200 (issue #18), in one device call:
#   1. cuda_host_tier_tests: pinned-pool transfers byte-exact per KV dtype, a host hit and swap
#      through the engine on a fixture model;
#   2. `pagoda serve --device cuda --kv-offload-memory`: the start-up report's tier line;
#   3. pagoda_kv_offload_bench on the Llama-3-8B shape (random weights, fp8 KV): transfer GB/s per
#      direction at 1 / 16 / 256 blocks of ~2 MB, the multi-turn workload with its working set 3x the
#      device pool with the host tier and without, swap vs recompute under pressure.
#
# Here:   tools/gpu/kv_offload_call.sh bundle [BUILD_DIR]   (default build-cuda) packs DEST (default
#         .device/hosttier; a helper's calls send the session's checkout, so DEST=<that checkout>/.device/hosttier)
# There:  run(command="bash .device/hosttier/kv_offload_call.sh run", carry=[".device/hosttier"])
# Results: $OUT/summary.txt and $OUT/kv_offload.json, logs in $OUT/logs.tar.gz.
# Environment there: BENCH_ARGS (extra bench flags), BENCH_LIMIT (seconds); BENCH2_ARGS: a second bench run
# (e.g. another workload size) into $OUT/kv_offload2.json within BENCH2_LIMIT; SKIP_TESTS=1 / SKIP_SERVE=1.
set -uo pipefail
case "${1:-}" in
bundle)
  set -e
  here=$(cd "$(dirname "$0")/../.." && pwd)
  build=${2:-$here/build-cuda}
  dest=${DEST:-$here/.device/hosttier}
  ninja -C "$build" -j2 pagoda_cli pagoda_kv_offload_bench cuda_host_tier_tests
  rm -rf "$dest" && mkdir -p "$dest"
  stage=$(mktemp -d)
  "$here/scripts/device-bundle.sh" "$stage/bundle" "$build/pagoda" "$build/bench/gpu/pagoda_kv_offload_bench" \
    "$build/tests/gpu_backend/cuda_host_tier_tests"
  strip "$stage"/bundle/bin/* || true
  git -C "$here" rev-parse --short HEAD > "$stage/bundle/commit"
  tar cJf "$dest/bundle.tar.xz" -C "$stage" bundle
  cp "$0" "$dest/kv_offload_call.sh"
  rm -rf "$stage"
  ls -la "$dest"
  ;;
run)
  dir=$(cd "$(dirname "$0")" && pwd)
  tar xJf "$dir/bundle.tar.xz" -C /tmp
  bundle=/tmp/bundle
  export PAGODA_SOURCE_DIR=$PWD
  out=${OUT:-/tmp/kv_offload}
  mkdir -p "$out/logs"
  {
    echo "date: $(date -u +%Y-%m-%dT%H:%MZ)  commit: $(cat "$bundle/commit")"
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
    free -g | head -2
  } | tee "$out/summary.txt"
  if [ -z "${SKIP_TESTS:-}" ]; then
  timeout 150 "$bundle/run.sh" cuda_host_tier_tests > "$out/logs/cuda_host_tier_tests.log" 2>&1
  echo "cuda_host_tier_tests: exit $? $(grep -E '^\[  (PASSED|FAILED)  \]' "$out/logs/cuda_host_tier_tests.log" | tr '\n' ' ')" \
    | tee -a "$out/summary.txt"
  grep -E "Failure|Expected|Which is|error|OK \]" "$out/logs/cuda_host_tier_tests.log" | head -30
  fi
  if [ -z "${SKIP_SERVE:-}" ]; then
  timeout 40 "$bundle/run.sh" pagoda serve --model tests/fixtures/models/llama_f32 --device cuda --kv-cache-memory 64MiB \
    --kv-offload-memory 256MiB --port 0 > "$out/logs/serve.log" 2>&1 &
  serve=$!
  for _ in $(seq 1 60); do grep -q "listening" "$out/logs/serve.log" && break; sleep 0.5; done
  kill $serve 2>/dev/null; wait $serve 2>/dev/null
  grep -E "KV tiers|preemption|error" "$out/logs/serve.log" | tee -a "$out/summary.txt"
  fi
  timeout ${BENCH_LIMIT:-200} "$bundle/run.sh" pagoda_kv_offload_bench --config tools/gpu_backend/llama3_8b_config.json \
    --json "$out/kv_offload.json" ${BENCH_ARGS:-} > "$out/logs/bench.log" 2>&1
  echo "bench: exit $?" | tee -a "$out/summary.txt"
  grep -vE "^\s*$" "$out/logs/bench.log" | tee -a "$out/summary.txt" | tail -40
  if [ -n "${BENCH2_ARGS:-}" ]; then
    timeout ${BENCH2_LIMIT:-200} "$bundle/run.sh" pagoda_kv_offload_bench --config tools/gpu_backend/llama3_8b_config.json \
      --json "$out/kv_offload2.json" $BENCH2_ARGS > "$out/logs/bench2.log" 2>&1
    echo "bench 2: exit $?" | tee -a "$out/summary.txt"
    grep -vE "^\s*$" "$out/logs/bench2.log" | tee -a "$out/summary.txt" | tail -30
  fi
  tar czf "$out/logs.tar.gz" -C "$out" logs
  rm -rf "$out/logs"
  ;;
*)
  echo "usage: $0 bundle [BUILD_DIR] | run" >&2
  exit 2
  ;;
esac
