#!/usr/bin/env bash
# Issue 23 (helper tput12): cuBLASLt autotuning for large m (prefill / mixed steps; LtLargeRowTuner in
# backend/cuda/cublaslt_plan.h, PAGODA_GEMM_AUTOTUNE_LARGE=0 turns it off), checked and measured in one
# device call of <= 300 s (parts past BUDGET are skipped and say so):
#  1. cuda_ops_tests: Fp8GemmLargeM.* (tuned == first heuristic within the fp8 GEMM bound, both against a CPU
#     sum on sampled rows; a bucket's algorithm reused at other m), the fp8 and bf16 GEMM tests;
#  2. the micro-benchmark Fp8GemmLargeMSpeed.* (first heuristic vs tuned, qkv / o / gate_up / down of the 8B
#     shape at m = 1K / 4K / 8K / 16K and 7,900 / 15,755 reusing a bucket; median CUDA-event times);
#  3. the engine's 1,000 x 1,000 (Llama-3-8B shape, random weights, fp8 weights + fp8 KV, greedy,
#     --max-num-seqs 512 --max-tokens-per-step 16384, as fuse4's call: 15,117 output tok/s at main 7f075c2)
#     with the large-m tuning on (PAGODA_GEMM_TUNE_LOG=1: a line per tuning), then off.
#   BUILD_DIR=build DEST=/work/main/.device/tput12 tools/gpu/tput12_call.sh bundle
#   run(command="bash .device/tput12/run.sh", carry=[".device/tput12"], timeout_s=320)
set -uo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)

if [ "${1:-}" = bundle ]; then
  set -e
  build=${BUILD_DIR:-$src/build}
  dir=${DEST:-$src/.device/tput12}
  rm -rf "$dir" && mkdir -p "$dir"
  bash "$src/scripts/device-bundle.sh" "$dir/bundle" "$build/tests/gpu_backend/cuda_ops_tests" \
    "$build/bench/gpu/pagoda_gpu_engine_bench"
  strip "$dir/bundle/bin/"* || true
  cp "$src/tools/gpu_backend/llama3_8b_config.json" "$dir/bundle/"
  git -C "$src" rev-parse --short HEAD > "$dir/bundle/commit"
  tar cJf "$dir/bundle.tar.xz" -C "$dir" bundle
  rm -rf "$dir/bundle"
  cp "$0" "$dir/tput12_call.sh"
  printf '#!/usr/bin/env bash\nexec bash "$(dirname "$0")/tput12_call.sh" run "$@"\n' > "$dir/run.sh"
  ls -la "$dir"
  exit 0
fi

[ "${1:-}" = run ] || { echo "usage: $0 bundle|run" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
[ -x "$here/bundle/run.sh" ] || tar xJf "$here/bundle.tar.xz" -C "$here"
out=${OUT:-/tmp/tput12_call}; mkdir -p "$out"
export PAGODA_SOURCE_DIR=$root
cd "$root"
start=$SECONDS budget=${BUDGET:-295}
left() { echo $((budget - (SECONDS - start))); }
B="$here/bundle/run.sh"
echo "== binaries of $(cat "$here/bundle/commit"); $(date -u +%FT%TZ); $(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader)"

timeout 60 "$B" cuda_ops_tests --gtest_filter='Fp8GemmLargeM.*:*/Fp8GemmTest.*:Fp8ScaleModeTest.*:*/GemmTest.*' \
  > "$out/gemm_tests.log" 2>&1
echo "== GEMM tests exit $? ($((SECONDS - start)) s)"
grep -E "^\[  (PASSED|FAILED)|FAILED|Failure|Expected|Which is|fp8-gemm-tune" "$out/gemm_tests.log" | head -30

timeout 60 "$B" cuda_ops_tests --gtest_filter='Fp8GemmLargeMSpeed.*' > "$out/gemm_bench.log" 2>&1
echo "== micro-benchmark exit $? ($((SECONDS - start)) s)"
grep -E "fp8-gemm-large|FAILED|Failure" "$out/gemm_bench.log"

FP8=(--kv-cache-dtype fp8 --quantization fp8)
engine() {  # engine LABEL LARGE(0|1) NEED: the 1,000 x 1,000 (~75 s)
  local label=$1 large=$2 need=$3
  [ "$(left)" -lt "$need" ] && { echo "== engine $label skipped (time: $(left) s left)"; return; }
  local t0=$SECONDS
  PAGODA_GEMM_AUTOTUNE_LARGE=$large PAGODA_GEMM_TUNE_LOG=1 timeout $(($(left) - 2)) "$B" pagoda_gpu_engine_bench \
    --config "$here/bundle/llama3_8b_config.json" --workload random --sampling greedy --num-requests 1000 \
    --input-len 1000 --output-len 1000 "${FP8[@]}" --max-num-seqs 512 --max-tokens-per-step 16384 \
    --max-seconds 100 --json "$out/engine_$label.json" > "$out/engine_$label.log" 2>&1
  echo "== engine 1,000 x 1,000 $label (PAGODA_GEMM_AUTOTUNE_LARGE=$large) exit $? ($((SECONDS - t0)) s)"
  grep -E "^engine|step time|\] (prefill-carrying|decode-only steps)|error" "$out/engine_$label.log" | sed 's/^/  /'
  echo "  tunings: $(grep -c '^gemm-tune' "$out/engine_$label.log"), $(grep '^gemm-tune' "$out/engine_$label.log" |
    grep -oE '[0-9.]+ ms' | awk '{s += $1} END {printf "%.0f ms", s}') in all"
  grep '^gemm-tune' "$out/engine_$label.log" | head -16 | sed 's/^/  /'
}
engine tuned 1 85
engine untuned 0 80
echo "done ($((SECONDS - start)) s)"
