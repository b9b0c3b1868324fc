#!/usr/bin/env bash
# Issue 23, session 18: the L2 prefetch of the o / gate_up weights during the attention (l2_prefetch.h),
# checked and timed: cuda_ops_tests L2Prefetch* (contract; a GEMV over prefetched weights vs cold),
# cuda_model_tests (the model's logits with the prefetch on = off, bit for bit; the GEMV dispatch), then
# batch-1 ITL of the 8B shape (latency workload) over PAGODA_L2_PREFETCH_MB, bf16 + bf16 KV and
# fp8 + fp8 KV, interleaved, the 0 MiB runs first and last.
# Bundle: DEST=/work/main/.device/<name> tools/gpu/l2_prefetch_call.sh bundle; run (carry .device/<name>):
#   BUDGET=300 bash .device/<name>/l2_prefetch_call.sh run
set -u
here=$(cd "$(dirname "$0")" && pwd)
if [ "${1:-}" = bundle ]; then
  root=$(cd "$here/../.." && pwd); dest=${DEST:?DEST=/work/main/.device/NAME}
  rm -rf "$dest" && mkdir -p "$dest"
  "$root/scripts/device-bundle.sh" "$dest/bundle" "$root/build/tests/gpu_backend/cuda_ops_tests" \
    "$root/build/tests/gpu_backend/cuda_model_tests" "$root/build/bench/gpu/pagoda_gpu_engine_bench" >/dev/null
  git -C "$root" rev-parse --short HEAD > "$dest/bundle/commit"
  tar cJf "$dest/bundle.tar.xz" -C "$dest" bundle && rm -rf "$dest/bundle"
  cp "$0" "$dest/" && du -sh "$dest" && exit 0
fi
root=$(cd "$here/../.." && pwd)
out=${OUT:-/tmp/l2_prefetch_call}; mkdir -p "$out"
tar xJf "$here/bundle.tar.xz" -C "$here"
export PAGODA_SOURCE_DIR=$root
cd "$root"
start=$SECONDS; budget=${BUDGET:-300}
left() { echo $((budget - (SECONDS - start))); }
B="$here/bundle/run.sh"
echo "== binaries of $(cat "$here/bundle/commit"); $(date -u +%FT%TZ); $(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader)"
timeout 40 "$B" cuda_ops_tests --gtest_filter='L2Prefetch*' > "$out/ops.log" 2>&1
echo "== cuda_ops_tests exit $? ($((SECONDS - start)) s)"
grep -E "^\[  (PASSED|FAILED)|FAILED|Failure|Expected|Which is|figure" "$out/ops.log" | head -12
timeout 60 "$B" cuda_model_tests --gtest_filter='CudaModel.L2Prefetch*:CudaModel.Gemv*:CudaModel.Fp8LmHead*' > "$out/model.log" 2>&1
echo "== cuda_model_tests exit $? ($((SECONDS - start)) s)"
grep -E "^\[  (PASSED|FAILED)|FAILED|Failure|Expected|Which is" "$out/model.log" | head -12
engine() {  # engine LABEL MB ARGS...
  local label=$1 mb=$2; shift 2
  local limit=25; [ "$(left)" -lt "$limit" ] && limit=$(left)
  [ "$limit" -lt 12 ] && { echo "== engine $label skipped (time)"; return; }
  PAGODA_L2_PREFETCH_MB=$mb timeout "$limit" "$B" pagoda_gpu_engine_bench --config tools/gpu_backend/llama3_8b_config.json \
    --sampling greedy --input-len 128 --output-len 128 --latency-tokens 128 --workload latency "$@" > "$out/engine_$label.log" 2>&1
  echo "== engine $label (${mb} MiB) exit $? ($((SECONDS - start)) s): $(grep -oE 'batch-1: [0-9.]+ ms per token \(ITL p50\)' "$out/engine_$label.log") | $(grep -oE 'decode-only steps: [0-9]+, [0-9.]+ ms each' "$out/engine_$label.log")"
  grep -iE "error|invalid" "$out/engine_$label.log" | head -3
}
bf16=(--kv-cache-dtype bf16); fp8=(--kv-cache-dtype fp8 --quantization fp8)
for mb in ${SWEEP_MB:-0 16 32 48 0}; do
  engine "bf16_$mb" "$mb" "${bf16[@]}"
  engine "fp8_$mb" "$mb" "${fp8[@]}"
done
export PAGODA_L2_PREFETCH_MODE=lines
engine bf16_lines32 32 "${bf16[@]}"
engine fp8_lines32 32 "${fp8[@]}"
unset PAGODA_L2_PREFETCH_MODE
cd "$out" && tar czf logs.tar.gz ./*.log 2>/dev/null && rm -f ./*.log
echo "done ($((SECONDS - start)) s)"
