#!/usr/bin/env bash
# Token eviction on the H200 (issue #21): the GPU eviction tests, then the long-context decode goal
# (Llama-3-8B shape, random weights, fp8 KV, 32K prompts, budget 2K), measured two ways:
#   (a) equal batch: 16 requests, full cache vs streaming / snapkv / h2o (add none-detached:16 for the
#       full cache with the score hook detached: eviction off must cost nothing);
#   (b) equal KV memory: the full cache at the most 32K sequences the pool holds ("fit") vs streaming /
#       snapkv at 512 / 256 requests (what compute and the call's time allow; the pool would hold more).
# h2o scores every prompt query too (a scoring pass over the whole 32K prefill), so it runs last.
# Every request sends one shared prompt, computed once by an untimed warm-up, so that a run's prefill
# is short (decode-only tok/s is what is compared). Pack first, on the build machine:
#   d=/work/main/.device/evict4 && mkdir -p $d &&
#   scripts/device-bundle.sh $d/bundle build-cuda/tests/gpu_backend/cuda_kv_eviction_tests \
#     build-cuda/bench/gpu/pagoda_gpu_engine_bench && strip $d/bundle/bin/* &&
#   (cd $d && tar cJf bundle.tar.xz bundle && rm -rf bundle) &&
#   cp tools/gpu/evict_call.sh tools/gpu/llama3_8b_40k_config.json $d/
# then run `bash .device/evict4/evict_call.sh` with carry [".device/evict4"] (about 3 minutes).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
[ -x "$here/bundle/run.sh" ] || tar xJf "$here/bundle.tar.xz" -C "$here"
root=$(cd "$here/../.." && pwd)
export PAGODA_SOURCE_DIR=$root
out=${OUT:-/tmp/evict}
mkdir -p "$out"
nvidia-smi --query-gpu=name,clocks.sm,memory.used --format=csv,noheader
echo "== cuda_kv_eviction_tests"
timeout 60 "$here/bundle/run.sh" cuda_kv_eviction_tests 2>&1 | grep -vE "^\[       OK|^\[ RUN" | tee "$out/tests.log" | tail -40
grep -E "^\[select\]" "$out/tests.log"
echo "== evict bench"
timeout "${EVICT_SECONDS:-125}" "$here/bundle/run.sh" pagoda_gpu_engine_bench --config "$here/llama3_8b_40k_config.json" \
  --workload evict --kv-cache-dtype fp8 --input-len 32768 --output-len 256 --max-num-seqs 512 \
  --max-tokens-per-step 16384 --gpu-memory-utilization 0.8 --kv-budget 2048 --evict-shared-prompt \
  --evict-runs "${EVICT_RUNS:-none:16,streaming:16,snapkv:16,none:fit,streaming:512,snapkv:256,h2o:16}" \
  --max-seconds "${EVICT_RUN_SECONDS:-22}" --json "$out/evict_bench.json" 2>&1 | tee "$out/bench.log" | grep -vE "^request [0-9]+ failed" | tail -60
echo "rc=$?"
