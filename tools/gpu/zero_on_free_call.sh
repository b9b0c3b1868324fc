#!/usr/bin/env bash
# Zero on free on the H200 (issue #22), in one device call: cuda_zero_on_free_tests, i.e.
#   - the listed blocks (and only they) are cleared in every layer and sub-pool, bf16 and int4;
#   - the clears are ordered after the model stream's earlier work and before its later work;
#   - through the engine, a block another tenant left holds zeros where the new one has not
#     written (with the control run without zeroing);
#   - the cost: the clear on a Llama-3-8B-shaped pool, and the engine's throughput on
#     models/pagoda-tiny with every request its own tenant, zeroing on vs off ("[zero-cost]" lines).
#
# Here:   tools/gpu/zero_on_free_call.sh bundle [BUILD_DIR]   (default build-cuda) packs DEST (default
#         .device/security2; a helper's calls send the session's checkout, so DEST=<that checkout>/.device/security2)
# There:  run(command="bash .device/security2/zero_on_free_call.sh run", carry=[".device/security2"])
# Results: $OUT/zero_on_free.txt.
set -uo pipefail
case "${1:-}" in
bundle)
  set -e
  here=$(cd "$(dirname "$0")/../.." && pwd)
  build=${2:-$here/build-cuda}
  dest=${DEST:-$here/.device/security2}
  ninja -C "$build" -j2 cuda_zero_on_free_tests
  rm -rf "$dest" && mkdir -p "$dest"
  stage=$(mktemp -d)
  "$here/scripts/device-bundle.sh" "$stage/bundle" "$build/tests/gpu_backend/cuda_zero_on_free_tests"
  strip "$stage"/bundle/bin/* || true
  git -C "$here" rev-parse --short HEAD > "$stage/bundle/commit"
  tar cJf "$dest/bundle.tar.xz" -C "$stage" bundle
  cp "$0" "$dest/zero_on_free_call.sh"
  rm -rf "$stage"
  ls -la "$dest"
  ;;
run)
  dir=$(cd "$(dirname "$0")" && pwd)
  tar xJf "$dir/bundle.tar.xz" -C /tmp
  export PAGODA_SOURCE_DIR=$PWD
  out=${OUT:-/tmp/zero_on_free}
  mkdir -p "$out"
  {
    echo "commit $(cat /tmp/bundle/commit), $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
    date -u
    /tmp/bundle/run.sh cuda_zero_on_free_tests
    echo "exit $?"
  } 2>&1 | tee "$out/zero_on_free.txt"
  ;;
*)
  echo "usage: $0 bundle [BUILD_DIR] | run" >&2
  exit 2
  ;;
esac
