#!/usr/bin/env bash
# fp8 MLA latent pools in runtime/mla_fp8_layout.h's records (FlashMLA's 656 B),
# issue #20, on the GPU machine in one call:
#   tools/gpu/mla6_call.sh bundle     # BUILD_DIR (default build-cuda) -> /work/main/.device/mla6
# then a device call with carry [".device/mla6"]:
#   .device/mla6/mla6_call.sh run     # DeepSeek cases of cuda_model_tests, mla_decode_gpu_tests
# Logs go to $OUT.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
case "${1:-}" in
bundle)
  set -e
  root=$(cd "$here/../.." && pwd)
  build=${BUILD_DIR:-$root/build-cuda}
  dest=${DEST:-/work/main/.device/mla6}
  ninja -C "$build" -j2 cuda_model_tests mla_decode_gpu_tests
  rm -rf "$dest"
  "$root/scripts/device-bundle.sh" "$dest/bundle" "$build/tests/gpu_backend/cuda_model_tests" \
    "$build/tests/gpu/mla_decode_gpu_tests"
  strip "$dest"/bundle/bin/* || true
  tar czf "$dest/bundle.tar.gz" -C "$dest" bundle && rm -rf "$dest/bundle"
  cp "$0" "$dest/mla6_call.sh"
  git -C "$root" rev-parse --short HEAD > "$dest/commit"
  du -sh "$dest"
  ;;
run)
  [ -x "$here/bundle/run.sh" ] || tar xzf "$here/bundle.tar.gz" -C "$here"
  root=$(cd "$here/../.." && pwd)
  out=${OUT:-/tmp/mla6}
  mkdir -p "$out"
  cd "$root"
  export PAGODA_SOURCE_DIR=$root
  start=$(date +%s)
  { echo "commit $(cat "$here/commit")  $(date -u +%FT%TZ)"
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } | tee "$out/summary.log"
  timeout 100 "$here/bundle/run.sh" cuda_model_tests --gtest_filter='*Deepseek*:-*Timing*' > "$out/model.log" 2>&1
  echo "cuda_model_tests (DeepSeek) rc=$?" | tee -a "$out/summary.log"
  grep -E "Failure|FAILED|PASSED|Which is|figure|tests ran" "$out/model.log" | head -60 | tee -a "$out/summary.log"
  timeout 60 "$here/bundle/run.sh" mla_decode_gpu_tests > "$out/gpu_tests.log" 2>&1
  echo "mla_decode_gpu_tests rc=$?" | tee -a "$out/summary.log"
  grep -E "FAILED|Failure|PASSED|Which is" "$out/gpu_tests.log" | tail -20 | tee -a "$out/summary.log"
  echo "elapsed $(( $(date +%s) - start )) s" | tee -a "$out/summary.log"
  ;;
*) echo "usage: $0 bundle|run" >&2; exit 2 ;;
esac
