#!/usr/bin/env bash
# The MLA decode kernel on the GPU machine (backend/cuda/attention/mla_decode.h):
# plan tests, gpu tests, racecheck of the one-SM cases, then the benchmark.
# Build and pack here first (a CUDA build dir, e.g. build-cuda):
#   ninja -C build-cuda mla_decode_plan_tests mla_decode_gpu_tests mla_decode_bench
#   scripts/device-bundle.sh .device/mla-kernel build-cuda/tests/gpu/mla_decode_plan_tests \
#     build-cuda/tests/gpu/mla_decode_gpu_tests build-cuda/bench/kernels/mla_decode_bench
# then run `tools/gpu/mla_decode_call.sh [bench args]` with carry [".device/mla-kernel"].
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
bundle=$here/.device/mla-kernel
out=${OUT:-/tmp/mla_decode_call}
mkdir -p "$out"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv
"$bundle/run.sh" mla_decode_plan_tests 2>&1 | tail -1
"$bundle/run.sh" mla_decode_gpu_tests 2>&1 | tee "$out/tests.log" | grep -E "rel L2|FAILED|Failure|actual|PASSED"
cs=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
if [ -n "$cs" ]; then
  LD_LIBRARY_PATH=$bundle/lib:/usr/local/cuda/lib64 timeout 120 "$cs" --tool racecheck \
    "$bundle/bin/mla_decode_gpu_tests" --gtest_filter='*LongSegmentsOneSm' 2>&1 | tee "$out/racecheck.log" | tail -3
fi
"$bundle/run.sh" mla_decode_bench "$@" 2>&1 | tee "$out/bench.log"
