#!/usr/bin/env bash
# The KV tiers on the H200 in one device call (issues #18 and #19): the GPU tests of the host and disk
# tiers (cuda_host_tier_tests), the disk-tier restart-and-replay (disk_tier_call.sh) and the host
# tier's multi-turn benchmark (kv_offload_call.sh), from one bundle.
#
# Here:   tools/gpu/tiers_call.sh bundle [BUILD_DIR]   (default build-cuda, -DPAGODA_BUILD_BENCH=ON) packs
#         DEST (default .device/tiers; a helper's calls send the session's checkout, so DEST=<that
#         checkout>/.device/<branch>)
# There:  run(command="bash .device/<branch>/tiers_call.sh run", carry=[".device/<branch>"], timeout_s=220)
# Environment there: SKIP_TESTS=1, SKIP_DISK=1 (the replay), SKIP_BENCH=1; REPLAY_LIMIT, PROMPTS, PROMPT_TOKENS
# (disk_tier_call.sh; its pagoda_bench_kv_tiers limit is DISK_BENCH_LIMIT); BENCH_ARGS, BENCH_LIMIT
# (kv_offload_call.sh).
# Results: $OUT/summary.txt and tests.log (TESTS_LIMIT), $OUT/host/ (summary.txt, kv_offload.json, logs.tar.gz)
# and $OUT/disk/ (summary.txt, logs.tar.gz).
set -uo pipefail
case "${1:-}" in
bundle)
  set -e
  here=$(cd "$(dirname "$0")/../.." && pwd)
  build=${2:-$here/build-cuda}
  dest=${DEST:-$here/.device/tiers}
  ninja -C "$build" -j2 pagoda_cli pagoda_kv_offload_bench cuda_host_tier_tests pagoda_bench_kv_tiers
  rm -rf "$dest" && mkdir -p "$dest"
  stage=$(mktemp -d)
  "$here/scripts/device-bundle.sh" "$stage/bundle" "$build/pagoda" "$build/bench/gpu/pagoda_kv_offload_bench" \
    "$build/tests/gpu_backend/cuda_host_tier_tests" "$build/bench/kv/pagoda_bench_kv_tiers"
  strip "$stage"/bundle/bin/* || true
  git -C "$here" rev-parse --short HEAD > "$stage/bundle/commit"
  tar cJf "$dest/bundle.tar.xz" -C "$stage" bundle
  cp "$0" "$here/tools/gpu/kv_offload_call.sh" "$here/tools/gpu/disk_tier_call.sh" \
    "$here/bench/serve/disk_tier_replay.py" "$dest/"
  rm -rf "$stage"
  ls -la "$dest"
  ;;
run)
  dir=$(cd "$(dirname "$0")" && pwd)
  out=${OUT:-/tmp/tiers}
  mkdir -p "$out/host" "$out/disk"
  tar xJf "$dir/bundle.tar.xz" -C /tmp
  export PAGODA_SOURCE_DIR=$PWD
  # The tests first (host and disk tiers on the GPU), then the disk replay, then the host tier's benchmark.
  if [ -z "${SKIP_TESTS:-}" ]; then
    timeout ${TESTS_LIMIT:-120} /tmp/bundle/run.sh cuda_host_tier_tests > "$out/tests.log" 2>&1
    echo "cuda_host_tier_tests: exit $? $(grep -E '^\[  (PASSED|FAILED)  \]' "$out/tests.log" | tr '\n' ' ')" \
      | tee "$out/summary.txt"
    grep -E "Failure|Expected|Which is|error|OK \]|FAILED" "$out/tests.log" | head -40
  fi
  if [ -z "${SKIP_DISK:-}" ]; then
    OUT=$out/disk BENCH_LIMIT=${DISK_BENCH_LIMIT:-30} bash "$dir/disk_tier_call.sh" run
  fi
  if [ -z "${SKIP_BENCH:-}" ]; then
    OUT=$out/host SKIP_TESTS=1 SKIP_SERVE=1 bash "$dir/kv_offload_call.sh" run
  fi
  ;;
*)
  echo "usage: $0 bundle [BUILD_DIR] | run" >&2
  exit 2
  ;;
esac
