#!/usr/bin/env bash
# NCCL communicators on the GPU machine (issue #26, docs/TENSOR_PARALLEL.md), in one device call:
# nccl_communicator_gpu_test at one rank per visible GPU (nranks = 1 on nvidia-h200, 2 / 4 on the
# multi-GPU kinds): all-reduce f32/bf16, all-gather, broadcast, barrier against the host, bad device
# lists, NCCL_NVLS_ENABLE=0 set by the communicators.
#
# Here:   tools/gpu/tp_nccl_call.sh bundle [BUILD_DIR]   (default build-cuda, configured with
#         -DPAGODA_CUDA=ON) packs DEST (default .device/tp; a helper's calls send the session's
#         checkout, so DEST=<that checkout>/.device/tp)
# There:  run(command="bash .device/tp/tp_nccl_call.sh run", carry=[".device/tp"], timeout_s=120)
# Results: $OUT/tp_nccl.txt (everything printed).
set -uo pipefail
case "${1:-}" in
bundle)
  set -e
  here=$(cd "$(dirname "$0")/../.." && pwd)
  build=${2:-$here/build-cuda}
  dest=${DEST:-$here/.device/tp}
  ninja -C "$build" -j2 nccl_communicator_gpu_test
  rm -rf "$dest" && mkdir -p "$dest"
  stage=$(mktemp -d)
  "$here/scripts/device-bundle.sh" "$stage/bundle" "$build/tests/parallel/nccl_communicator_gpu_test"
  strip "$stage"/bundle/bin/* || true
  git -C "$here" rev-parse --short HEAD > "$stage/bundle/commit"
  tar cJf "$dest/bundle.tar.xz" -C "$stage" bundle
  cp "$0" "$dest/tp_nccl_call.sh"
  rm -rf "$stage"
  ls -la "$dest"
  ;;
run)
  dir=$(cd "$(dirname "$0")" && pwd)
  tar xJf "$dir/bundle.tar.xz" -C /tmp
  out=${OUT:-/tmp/tp_nccl}
  mkdir -p "$out"
  {
    echo "commit $(cat /tmp/bundle/commit), $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
    echo "GPUs: $(nvidia-smi -L | wc -l)"
    date -u
    NCCL_DEBUG=WARN timeout 90 /tmp/bundle/run.sh nccl_communicator_gpu_test
    echo "tests exit $?"
    date -u
  } 2>&1 | tee "$out/tp_nccl.txt"
  ;;
*)
  echo "usage: $0 bundle [BUILD_DIR] | run" >&2
  exit 2
  ;;
esac
