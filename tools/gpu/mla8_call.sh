#!/usr/bin/env bash
# The TMA-fed 16-head bf16 MLA decode kernel (issue #20, branch mla8) on the GPU
# machine in one call:
#   tools/gpu/mla8_call.sh bundle    # BUILD_DIR (default build-cuda) -> /work/main/.device/mla8
# then a device call with carry [".device/mla8"] (about 160 s of commands):
#   .device/mla8/mla8_call.sh run    # plan + gpu tests (the TMA ones apart, 90 s in all),
#                                    # then the bench with both kernels side by side (60 s)
#   .device/mla8/mla8_call.sh model  # optional (~40 s): the DeepSeek fast-decode model tests
#                                    # with PAGODA_MLA_DECODE_KERNEL=tma (eager + CUDA graph steps)
# Logs go to $OUT (default /tmp/mla8); summary.log has the figures.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
case "${1:-}" in
bundle)
  set -e
  root=$(cd "$here/../.." && pwd)
  build=${BUILD_DIR:-$root/build-cuda}
  dest=${DEST:-/work/main/.device/mla8}
  ninja -C "$build" -j2 mla_decode_gpu_tests mla_decode_plan_tests mla_decode_bench
  # cuda_model_tests links, but its gtest test discovery (a post-build step) can
  # time out on a loaded build machine; the linked binary is what is bundled.
  ninja -C "$build" -j2 cuda_model_tests || [ -x "$build/tests/gpu_backend/cuda_model_tests" ]
  rm -rf "$dest"
  "$root/scripts/device-bundle.sh" "$dest/bundle" "$build/tests/gpu/mla_decode_gpu_tests" \
    "$build/tests/gpu/mla_decode_plan_tests" "$build/bench/kernels/mla_decode_bench" \
    "$build/tests/gpu_backend/cuda_model_tests"
  strip "$dest"/bundle/bin/* || true
  tar czf "$dest/bundle.tar.gz" -C "$dest" bundle && rm -rf "$dest/bundle"
  cp "$0" "$dest/mla8_call.sh"
  git -C "$root" rev-parse --short HEAD > "$dest/commit"
  du -sh "$dest"
  ;;
run)
  [ -x "$here/bundle/run.sh" ] || tar xzf "$here/bundle.tar.gz" -C "$here"
  root=$(cd "$here/../.." && pwd)
  out=${OUT:-/tmp/mla8}
  mkdir -p "$out"
  cd "$root"
  export PAGODA_SOURCE_DIR=$root
  unset PAGODA_MLA_DECODE_KERNEL  # the tests and the bench choose the kernel per plan
  start=$(date +%s)
  { echo "commit $(cat "$here/commit")  $(date -u +%FT%TZ)"
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader; } | tee "$out/summary.log"
  timeout 10 "$here/bundle/run.sh" mla_decode_plan_tests > "$out/plan.log" 2>&1
  echo "mla_decode_plan_tests rc=$? $(tail -1 "$out/plan.log")" | tee -a "$out/summary.log"
  # The TMA kernel's tests first and on their own: a hang there (a lost
  # mbarrier phase) must not hide the rest.
  timeout 40 "$here/bundle/run.sh" mla_decode_gpu_tests --gtest_filter='*Tma*' > "$out/gpu_tests_tma.log" 2>&1
  echo "mla_decode_gpu_tests (TMA) rc=$?" | tee -a "$out/summary.log"
  grep -E "rel L2|outputs differ|FAILED|Failure|PASSED|Which is|actual|error" "$out/gpu_tests_tma.log" | tee -a "$out/summary.log" | tail -40
  timeout 50 "$here/bundle/run.sh" mla_decode_gpu_tests --gtest_filter='-*Tma*' > "$out/gpu_tests.log" 2>&1
  echo "mla_decode_gpu_tests (the others) rc=$?" | tee -a "$out/summary.log"
  grep -E "FAILED|Failure|PASSED|Which is" "$out/gpu_tests.log" | tee -a "$out/summary.log" | tail -20
  echo "elapsed $(( $(date +%s) - start )) s" | tee -a "$out/summary.log"
  # bf16 at 16 heads: 64 x 4K and 8 x 32K (blocks of 64) and 64 x 4K (blocks of
  # 16), each pool timed with the cp.async kernel, then the TMA kernel.
  timeout 60 "$here/bundle/run.sh" mla_decode_bench --iters 20 --only "bf16 H=16" > "$out/bench.log" 2>&1
  echo "bench rc=$?" | tee -a "$out/summary.log"
  grep -E "^mla decode|^\| |ceiling|non-finite|error" "$out/bench.log" | tee -a "$out/summary.log"
  echo "elapsed $(( $(date +%s) - start )) s" | tee -a "$out/summary.log"
  ;;
model)
  [ -x "$here/bundle/run.sh" ] || tar xzf "$here/bundle.tar.gz" -C "$here"
  root=$(cd "$here/../.." && pwd)
  out=${OUT:-/tmp/mla8}
  mkdir -p "$out"
  cd "$root"
  export PAGODA_SOURCE_DIR=$root
  PAGODA_MLA_DECODE_KERNEL=tma timeout 45 "$here/bundle/run.sh" cuda_model_tests \
    --gtest_filter='*DeepseekFastDecode*' > "$out/model.log" 2>&1
  echo "cuda_model_tests (DeepSeek fast decode, PAGODA_MLA_DECODE_KERNEL=tma) rc=$?" | tee -a "$out/summary.log"
  grep -E "Failure|FAILED|PASSED|Which is|figure|tests ran|error" "$out/model.log" | head -40 | tee -a "$out/summary.log"
  ;;
*) echo "usage: $0 bundle|run|model" >&2; exit 2 ;;
esac
