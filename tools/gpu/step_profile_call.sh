#!/usr/bin/env bash
# Issue 23 (helper fp8w4): where one batch-1 decode step goes on the Llama-3-8B shape. ncu times every kernel
# of one graph replay (PAGODA_CUDA_PROFILE_REPLAY, --profile-from-start off), bf16 and fp8 + fp8 KV; the GEMV
# and per-op speed tests; the engine's batch-1 step without a profiler for the gaps.
# Needs .device/<name>/bundle.tar.xz (scripts/device-bundle.sh of pagoda_gpu_engine_bench and cuda_ops_tests,
# plus bundle/commit) and ncu_step_breakdown.py beside this script (copied there as call.sh):
#   run(command="bash .device/<name>/call.sh", carry=[".device/<name>"], timeout_s=180)
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${OUT:-/tmp/step_profile}; mkdir -p "$out"
tar xJf "$here/bundle.tar.xz" -C "$here"
cd "$root"
export PAGODA_SOURCE_DIR=$root
start=$SECONDS
left() { echo $((170 - (SECONDS - start))); }
echo "== binaries of $(cat "$here/bundle/commit"); $(date -u +%FT%TZ); $(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader)"
ls /usr/local/cuda/bin 2>/dev/null | grep -iE 'nsys|ncu' | tr '\n' ' '; echo
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: ${ncu:-none}"
bench_args=(--config tools/gpu_backend/llama3_8b_config.json --sampling greedy --input-len 128 --workload latency)
profile() {  # profile LABEL ARGS...
  local label=$1; shift
  [ -z "$ncu" ] && return
  local limit=55; [ "$(left)" -lt "$limit" ] && limit=$(left)
  [ "$limit" -lt 20 ] && { echo "== ncu $label skipped (time)"; return; }
  PAGODA_CUDA_PROFILE_REPLAY=30 timeout "$limit" "$ncu" --profile-from-start off --clock-control none --csv --page raw \
    --print-kernel-base function --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,launch__grid_size \
    --log-file "$out/ncu_$label.csv" "$here/bundle/run.sh" pagoda_gpu_engine_bench "${bench_args[@]}" \
    --output-len 48 --latency-tokens 48 "$@" > "$out/ncu_$label.log" 2>&1
  echo "== ncu $label exit $? ($((SECONDS - start)) s)"; tail -3 "$out/ncu_$label.log"
  python3 "$here/ncu_step_breakdown.py" "$out/ncu_$label.csv" > "$out/breakdown_$label.md" 2>&1; head -40 "$out/breakdown_$label.md"
}
engine() {  # engine LABEL ARGS...
  local label=$1; shift
  local limit=30; [ "$(left)" -lt "$limit" ] && limit=$(left)
  [ "$limit" -lt 15 ] && { echo "== engine $label skipped (time)"; return; }
  timeout "$limit" "$here/bundle/run.sh" pagoda_gpu_engine_bench "${bench_args[@]}" --output-len 128 --latency-tokens 128 \
    "$@" > "$out/engine_$label.log" 2>&1
  echo "== engine $label exit $? ($((SECONDS - start)) s)"; grep -E "batch-1|ITL|step|error" "$out/engine_$label.log" | head -6
}
profile bf16 --kv-cache-dtype bf16
profile fp8 --kv-cache-dtype fp8 --quantization fp8
timeout 40 "$here/bundle/run.sh" cuda_ops_tests --gtest_filter='GemvSpeed.*:DecodeStepOpsSpeed.*' > "$out/speed.log" 2>&1
echo "== speed tests exit $? ($((SECONDS - start)) s)"; grep -E "gemv-speed|decode-ops|PASSED|FAILED" "$out/speed.log" | head -60
engine bf16 --kv-cache-dtype bf16
engine fp8 --kv-cache-dtype fp8 --quantization fp8
echo "done ($((SECONDS - start)) s)"
