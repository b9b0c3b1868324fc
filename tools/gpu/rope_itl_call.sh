#!/usr/bin/env bash
# Issue 23, session 11: rope's heads spread over CTAs below 64 tokens (batch-1 decode), checked and
# timed: cuda_ops_tests (rope at 37 and 100 tokens, rope_qk, the fused fp8 quantization incl. the wide
# SiLU widths), then batch-1 ITL
# of the 8B shape (latency workload), fp8 + fp8 KV and bf16 + bf16 KV, each twice, interleaved.
# Bundle: DEST=/work/main/.device/<name> tools/gpu/rope_itl_call.sh bundle; run (carry .device/<name>):
#   BUDGET=150 bash .device/<name>/rope_itl_call.sh run
set -u
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tools/gpu/call_bundle.sh
. "$here/call_bundle.sh"
if [ "${1:-}" = bundle ]; then
  build=$(cd "$here/../.." && pwd)/build
  call_bundle_pack "$0" "$build/tests/gpu_backend/cuda_ops_tests" "$build/bench/gpu/pagoda_gpu_engine_bench"; exit
fi
call_bundle_unpack
start=$SECONDS; budget=${BUDGET:-150}
left() { echo $((budget - (SECONDS - start))); }
echo "== binaries of $(cat "$(dirname "$B")/commit"); $(date -u +%FT%TZ); $(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader)"
timeout 30 "$B" cuda_ops_tests --gtest_filter='CudaOps.Rope*:RopeQk*:FusedFp8Quant*:CudaOps.SiluMul*' > "$out/ops.log" 2>&1
echo "== cuda_ops_tests exit $? ($((SECONDS - start)) s)"
grep -E "^\[  (PASSED|FAILED)|FAILED|Failure|Expected|Which is" "$out/ops.log" | head -12
engine() {  # engine LABEL ARGS...
  local label=$1; shift
  local limit=22; [ "$(left)" -lt "$limit" ] && limit=$(left)
  [ "$limit" -lt 12 ] && { echo "== engine $label skipped (time)"; return; }
  timeout "$limit" "$B" pagoda_gpu_engine_bench --config tools/gpu_backend/llama3_8b_config.json --sampling greedy \
    --input-len 128 --output-len 128 --latency-tokens 128 --workload latency "$@" > "$out/engine_$label.log" 2>&1
  echo "== engine $label exit $? ($((SECONDS - start)) s): $(grep -oE 'batch-1: [0-9.]+ ms per token \(ITL p50\)' "$out/engine_$label.log") | $(grep -oE 'decode-only steps: [0-9]+, [0-9.]+ ms each' "$out/engine_$label.log")"
  grep -iE "error|invalid" "$out/engine_$label.log" | head -3
}
engine fp8_a --kv-cache-dtype fp8 --quantization fp8
engine bf16_a --kv-cache-dtype bf16
engine fp8_b --kv-cache-dtype fp8 --quantization fp8
engine bf16_b --kv-cache-dtype bf16
cd "$out" && tar czf logs.tar.gz ./*.log 2>/dev/null && rm -f ./*.log
echo "done ($((SECONDS - start)) s)"
