#!/usr/bin/env bash
# Issue 23 (helper fuse4): the fp8 GEMMs' per-token input quantization fused into the norms and the SiLU
# (add_rmsnorm_fp8, silu_mul_fp8; PAGODA_FUSE_FP8_QUANT=0 turns it off), checked and measured in one device
# call of <= 240 s (parts past BUDGET are skipped and say so):
#  1. cuda_ops_tests: FusedFp8Quant.* (fused == unfused bytes, vs the CPU), the norms, silu_mul, the fp8 GEMMs;
#  2. cuda_model_tests: the fp8 fixtures against the CPU reference (fused by default), fused == unfused logits
#     bit for bit (graph-replayed decode included), the CudaModel tests (all but DeepSeek's);
#  3. batch-1 ITL (latency workload, fp8 + fp8 KV), fused and unfused (the decode steps take the GEMV, whose
#     input stays bf16: only the 128-token prefill is fused, so equal ITL is expected);
#  4. the engine's 1,000 x 1,000 (Llama-3-8B shape, random weights, fp8 weights + fp8 KV, greedy,
#     --max-num-seqs 512 --max-tokens-per-step 16384, as tput2_call.sh's t16k): fused, then unfused (=0) if
#     80 s are left (else compare with tput2's 14,468 output tok/s at main 7776aa8).
# MERGED=1 (a merged tree's closing call): instead of 1-3, the whole cuda_ops_tests, cuda_model_tests (DeepSeek
# included: the automatic MLA decode kernel), cuda_kv_eviction_tests and mla_decode_gpu_tests side by side, then
# the engine runs of 4.
#   BUILD_DIR=build DEST=/work/main/.device/fuse4 tools/gpu/fuse4_call.sh bundle
#   run(command="bash .device/fuse4/run.sh", carry=[".device/fuse4"], timeout_s=300)
set -uo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)

if [ "${1:-}" = bundle ]; then
  set -e
  build=${BUILD_DIR:-$src/build}
  dir=${DEST:-$src/.device/fuse4}
  rm -rf "$dir" && mkdir -p "$dir"
  bash "$src/scripts/device-bundle.sh" "$dir/bundle" "$build/tests/gpu_backend/cuda_ops_tests" \
    "$build/tests/gpu_backend/cuda_model_tests" "$build/bench/gpu/pagoda_gpu_engine_bench" \
    "$build/tests/gpu_backend/cuda_kv_eviction_tests" "$build/tests/gpu/mla_decode_gpu_tests"
  strip "$dir/bundle/bin/"* || true
  cp "$src/tools/gpu_backend/llama3_8b_config.json" "$dir/bundle/"
  git -C "$src" rev-parse --short HEAD > "$dir/bundle/commit"
  tar cJf "$dir/bundle.tar.xz" -C "$dir" bundle
  rm -rf "$dir/bundle"
  cp "$0" "$dir/fuse4_call.sh"
  printf '#!/usr/bin/env bash\nexec bash "$(dirname "$0")/fuse4_call.sh" run "$@"\n' > "$dir/run.sh"
  ls -la "$dir"
  exit 0
fi

