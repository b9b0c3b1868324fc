#!/usr/bin/env bash
# Everything the attention kernels need from one GPU-machine call, run from the
# repository root there (binaries compiled here, bundled with
# scripts/device-bundle.sh into BUNDLE, carried with the call):
#   tools/gpu/run_attention.sh [BUNDLE]      (default .device/attn)
# Writes under $OUT: gpu_tests.log (plan + kernel tests incl. quantized KV, memcheck),
# attention_bench.log (decode swept over KV_DTYPES, default bf16,fp8,int8,int4,int8/int4),
# torch_baselines.log and .json (PyTorch SDPA side by side, same call),
# sass_summary.txt (instruction counts per kernel: HGMMA? HMMA, LDGSTS, spills),
# gpu_state.txt (nvidia-smi before and after), ncu.txt (counters for one decode
# and one prefill launch). Prints a short summary last.
# Prefill tests also run under each wgmma schedule (PAGODA_PREFILL_SM90) in
# SCHEDULES (full filter) and QUICK_SCHEDULES (Prefill/* only).
# PREFILL_ONLY=1: only the prefill side (those tests, memcheck + synccheck on
# SANITIZE_SCHEDULE (default v4), prefill figures of every schedule,
# SASS, ncu with stall counters of that schedule at 16K), for a short call.
set -uo pipefail
bundle=${1:-.device/attn}
out=${OUT:-/tmp/attn-out}
mkdir -p "$out"

{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw,memory.used --format=csv; } >"$out/gpu_state.txt" 2>&1

"$bundle/run.sh" attention_plan_tests >"$out/gpu_tests.log" 2>&1
plan_rc=$?
prefill_only=${PREFILL_ONLY:-0}
# The prefill tests under each schedule of the wgmma kernel (PAGODA_PREFILL_SM90);
# a schedule that hangs (rc 124) is left out of the sanitizers and the figures
# (the full filter takes ~40 s of CPU references on a fresh machine: keep the
# timeout well above that, or a slow run reads as a hang).
schedule_rc=0
hung=""
# QUICK_SCHEDULES run only the Prefill/* cases (13 s instead of 38 s each).
# Default: the non-default schedules (v2, v4-lockstep); PREFILL_ONLY adds the default, which
# the full run's own Prefill/* pass covers otherwise.
default_schedules="v2 v4-lockstep"
[ "$prefill_only" = 1 ] && default_schedules="v2 v4-lockstep v4"
for schedule in ${SCHEDULES:-$default_schedules} ${QUICK_SCHEDULES:-}; do
  filter='Prefill/*:PagedAttentionGpuProperties.*Prefill*'
  [[ " ${QUICK_SCHEDULES:-} " == *" $schedule "* ]] && filter='Prefill/*'
  echo "== PAGODA_PREFILL_SM90=$schedule" >>"$out/gpu_tests.log"
  PAGODA_PREFILL_SM90=$schedule timeout 90 "$bundle/run.sh" paged_attention_gpu_tests \
    --gtest_filter="$filter" >>"$out/gpu_tests.log" 2>&1
  rc=$?
  [ $rc -ne 0 ] && schedule_rc=$rc
  [ $rc -eq 124 ] && hung="$hung $schedule" && echo "== $schedule timed out" >>"$out/gpu_tests.log"
done
if [ "$prefill_only" = 1 ]; then
  gpu_rc=$schedule_rc
  checked=${SANITIZE_SCHEDULE:-v4}
  if command -v compute-sanitizer >/dev/null && [[ "$hung " != *" $checked "* ]]; then
    for tool in memcheck synccheck; do
      echo "== compute-sanitizer $tool PAGODA_PREFILL_SM90=$checked" >>"$out/gpu_tests.log"
      PAGODA_PREFILL_SM90=$checked LD_LIBRARY_PATH="$bundle/lib:/usr/local/cuda/lib64" timeout 40 \
        compute-sanitizer --tool $tool --print-limit 5 "$bundle/bin/paged_attention_gpu_tests" \
        --gtest_filter='Prefill/*gqa32x8_d128_bs16*:Prefill/*mha4_d128_bs64*' 2>&1 | tail -6 >>"$out/gpu_tests.log"
    done
  fi
  grep -E "^== |rel L2|FAILED|PASSED|Failure|ERROR SUMMARY|error" "$out/gpu_tests.log" | head -60
  only=prefill
  [ -n "$hung" ] && only="prefill v2"
  timeout 90 "$bundle/run.sh" attention_bench --only "$only" >"$out/attention_bench.log" 2>&1
  bench_rc=$?
fi
if [ "$prefill_only" != 1 ]; then
# One process per suite: a kernel fault would poison the context for every later test.
gpu_rc=0
for filter in 'Decode/*' 'Prefill/*' 'PagedAttentionGpuProperties.*'; do
  timeout 300 "$bundle/run.sh" paged_attention_gpu_tests --gtest_filter="$filter" >>"$out/gpu_tests.log" 2>&1 || gpu_rc=$?
done
if [ -x "$bundle/bin/quantized_attention_gpu_tests" ]; then
  timeout 300 "$bundle/run.sh" quantized_attention_gpu_tests >>"$out/gpu_tests.log" 2>&1 || gpu_rc=$?
