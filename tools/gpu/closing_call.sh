#!/usr/bin/env bash
# The closing GPU-machine call of a kernel change (same bundle as final_suite.sh): every gpu test, the
# prefill tests under the other wgmma schedules, compute-sanitizer memcheck over the decode tests (bf16
# and quantized, tensor-core and CUDA-core loops) side by side, then the kernel figures with PyTorch's
# beside them. The end-to-end runs are a second call (final_suite.sh bench with KERNELS=0).
#   run(command="bash tools/gpu/closing_call.sh", carry=[".device/final/bundle.tar.xz"])
# BENCH=0 stops after the checks.
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
bundle=$here/.device/final/bundle
out=${OUT:-/tmp/closing}
mkdir -p "$out"
"$here/tools/gpu/final_suite.sh" tests | tail -9
mv "$out/logs.tar.gz" "$out/test_logs.tar.gz"; rm -f "$out/fixture.tar.gz"
export PATH=$PATH:/usr/local/cuda/bin
sanitize() {  # sanitize NAME BINARY FILTER
  LD_LIBRARY_PATH="$bundle/lib:/usr/local/cuda/lib64" timeout 200 compute-sanitizer --tool memcheck --print-limit 5 \
    "$bundle/bin/$2" --gtest_filter="$3" > "$out/memcheck_$1.txt" 2>&1
  echo "memcheck $1: exit $? $(grep -E 'ERROR SUMMARY|PASSED|FAILED' "$out/memcheck_$1.txt" | tr '\n' ' ')"
}
sanitize decode paged_attention_gpu_tests 'Decode/*' &
sanitize quantized quantized_attention_gpu_tests '*' &
for schedule in v4-lockstep v2; do
  ( PAGODA_PREFILL_SM90=$schedule timeout 120 "$bundle/run.sh" paged_attention_gpu_tests --gtest_filter='Prefill/*' \
      > "$out/prefill_$schedule.txt" 2>&1
    echo "prefill tests under $schedule: exit $? $(grep -E '^\[  PASSED|FAILED TEST' "$out/prefill_$schedule.txt" | tr '\n' ' ')" ) &
done
wait
tar czf "$out/sanitize_logs.tar.gz" -C "$out" $(cd "$out" && ls memcheck_*.txt prefill_*.txt) && rm -f "$out"/memcheck_*.txt "$out"/prefill_*.txt
[ "${BENCH:-1}" = 1 ] || exit 0  # BENCH=0: the checks only (the figures in a call of their own)
KERNELS=1 TORCH=1 BENCH_KV_DTYPES=${BENCH_KV_DTYPES:-bf16,fp8,int8,int4} FULL_RUNS= PEER=0 "$here/tools/gpu/final_suite.sh" bench |
  grep -vE "^ \"" | tail -30
