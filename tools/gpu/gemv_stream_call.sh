#!/usr/bin/env bash
# Issue 23 (helper fp8w5): the streamed GEMV (gemv.h GemvKernel::kStreamed: persistent grid, cp.async
# weight pipeline) against the direct kernel: its gpu tests, GemvSpeed (both kernels and cuBLASLt per
# Llama-3-8B shape), then the engine's batch-1 ITL, bf16 and fp8 + fp8 KV, with the streamed and the direct
# kernel (PAGODA_GEMV_KERNEL) and PDL on and off (PAGODA_PDL), then the model tests.
# Needs .device/<name>/bundle.tar.xz (scripts/device-bundle.sh of cuda_ops_tests, cuda_model_tests and
# pagoda_gpu_engine_bench, plus bundle/commit) beside this script, copied there as call.sh:
#   run(command="bash .device/<name>/call.sh", carry=[".device/<name>"], timeout_s=220).
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${OUT:-/tmp/gemv_stream_call}; mkdir -p "$out"
tar xJf "$here/bundle.tar.xz" -C "$here"
export PAGODA_SOURCE_DIR=$root
cd "$root"
start=$SECONDS
budget=${BUDGET:-200}
left() { echo $((budget - (SECONDS - start))); }
B="$here/bundle/run.sh"
echo "== binaries of $(cat "$here/bundle/commit"); $(date -u +%FT%TZ); $(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader)"
timeout 40 "$B" cuda_ops_tests --gtest_filter='*Gemv*:-GemvSpeed.*' > "$out/ops.log" 2>&1
echo "== cuda_ops_tests exit $? ($((SECONDS - start)) s)"
grep -E "^\[  (PASSED|FAILED)|FAILED|Failure|Expected|Which is|Trace|kernel$" "$out/ops.log" | head -30
timeout 40 "$B" cuda_ops_tests --gtest_filter='GemvSpeed.*' > "$out/speed.log" 2>&1
echo "== GemvSpeed exit $? ($((SECONDS - start)) s)"
grep -E "gemv-speed" "$out/speed.log" | sed -E 's/ +/ /g'
engine() {  # engine LABEL LIMIT KERNEL PDL ARGS...
  local label=$1 limit=$2 kernel=$3 pdl=$4; shift 4
  [ "$(left)" -lt "$limit" ] && limit=$(left)
  [ "$limit" -lt 12 ] && { echo "== engine $label skipped (time)"; return; }
  PAGODA_GEMV_KERNEL=$kernel PAGODA_PDL=$pdl timeout "$limit" "$B" pagoda_gpu_engine_bench \
    --config tools/gpu_backend/llama3_8b_config.json --sampling greedy --input-len 128 --output-len 128 \
    --latency-tokens 128 --workload latency "$@" > "$out/engine_$label.log" 2>&1
  echo "== engine $label ($kernel, PAGODA_PDL=$pdl) exit $? ($((SECONDS - start)) s): $(grep -oE 'batch-1: [0-9.]+ ms per token \(ITL p50\)' "$out/engine_$label.log") | $(grep -E 'step time' "$out/engine_$label.log" | head -1)"
}
FP8=(--kv-cache-dtype fp8 --quantization fp8)
BF16=(--kv-cache-dtype bf16)
engine fp8_s1 25 streamed 1 "${FP8[@]}"
engine bf16_s1 25 streamed 1 "${BF16[@]}"
engine fp8_s0 25 streamed 0 "${FP8[@]}"
engine bf16_s0 25 streamed 0 "${BF16[@]}"
engine fp8_d1 25 direct 1 "${FP8[@]}"
engine bf16_d0 25 direct 0 "${BF16[@]}"
lim=55; [ "$(left)" -lt $lim ] && lim=$(left)
if [ "$lim" -ge 15 ]; then
  timeout "$lim" "$B" cuda_model_tests --gtest_filter='CudaModel.*:*Fp8*' > "$out/model.log" 2>&1
  echo "== cuda_model_tests exit $? ($((SECONDS - start)) s)"
  grep -E "^\[  (PASSED|FAILED)|FAILED|Failure|Expected|Which is|^\[ RUN" "$out/model.log" | tail -12
fi
engine fp8_s1b 25 streamed 1 "${FP8[@]}"
engine bf16_s0b 25 streamed 0 "${BF16[@]}"
engine bf16_s1b 25 streamed 1 "${BF16[@]}"
cd "$out" && tar czf logs.tar.gz *.log 2>/dev/null && rm -f engine_*.log
echo "done ($((SECONDS - start)) s)"
