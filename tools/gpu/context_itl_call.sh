#!/usr/bin/env bash
# Issue 23: batch-1 decode of the Llama-3-8B shape by context (128 / 4K / 32K tokens; fp8 + fp8 KV and
# bf16 + bf16 KV), after the GPU tests of the split-K decode path (paged and quantized attention, the
# fast attention's graphs, eviction holes, the model suite). With BASE=<dir of another call_bundle of
# pagoda_gpu_engine_bench> the same runs alternate between that bundle and this one (an A/B).
# Bundle: DEST=/work/main/.device/<name> tools/gpu/context_itl_call.sh bundle; run (carry .device/<name>):
#   [BASE=.device/<old>] BUDGET=300 bash .device/<name>/context_itl_call.sh run
set -u
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tools/gpu/call_bundle.sh
. "$here/call_bundle.sh"
if [ "${1:-}" = bundle ]; then
  build=$(cd "$here/../.." && pwd)/build
  call_bundle_pack "$0" "$build/bench/gpu/pagoda_gpu_engine_bench" "$build/tests/gpu/paged_attention_gpu_tests" \
    "$build/tests/gpu/quantized_attention_gpu_tests" "$build/tests/gpu_backend/fast_attention_gpu_tests" \
    "$build/tests/gpu_backend/cuda_kv_eviction_tests" "$build/tests/gpu_backend/cuda_model_tests"; exit
fi
call_bundle_unpack
start=$SECONDS; budget=${BUDGET:-300}
left() { echo $((budget - (SECONDS - start))); }
echo "== binaries of $(cat "$(dirname "$B")/commit"); $(date -u +%FT%TZ); $(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader)"
for t in paged_attention_gpu_tests quantized_attention_gpu_tests fast_attention_gpu_tests cuda_kv_eviction_tests cuda_model_tests; do
  timeout 120 "$B" "$t" --gtest_filter="${FILTER:-*}" > "$out/$t.log" 2>&1
  echo "== $t exit $? ($((SECONDS - start)) s): $(grep -E '^\[  (PASSED|FAILED) ' "$out/$t.log" | tr '\n' ' ')"
  grep -E "^\[  FAILED  \]|Failure$" "$out/$t.log" | head -8
done
base_b=""
if [ -n "${BASE:-}" ]; then
  [ -x "$BASE/bundle/run.sh" ] || tar xJf "$BASE/bundle.tar.xz" -C "$BASE"
  base_b=$BASE/bundle/run.sh; echo "== base: binaries of $(cat "$BASE/bundle/commit")"
fi
c8=tools/gpu_backend/llama3_8b_config.json; c40=tools/gpu/llama3_8b_40k_config.json
step() {  # step LABEL BUNDLE_RUN CONFIG CONTEXT ARGS...
  local label=$1 run=$2 cfg=$3 ctx=$4; shift 4
  [ "$(left)" -lt 25 ] && { echo "== $label skipped (time)"; return; }
  timeout 60 "$run" pagoda_gpu_engine_bench --config "$cfg" --sampling greedy --output-len 128 --latency-tokens 128 \
    --workload latency --latency-input-len "$ctx" "$@" > "$out/engine.log" 2>&1
  echo "$label ctx $ctx rc=$?: $(grep -oE 'batch-1: [0-9.]+ ms per token \(ITL p50\)' "$out/engine.log") | $(grep -oE 'decode-only steps: [0-9]+, [0-9.]+ ms each' "$out/engine.log")"
  grep -iE "error" "$out/engine.log" | head -2
}
for round in 1 2; do
  for ctx in 128 4096 32768; do
    cfg=$c8; [ "$ctx" -gt 8192 ] && cfg=$c40
    for kind in fp8 bf16; do
      args=(--kv-cache-dtype "$kind"); [ "$kind" = fp8 ] && args+=(--quantization fp8)
      [ -n "$base_b" ] && step "round $round base $kind" "$base_b" "$cfg" "$ctx" "${args[@]}"
      step "round $round this $kind" "$B" "$cfg" "$ctx" "${args[@]}"
    done
  done
done
rm -f "$out/engine.log"; cd "$out" && tar czf logs.tar.gz ./*.log 2>/dev/null && rm -f ./*.log
echo "done ($((SECONDS - start)) s)"
