#!/usr/bin/env bash
# Token eviction's mass from the decode kernel, end to end (issue #21, branch evict9), one call of at
# most about 290 s:
#   1. KvEvictionModelGpu.*: CudaModel on a random model the fast attention takes (head_dim 128), bf16 /
#      fp8 KV, eager / graphs, h2o / snapkv / entropy / pyramidkv, the kernel-mass lane against the
#      scoring-pass lane (one "[kernel mass e2e]" line per case);
#   2. the 32K evict bench (Llama-3-8B shape, random weights, fp8 KV, 16 requests of one shared 32,768-token
#      prompt + 256 output tokens, budget 2,048): none / h2o / h2o-pass / snapkv / snapkv-pass, where
#      "-pass" turns the decode kernel's mass off (every scoring step runs the separate pass); each
#      "[evict]" line gives the decode-only step time and the run's scoring steps on either path;
#   3. the rest of cuda_kv_eviction_tests (the shared-helper refactor of the older tests).
# Pack first, on the build machine (binaries of this branch):
#   d=/work/main/.device/evict9 && rm -rf $d && mkdir -p $d &&
#   scripts/device-bundle.sh $d/bundle build/tests/gpu_backend/cuda_kv_eviction_tests \
#     build/bench/gpu/pagoda_gpu_engine_bench && strip $d/bundle/bin/* &&
#   (cd $d && tar cJf bundle.tar.xz bundle && rm -rf bundle) &&
#   cp tools/gpu/evict9_call.sh tools/gpu/llama3_8b_40k_config.json $d/ && git rev-parse --short HEAD > $d/commit
# then, from the repository root: run(command="bash .device/evict9/run.sh", carry=[".device/evict9"], timeout_s=300).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
[ -x "$here/bundle/run.sh" ] || tar xJf "$here/bundle.tar.xz" -C "$here"
root=$(cd "$here/../.." && pwd)
export PAGODA_SOURCE_DIR=$root
out=${OUT:-/tmp/evict9}
mkdir -p "$out"
echo "commit $(cat "$here/commit" 2>/dev/null)"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,memory.used --format=csv,noheader | tee "$out/gpu.txt"

echo "== 1. KvEvictionModelGpu (kernel mass end to end)"
start=$(date +%s)
timeout "${MODEL_TEST_SECONDS:-80}" "$here/bundle/run.sh" cuda_kv_eviction_tests --gtest_filter='KvEvictionModelGpu.*' \
  > "$out/model_test.log" 2>&1
echo "rc=$? ($(( $(date +%s) - start )) s)" | tee -a "$out/model_test.log"
grep -E "Failure|Expected|Which is|actual|^  [A-Za-z]|\.cpp:[0-9]+" "$out/model_test.log" | head -40

echo "== 2. evict bench (32K, fp8 KV, 8B shape)"
start=$(date +%s)
timeout "${BENCH_SECONDS:-125}" "$here/bundle/run.sh" pagoda_gpu_engine_bench --config "$here/llama3_8b_40k_config.json" \
  --workload evict --kv-cache-dtype fp8 --input-len 32768 --output-len 256 --max-num-seqs 512 \
  --max-tokens-per-step 16384 --gpu-memory-utilization 0.8 --kv-budget 2048 --evict-shared-prompt \
  --evict-runs "${EVICT_RUNS:-none:16,h2o:16,h2o-pass:16,snapkv:16,snapkv-pass:16}" \
  --max-seconds "${EVICT_RUN_SECONDS:-13}" --json "$out/evict_bench.json" > "$out/bench.log" 2>&1
echo "rc=$? ($(( $(date +%s) - start )) s)" | tee -a "$out/bench.log"
grep -vE "^request [0-9]+ failed|^\[evict\]" "$out/bench.log" | tail -8

echo "== 3. the rest of cuda_kv_eviction_tests"
start=$(date +%s)
timeout "${REST_SECONDS:-80}" "$here/bundle/run.sh" cuda_kv_eviction_tests --gtest_filter='-KvEvictionModelGpu.*' \
  > "$out/tests.log" 2>&1
echo "rc=$? ($(( $(date +%s) - start )) s)" | tee -a "$out/tests.log"
grep -E "Failure|\.cpp:[0-9]+" "$out/tests.log" | head -20

echo "== summary"
grep -E "^\[kernel mass e2e\]" "$out/model_test.log"
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]" "$out/model_test.log"
grep -E "^\[evict\]" "$out/bench.log"
grep -E "^\[engine\]|^\[graph scores\].*steps with|^\[kernel mass\] tensor cores|^\[kernel mass time\]" "$out/tests.log" | head -30
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]" "$out/tests.log"