[ "${1:-}" = run ] || { echo "usage: $0 bundle|run" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
[ -x "$here/bundle/run.sh" ] || tar xJf "$here/bundle.tar.xz" -C "$here"
out=${OUT:-/tmp/fuse4_call}; mkdir -p "$out"
export PAGODA_SOURCE_DIR=$root
cd "$root"
start=$SECONDS budget=${BUDGET:-240}
left() { echo $((budget - (SECONDS - start))); }
B="$here/bundle/run.sh"
echo "== binaries of $(cat "$here/bundle/commit"); $(date -u +%FT%TZ); $(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader)"
FP8=(--kv-cache-dtype fp8 --quantization fp8)
engine() {  # engine LABEL FUSE(0|1) NEED: the 1,000 x 1,000 (~75 s)
  local label=$1 fuse=$2 need=$3
  [ "$(left)" -lt "$need" ] && { echo "== engine $label skipped (time: $(left) s left)"; return; }
  local t0=$SECONDS
  PAGODA_FUSE_FP8_QUANT=$fuse timeout $(($(left) - 2)) "$B" pagoda_gpu_engine_bench \
    --config "$here/bundle/llama3_8b_config.json" --workload random --sampling greedy --num-requests 1000 \
    --input-len 1000 --output-len 1000 "${FP8[@]}" --max-num-seqs 512 --max-tokens-per-step 16384 \
    --max-seconds 100 --json "$out/engine_$label.json" > "$out/engine_$label.log" 2>&1
  echo "== engine 1,000 x 1,000 $label (PAGODA_FUSE_FP8_QUANT=$fuse) exit $? ($((SECONDS - t0)) s)"
  grep -E "^engine|step time|\] (prefill-carrying|decode-only steps)|error" "$out/engine_$label.log" | sed 's/^/  /'
}
if [ "${MERGED:-0}" = 1 ]; then
  suite() {  # suite BINARY SECONDS [FILTER]: one whole gpu test binary, in the background
    timeout "$2" "$B" "$1" --gtest_filter="${3:-*}" > "$out/$1.log" 2>&1
    echo "== $1 exit $? ($((SECONDS - start)) s): $(grep -E '^\[  (PASSED|FAILED) ' "$out/$1.log" | tr '\n' ' ')"
    grep -E "^\[  FAILED  \] [A-Za-z]|Failure$" "$out/$1.log" | head -8
  }
  suite cuda_ops_tests 110 '*:-*Speed*' &
  suite cuda_model_tests 130 &
  suite cuda_kv_eviction_tests 110 &
  suite mla_decode_gpu_tests 110 &
  wait
  engine fused 1 85
  engine unfused 0 80
  echo "done ($((SECONDS - start)) s)"
  exit 0
fi
timeout 45 "$B" cuda_ops_tests \
  --gtest_filter='FusedFp8Quant.*:CudaOps.*RmsNorm*:CudaOps.SiluMul*:Fp8Gemm*:Fp8ScaleMode*:-Fp8GemmSpeed.*' \
  > "$out/ops.log" 2>&1
echo "== cuda_ops_tests exit $? ($((SECONDS - start)) s)"
grep -E "^\[  (PASSED|FAILED)|^\[       OK \] FusedFp8|FAILED|Failure|Expected|Which is" "$out/ops.log" | head -20
timeout 60 "$B" cuda_model_tests --gtest_filter='*Fp8*:CudaModel.*:-*Deepseek*' > "$out/model.log" 2>&1
echo "== cuda_model_tests exit $? ($((SECONDS - start)) s)"
grep -E "^\[  (PASSED|FAILED)|FAILED|Failure|Expected|Which is|\[ figure \]" "$out/model.log" | tail -24

itl() {  # itl LABEL FUSE(0|1): batch-1 ITL (~15 s)
  local label=$1 fuse=$2 limit=25
  [ "$(left)" -lt "$limit" ] && limit=$(left)
  [ "$limit" -lt 12 ] && { echo "== itl $label skipped (time: $(left) s left)"; return; }
  PAGODA_FUSE_FP8_QUANT=$fuse timeout "$limit" "$B" pagoda_gpu_engine_bench \
    --config "$here/bundle/llama3_8b_config.json" --sampling greedy --input-len 128 --output-len 128 \
    --latency-tokens 128 --workload latency "${FP8[@]}" > "$out/itl_$label.log" 2>&1
  echo "== itl $label (PAGODA_FUSE_FP8_QUANT=$fuse) exit $?: $(grep -oE 'batch-1: [0-9.]+ ms per token \(ITL p50\)' "$out/itl_$label.log") | $(grep -oE 'decode-only steps: [0-9]+, [0-9.]+ ms each' "$out/itl_$label.log" | head -1)"
  grep -iE "error|invalid" "$out/itl_$label.log" | head -3
}
itl fused 1
itl unfused 0
engine fused 1 85
engine unfused 0 80
echo "done ($((SECONDS - start)) s); compare engine fused with tput2's t16k at main 7776aa8: 14,468 output tok/s"
