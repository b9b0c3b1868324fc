#!/usr/bin/env bash
# Token eviction on the H200 (issue #21): the GPU eviction tests, then the long-context decode goal
# (Llama-3-8B shape, random weights, 16 requests of 32K prompt tokens, decode-only tok/s with the full
# cache vs streaming at a 2K budget). Pack first, on the build machine:
#   scripts/device-bundle.sh .device/evict/bundle build-cuda/tests/gpu_backend/cuda_kv_eviction_tests \
#     build-cuda/bench/gpu/pagoda_gpu_engine_bench && strip .device/evict/bundle/bin/* &&
#   (cd .device/evict && tar cJf bundle.tar.xz bundle && rm -rf bundle) &&
#   cp tools/gpu/evict_call.sh tools/gpu/llama3_8b_40k_config.json .device/evict/
# then run `bash .device/evict/evict_call.sh` with carry [".device/evict"] (about 3 minutes).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
[ -x "$here/bundle/run.sh" ] || tar xJf "$here/bundle.tar.xz" -C "$here"
root=$(cd "$here/../.." && pwd)
export PAGODA_SOURCE_DIR=$root
out=${OUT:-/tmp/evict2}
mkdir -p "$out"
nvidia-smi --query-gpu=name,clocks.sm,memory.used --format=csv,noheader
echo "== cuda_kv_eviction_tests"
timeout 45 "$here/bundle/run.sh" cuda_kv_eviction_tests 2>&1 | grep -vE "^\[       OK|^\[ RUN" | tail -25
echo "== evict bench"
timeout 155 "$here/bundle/run.sh" pagoda_gpu_engine_bench --config "$here/llama3_8b_40k_config.json" --workload evict \
  --num-requests "${EVICT_REQUESTS:-16}" --input-len 32768 --output-len 256 --max-num-seqs 16 --max-tokens-per-step 16384 \
  --kv-compression streaming --kv-budget 2048 --max-seconds 70 --json "$out/evict_bench.json" 2>&1 | tail -12
echo "rc=$?"
