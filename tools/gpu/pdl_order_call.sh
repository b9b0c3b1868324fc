#!/usr/bin/env bash
# Issue 23, session 18: PDL on by default with every kernel's trigger after its wait (pdl.cuh). One call:
# every gpu test binary of the decode path (PDL now on in all of them), then batch-1 ITL of the 8B shape
# (latency workload) with PAGODA_PDL=0 / 1 interleaved, three times each, bf16 + bf16 KV and fp8 + fp8 KV,
# then throughput at 256 x 128/128 and the 1,000 x 1,000/1,000 fp8 + fp8 KV workload, PDL on and off.
# Bundle: DEST=/work/main/.device/<name> tools/gpu/pdl_order_call.sh bundle; run (carry .device/<name>):
#   BUDGET=560 bash .device/<name>/pdl_order_call.sh run
set -u
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tools/gpu/call_bundle.sh
. "$here/call_bundle.sh"
tests=(cuda_ops_tests cuda_model_tests fast_attention_gpu_tests
       quantized_attention_gpu_tests cuda_kv_eviction_tests mla_decode_gpu_tests)
if [ "${1:-}" = bundle ]; then
  build=$(cd "$here/../.." && pwd)/build
  bins=("$build/bench/gpu/pagoda_gpu_engine_bench")
  for t in "${tests[@]}"; do bins+=("$(find "$build/tests" -name "$t" -type f | head -1)"); done
  call_bundle_pack "$0" "${bins[@]}"; exit
fi
call_bundle_unpack
start=$SECONDS; budget=${BUDGET:-560}
left() { echo $((budget - (SECONDS - start))); }
echo "== binaries of $(cat "$(dirname "$B")/commit"); $(date -u +%FT%TZ); $(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader)"
if [ "${TESTS:-1}" = 1 ]; then
  pids=()
  for t in "${tests[@]}"; do
    filter='*'; [ "$t" = cuda_ops_tests ] && filter='-*Speed*'
    ( timeout 240 "$B" "$t" --gtest_filter="$filter" > "$out/$t.log" 2>&1; echo $? > "$out/$t.rc" ) &
    pids+=($!)
  done
  wait "${pids[@]}"
  for t in "${tests[@]}"; do
    echo "== $t exit $(cat "$out/$t.rc"): $(grep -oE '^\[  PASSED  \] [0-9]+' "$out/$t.log" | tail -1) $(grep -c '^\[  FAILED  \] .*(' "$out/$t.log") failed"
    grep '^\[  FAILED  \] .*(' "$out/$t.log" | head -5
  done
  echo "tests done ($((SECONDS - start)) s)"
fi
engine() {  # engine LABEL LIMIT PDL ARGS...
  local label=$1 limit=$2 pdl=$3; shift 3
  [ "$(left)" -lt "$limit" ] && { echo "== engine $label skipped (time)"; return; }
  PAGODA_PDL=$pdl timeout "$limit" "$B" pagoda_gpu_engine_bench --config tools/gpu_backend/llama3_8b_config.json \
    "$@" > "$out/engine_$label.log" 2>&1
  echo "== engine $label PDL=$pdl exit $? ($((SECONDS - start)) s): $(grep -oE 'batch-1: [0-9.]+ ms per token \(ITL p50\)' "$out/engine_$label.log") $(grep -oE 'decode-only steps: [0-9]+, [0-9.]+ ms each' "$out/engine_$label.log" | head -1) $(grep -oE '[0-9]+ output tok/s' "$out/engine_$label.log" | head -1)"
}
lat=(--sampling greedy --input-len 128 --output-len 128 --latency-tokens 128 --workload latency)
for rep in 1 2 3; do
  for pdl in 0 1; do
    engine "bf16_itl_${pdl}_$rep" 25 $pdl "${lat[@]}" --kv-cache-dtype bf16
    engine "fp8_itl_${pdl}_$rep" 25 $pdl "${lat[@]}" --kv-cache-dtype fp8 --quantization fp8
  done
done
small=(--workload random --sampling greedy --num-requests 256 --max-num-seqs 256 --input-len 128 --output-len 128)
for pdl in 0 1; do
  engine "bf16_256_$pdl" 40 $pdl "${small[@]}" --kv-cache-dtype bf16
  engine "fp8_256_$pdl" 40 $pdl "${small[@]}" --kv-cache-dtype fp8 --quantization fp8
done
if [ "${FULL:-1}" = 1 ]; then
  for pdl in 1 0; do
    engine "fp8_1kx1k_$pdl" 110 $pdl --workload random --sampling greedy --num-requests 1000 --input-len 1000 \
      --output-len 1000 --kv-cache-dtype fp8 --quantization fp8 --max-num-seqs 512 --max-tokens-per-step 16384
  done
fi
cd "$out" && tar czf logs.tar.gz ./*.log ./*.rc 2>/dev/null && rm -f ./*.log ./*.rc
echo "done ($((SECONDS - start)) s)"