fi
# Out-of-bounds and race checks on a few small cases (compute-sanitizer is slow).
if command -v compute-sanitizer >/dev/null; then
  for tool in memcheck synccheck; do
    echo "== compute-sanitizer $tool" >>"$out/gpu_tests.log"
    LD_LIBRARY_PATH="$bundle/lib:/usr/local/cuda/lib64" timeout 45 compute-sanitizer --tool $tool --print-limit 5 \
      "$bundle/bin/paged_attention_gpu_tests" \
      --gtest_filter='Decode/*mha8_d64_bs16_split256*:Prefill/*mha4_d64_bs8*:Prefill/*mha4_d128_bs64*' 2>&1 | tail -6 >>"$out/gpu_tests.log"
  done
fi
grep -E "rel L2|FAILED|PASSED|Failure|ERROR SUMMARY|error" "$out/gpu_tests.log" | head -60

bench_rc=0
for only in copy decode prefill; do
  timeout 240 "$bundle/run.sh" attention_bench --only "$only" --kv-dtype "${KV_DTYPES:-bf16,fp8,int8,int4,int8/int4}" \
    >>"$out/attention_bench.log" 2>&1 || bench_rc=$?
done

PYTHONUNBUFFERED=1 python3 bench/kernels/torch_baselines.py >"$out/torch_baselines.log" 2>&1
torch_rc=$?
fi  # not prefill_only

# SASS per kernel: are the tensor-core, async-copy and 16-byte shared loads there; any local memory?
if command -v cuobjdump >/dev/null; then
  cuobjdump --dump-sass "$bundle/bin/attention_bench" | awk '
    /Function :/ { name = $3 }
    name != "" {
      if ($0 ~ /HGMMA/) c[name, "HGMMA"]++
      if ($0 ~ /HMMA/) c[name, "HMMA"]++
      if ($0 ~ /LDGSTS/) c[name, "LDGSTS"]++
      if ($0 ~ /LDSM/) c[name, "LDSM"]++
      if ($0 ~ /LDS\.128/) c[name, "LDS.128"]++
      if ($0 ~ /LDG\.E\.128/) c[name, "LDG.128"]++
      if ($0 ~ /SHFL/) c[name, "SHFL"]++
      if ($0 ~ /MUFU\.EX2/) c[name, "MUFU.EX2"]++
      if ($0 ~ /(LDL|STL)/) c[name, "LDL/STL"]++
      names[name] = 1
    }
    END {
      split("HGMMA HMMA LDGSTS LDSM LDS.128 LDG.128 SHFL MUFU.EX2 LDL/STL", k, " ")
      for (n in names) { line = n; for (i = 1; i <= 9; i++) line = line " " k[i] "=" (c[n, k[i]] + 0); print line }
    }' | grep -E "attention|merge" >"$out/sass_summary.txt"
else
  echo "cuobjdump not found" >"$out/sass_summary.txt"
fi
nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv >>"$out/gpu_state.txt" 2>&1

# Hardware counters for one decode and one prefill launch (clocks left alone).
if command -v ncu >/dev/null && [ "$prefill_only" = 1 ] && [ -z "$hung" ]; then
  # Stall reasons as raw counters (no PC sampling on this machine).
  PAGODA_PREFILL_SM90=$checked LD_LIBRARY_PATH="$bundle/lib:/usr/local/cuda/lib64" timeout 45 ncu --clock-control none \
    -k regex:prefill_attention_sm90 --launch-count 1 --section SpeedOfLight --section ComputeWorkloadAnalysis \
    --section WarpStateStats --section Occupancy --section MemoryWorkloadAnalysis \
    "$bundle/bin/attention_bench" --only "prefill L=16384" --iters 2 >"$out/ncu.txt" 2>&1
  PAGODA_PREFILL_SM90=$checked LD_LIBRARY_PATH="$bundle/lib:/usr/local/cuda/lib64" timeout 45 ncu --clock-control none \
    -k regex:prefill_attention_sm90 --launch-count 1 \
    --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,regex:sm__pipe_tensor.*cycles_active.*' \
    "$bundle/bin/attention_bench" --only "prefill L=16384" --iters 2 >>"$out/ncu.txt" 2>&1
elif command -v ncu >/dev/null && [ "$prefill_only" != 1 ]; then
  export LD_LIBRARY_PATH="$bundle/lib:/usr/local/cuda/lib64"
  { timeout 60 ncu --clock-control none -k regex:decode_attention --launch-count 1 \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
      "$bundle/bin/attention_bench" --only "decode B=64 L=4096" --iters 2
    timeout 60 ncu --clock-control none -k regex:prefill_attention_sm90 --launch-count 1 \
      --section SpeedOfLight --section ComputeWorkloadAnalysis --section Occupancy \
      "$bundle/bin/attention_bench" --only "prefill L=16384" --iters 2
  } >"$out/ncu.txt" 2>&1
fi

echo "== sass"; sed 's/_ZN6pagoda7kernels4cuda[^ ]*_cu_[0-9a-f]*//' "$out/sass_summary.txt" | cut -c1-220
echo "== ncu"; grep -E "DRAM Throughput|Memory Throughput|Compute \\(SM\\)|Duration|Achieved Occupancy|Registers Per|Theoretical Occ|Issue Slots|pipe_tensor|stalled" "$out/ncu.txt" | head -60
echo "== torch"; grep -E "copy|decode|prefill|gemm" "$out/torch_baselines.log" | grep -v expanded
echo "== pagoda"; grep -A30 "^figure" "$out/attention_bench.log" | grep -v "^figure"; grep -E "rel L2 vs naive|failed|error" "$out/attention_bench.log" | cut -c1-160
echo "rc: plan_tests=$plan_rc gpu_tests=$gpu_rc prefill_schedules=$schedule_rc bench=$bench_rc torch=${torch_rc:-skipped}"
