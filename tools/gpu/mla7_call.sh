#!/usr/bin/env bash
# MLA decode with FlashMLA's fp8 records at more than 16 heads (the 64-head-tile
# kernel), issue #20, on the GPU machine in one call:
#   tools/gpu/mla7_call.sh bundle     # BUILD_DIR (default build-cuda) -> /work/main/.device/mla7
# then a device call with carry [".device/mla7"]:
#   .device/mla7/mla7_call.sh run     # plan + gpu tests, this bench and the previous one
#                                     # side by side, DeepSeek model tests, racecheck
#   .device/mla7/mla7_call.sh bench128  # only the 128-head shapes, both benches (~1 min)
# PREV_BUNDLE (default /work/main/.device/mla5/bundle.tar.gz) supplies the previous
# kernel's bench (its --slots 18 is the kernel main kept). Logs go to $OUT.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
case "${1:-}" in
bundle)
  set -e
  root=$(cd "$here/../.." && pwd)
  build=${BUILD_DIR:-$root/build-cuda}
  dest=${DEST:-/work/main/.device/mla7}
  prev=${PREV_BUNDLE:-/work/main/.device/mla5/bundle.tar.gz}
  ninja -C "$build" -j2 cuda_model_tests mla_decode_gpu_tests mla_decode_plan_tests mla_decode_bench
  rm -rf "$dest"
  "$root/scripts/device-bundle.sh" "$dest/bundle" "$build/tests/gpu_backend/cuda_model_tests" \
    "$build/tests/gpu/mla_decode_gpu_tests" "$build/tests/gpu/mla_decode_plan_tests" "$build/bench/kernels/mla_decode_bench"
  tmp=$(mktemp -d)
  tar xzf "$prev" -C "$tmp" bundle/bin/mla_decode_bench
  cp "$tmp/bundle/bin/mla_decode_bench" "$dest/bundle/bin/mla_decode_bench_prev"
  rm -rf "$tmp"
  strip "$dest"/bundle/bin/* || true
  tar czf "$dest/bundle.tar.gz" -C "$dest" bundle && rm -rf "$dest/bundle"
  cp "$0" "$dest/mla7_call.sh"
  git -C "$root" rev-parse --short HEAD > "$dest/commit"
  du -sh "$dest"
  ;;
run)
  [ -x "$here/bundle/run.sh" ] || tar xzf "$here/bundle.tar.gz" -C "$here"
  root=$(cd "$here/../.." && pwd)
  out=${OUT:-/tmp/mla7}
  mkdir -p "$out"
  cd "$root"
  export PAGODA_SOURCE_DIR=$root
  start=$(date +%s)
  { echo "commit $(cat "$here/commit")  $(date -u +%FT%TZ)"
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader; } | tee "$out/summary.log"
  timeout 10 "$here/bundle/run.sh" mla_decode_plan_tests > "$out/plan.log" 2>&1
  echo "mla_decode_plan_tests rc=$? $(tail -1 "$out/plan.log")" | tee -a "$out/summary.log"
  timeout 50 "$here/bundle/run.sh" mla_decode_gpu_tests > "$out/gpu_tests.log" 2>&1
  echo "mla_decode_gpu_tests rc=$?" | tee -a "$out/summary.log"
  grep -E "rel L2|FAILED|Failure|PASSED|Which is|actual" "$out/gpu_tests.log" | tee -a "$out/summary.log" | tail -60
  # The previous kernel (main's) first, then this branch's, on the same shapes.
  timeout 40 "$here/bundle/run.sh" mla_decode_bench_prev --iters 20 --slots 18 --only "H=128" > "$out/bench_prev.log" 2>&1
  echo "previous bench (H=128) rc=$?" | tee -a "$out/summary.log"
  grep -E "^\| |ceiling" "$out/bench_prev.log" | tee -a "$out/summary.log"
  # 19 shapes at ~6 s each (pool set-up on the host included): 70 s cut the
  # first run (2026-12-02) before the 128-head FlashMLA shapes.
  timeout 130 "$here/bundle/run.sh" mla_decode_bench --iters 20 > "$out/bench.log" 2>&1
  echo "bench rc=$?" | tee -a "$out/summary.log"
  grep -E "^\| |ceiling" "$out/bench.log" | tee -a "$out/summary.log"
  echo "elapsed $(( $(date +%s) - start )) s" | tee -a "$out/summary.log"
  timeout 45 "$here/bundle/run.sh" cuda_model_tests --gtest_filter='*DeepseekFastDecode*:*Deepseek*Fp8*' > "$out/model.log" 2>&1
  echo "cuda_model_tests (DeepSeek fast decode, fp8) rc=$?" | tee -a "$out/summary.log"
  grep -E "Failure|FAILED|PASSED|Which is|figure|tests ran" "$out/model.log" | head -40 | tee -a "$out/summary.log"
  left=$(( 192 - ($(date +%s) - start) ))
  cs=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
  if [ -n "$cs" ] && [ "$left" -gt 12 ]; then
    LD_LIBRARY_PATH=$here/bundle/lib:/usr/local/cuda/lib64 timeout $((left - 5)) "$cs" --tool racecheck \
      "$here/bundle/bin/mla_decode_gpu_tests" --gtest_filter='*FlashMla656WideHeadsLongSegmentsOneSm' > "$out/racecheck.log" 2>&1
    echo "racecheck rc=$? $(grep -E 'hazard|ERROR SUMMARY|PASSED|FAILED' "$out/racecheck.log" | tail -3 | tr '\n' ' ')" | tee -a "$out/summary.log"
  fi
  echo "elapsed $(( $(date +%s) - start )) s" | tee -a "$out/summary.log"
  ;;
bench128)
  [ -x "$here/bundle/run.sh" ] || tar xzf "$here/bundle.tar.gz" -C "$here"
  out=${OUT:-/tmp/mla7}
  mkdir -p "$out"
  { echo "commit $(cat "$here/commit")  $(date -u +%FT%TZ)"
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } | tee "$out/summary128.log"
  timeout 30 "$here/bundle/run.sh" mla_decode_bench_prev --iters 20 --only "fp8 H=128" > "$out/bench128_prev.log" 2>&1
  echo "previous bench (fp8 H=128) rc=$?" | tee -a "$out/summary128.log"
  grep -E "^\| |ceiling" "$out/bench128_prev.log" | tee -a "$out/summary128.log"
  timeout 60 "$here/bundle/run.sh" mla_decode_bench --iters 20 --only "H=128" > "$out/bench128.log" 2>&1
  echo "bench (H=128) rc=$?" | tee -a "$out/summary128.log"
  grep -E "^\| |ceiling" "$out/bench128.log" | tee -a "$out/summary128.log"
  ;;
*) echo "usage: $0 bundle|run|bench128" >&2; exit 2 ;;
esac
