#!/usr/bin/env bash
# fp8w3 (issue 23): the GEMV's gpu tests + bandwidth vs cuBLASLt, the fp8 model tests (block_fp8_128 too)
# and the bf16 model fixtures (the GEMV now runs their decode steps), then the engine on the Llama-3-8B
# shape: batch 1 with the GEMV on and off (PAGODA_GEMV_MAX_ROWS=0), bf16 and fp8 + fp8 KV; batch 256/64.
# Needs .device/fp8w3/bundle.tar.xz (scripts/device-bundle.sh of cuda_ops_tests, cuda_model_tests and
# pagoda_gpu_engine_bench, plus bundle/commit) and .device/fp8w3/fp8 (this tree's tests/fixtures/fp8) next to
# it: copy this script to .device/fp8w3/call.sh and run(command="bash .device/fp8w3/call.sh", carry=[".device/fp8w3"]).
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${OUT:-/tmp/fp8w3}; mkdir -p "$out"
tar xJf "$here/bundle.tar.xz" -C "$here"
# The source tree the tests read: main's checkout with this branch's fp8 fixtures.
src=/tmp/fp8w3_src; mkdir -p "$src/tests/fixtures"
for d in "$root"/*; do [ "$(basename "$d")" = tests ] || ln -sfn "$d" "$src/"; done
for d in "$root"/tests/*; do [ "$(basename "$d")" = fixtures ] || ln -sfn "$d" "$src/tests/"; done
for d in "$root"/tests/fixtures/*; do [ "$(basename "$d")" = fp8 ] || ln -sfn "$d" "$src/tests/fixtures/"; done
cp -r "$here/fp8" "$src/tests/fixtures/fp8"
export PAGODA_SOURCE_DIR=$src
cd "$src"
start=$SECONDS
left() { echo $((205 - (SECONDS - start))); }
echo "== binaries of $(cat "$here/bundle/commit"); $(date -u +%FT%TZ); $(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader)"
timeout 60 "$here/bundle/run.sh" cuda_ops_tests --gtest_filter='*Gemv*:*DecodeStepOps*' > "$out/gemv.log" 2>&1
echo "cuda_ops_tests *Gemv* exit $? ($((SECONDS - start)) s)"; grep -E "^\[  (PASSED|FAILED)|FAILED|gemv-speed|decode-ops|Failure|Expected|Which is" "$out/gemv.log" | head -80
timeout 50 "$here/bundle/run.sh" cuda_model_tests --gtest_filter='*Fp8*:*FixtureTest*:CudaModel.*' > "$out/model.log" 2>&1
echo "cuda_model_tests exit $? ($((SECONDS - start)) s)"; grep -E "^\[  (PASSED|FAILED)|FAILED|figure|Failure|Expected|Which is" "$out/model.log" | head -40
engine() {  # engine LABEL LIMIT ENV_ASSIGNMENT ARGS...
  local label=$1 limit=$2 assignment=$3; shift 3
  [ "$(left)" -lt "$limit" ] && limit=$(left)
  [ "$limit" -lt 12 ] && { echo "== engine $label skipped (time)"; return; }
  env "$assignment" timeout "$limit" "$here/bundle/run.sh" pagoda_gpu_engine_bench --config tools/gpu_backend/llama3_8b_config.json \
    --sampling greedy --input-len 128 --output-len 128 --latency-tokens 128 --json "$out/engine_$label.json" "$@" \
    > "$out/engine_$label.log" 2>&1
  echo "== engine $label exit $? ($((SECONDS - start)) s)"
  grep -E "requests in|batch-1|ITL|step time|kv pool|error" "$out/engine_$label.log" | head -8
}
engine bf16_256 40 PAGODA_FP8W3=1 --workload latency,random --num-requests 256 --max-num-seqs 256 --kv-cache-dtype bf16
engine fp8_256 40 PAGODA_FP8W3=1 --workload latency,random --num-requests 256 --max-num-seqs 256 --kv-cache-dtype fp8 --quantization fp8
engine bf16_nogemv 25 PAGODA_GEMV_MAX_ROWS=0 --workload latency --kv-cache-dtype bf16
engine fp8_nogemv 25 PAGODA_GEMV_MAX_ROWS=0 --workload latency --kv-cache-dtype fp8 --quantization fp8
engine fp8_64 25 PAGODA_FP8W3=1 --workload random --num-requests 64 --max-num-seqs 64 --kv-cache-dtype fp8 --quantization fp8
engine bf16_64 25 PAGODA_FP8W3=1 --workload random --num-requests 64 --max-num-seqs 64 --kv-cache-dtype bf16
cd "$out" && tar czf engine_logs.tar.gz engine_*.log engine_*.json 2>/dev/null && rm -f engine_*.log engine_*.json
echo "done ($((SECONDS - start)) s)"
