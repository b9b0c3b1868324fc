#!/usr/bin/env bash
# Issue 23 (helper fp8w4): the decode step's programmatic dependent launches (pdl.cuh), the fp8 GEMV's wider
# blocks, the 1,024-thread norms and the single rope launch: their gpu tests, then the engine's batch-1 ITL
# on the Llama-3-8B shape (bf16 and fp8 + fp8 KV) with PDL on and off (PAGODA_PDL=1 / 0, same binaries), then
# batch 64/256 throughput and one profiled fp8 step if time is left.
# Needs .device/<name>/bundle.tar.xz (scripts/device-bundle.sh of cuda_ops_tests, cuda_model_tests and
# pagoda_gpu_engine_bench, plus bundle/commit), ncu_step_breakdown.py and, optionally, fp8/ (a
# tests/fixtures/fp8 to use instead of the checkout's) beside this script, copied there as call.sh:
#   run(command="bash .device/<name>/call.sh", carry=[".device/<name>"]).
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${OUT:-/tmp/pdl_call}; mkdir -p "$out"
tar xJf "$here/bundle.tar.xz" -C "$here"
src=/tmp/pdl_src; rm -rf "$src"; mkdir -p "$src/tests/fixtures"
for d in "$root"/*; do [ "$(basename "$d")" = tests ] || ln -sfn "$d" "$src/"; done
for d in "$root"/tests/*; do [ "$(basename "$d")" = fixtures ] || ln -sfn "$d" "$src/tests/"; done
for d in "$root"/tests/fixtures/*; do [ "$(basename "$d")" = fp8 ] && [ -d "$here/fp8" ] || ln -sfn "$d" "$src/tests/fixtures/"; done
[ -d "$here/fp8" ] && cp -r "$here/fp8" "$src/tests/fixtures/fp8"
export PAGODA_SOURCE_DIR=$src
cd "$src"
start=$SECONDS
budget=${BUDGET:-190}
left() { echo $((budget - (SECONDS - start))); }
B="$here/bundle/run.sh"
echo "== binaries of $(cat "$here/bundle/commit"); $(date -u +%FT%TZ); $(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader)"
timeout 45 "$B" cuda_ops_tests --gtest_filter='*Gemv*:CudaOps.*:DecodeStepOpsSpeed.*:-GemvSpeed.*' > "$out/ops.log" 2>&1
echo "== cuda_ops_tests exit $? ($((SECONDS - start)) s)"
grep -E "^\[  (PASSED|FAILED)|FAILED|decode-ops|Failure|Expected|Which is" "$out/ops.log" | head -40
engine() {  # engine LABEL LIMIT ENV_ASSIGNMENT ARGS...
  local label=$1 limit=$2 assignment=$3; shift 3
  [ "$(left)" -lt "$limit" ] && limit=$(left)
  [ "$limit" -lt 10 ] && { echo "== engine $label skipped (time)"; return; }
  env "$assignment" timeout "$limit" "$B" pagoda_gpu_engine_bench --config tools/gpu_backend/llama3_8b_config.json \
    --sampling greedy --input-len 128 --output-len 128 --latency-tokens 128 "$@" > "$out/engine_$label.log" 2>&1
  echo "== engine $label exit $? ($((SECONDS - start)) s)"
  grep -E "requests in|batch-1|step time" "$out/engine_$label.log" | head -6
}
engine bf16 25 PAGODA_PDL=1 --workload latency --kv-cache-dtype bf16
engine fp8 25 PAGODA_PDL=1 --workload latency --kv-cache-dtype fp8 --quantization fp8
engine bf16_nopdl 25 PAGODA_PDL=0 --workload latency --kv-cache-dtype bf16
engine fp8_nopdl 25 PAGODA_PDL=0 --workload latency --kv-cache-dtype fp8 --quantization fp8
timeout 70 "$B" cuda_model_tests --gtest_filter='*Fp8*:*FixtureTest*:CudaModel.*' > "$out/model.log" 2>&1
echo "== cuda_model_tests exit $? ($((SECONDS - start)) s)"
grep -E "^\[  (PASSED|FAILED)|FAILED|Failure|Expected|Which is" "$out/model.log" | head -30
engine fp8_256 30 PAGODA_PDL=1 --workload random --num-requests 256 --max-num-seqs 256 --kv-cache-dtype fp8 --quantization fp8
engine bf16_256 30 PAGODA_PDL=1 --workload random --num-requests 256 --max-num-seqs 256 --kv-cache-dtype bf16
engine fp8_64 20 PAGODA_PDL=1 --workload random --num-requests 64 --max-num-seqs 64 --kv-cache-dtype fp8 --quantization fp8
if [ "$(left)" -ge 25 ]; then
  PAGODA_CUDA_PROFILE_REPLAY=30 timeout "$(left)" /usr/local/cuda/bin/ncu --profile-from-start off --clock-control none \
    --csv --page raw --print-kernel-base function \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,launch__grid_size \
    --log-file "$out/ncu_fp8.csv" "$B" pagoda_gpu_engine_bench --config tools/gpu_backend/llama3_8b_config.json \
    --sampling greedy --input-len 128 --workload latency --output-len 48 --latency-tokens 48 --kv-cache-dtype fp8 \
    --quantization fp8 > "$out/ncu_fp8.log" 2>&1
  echo "== ncu fp8 exit $? ($((SECONDS - start)) s)"
  python3 "$here/ncu_step_breakdown.py" "$out/ncu_fp8.csv" > "$out/breakdown_fp8.md" 2>&1; head -24 "$out/breakdown_fp8.md"
fi
cd "$out" && tar czf logs.tar.gz *.log 2>/dev/null && rm -f engine_*.log ncu_fp8.log
echo "done ($((SECONDS - start)) s)"
