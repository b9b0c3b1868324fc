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
# Results: $OUT/host/ (summary.txt, kv_offload.json, logs.tar.gz) and $OUT/disk/ (summary.txt, logs.tar.gz).
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
  # The disk replay first (short), then the tests and the benchmark (kv_offload_call.sh runs both).
  if [ -z "${SKIP_DISK:-}" ]; then
    OUT=$out/disk BENCH_LIMIT=${DISK_BENCH_LIMIT:-30} bash "$dir/disk_tier_call.sh" run
  fi
  if [ -z "${SKIP_TESTS:-}" ] || [ -z "${SKIP_BENCH:-}" ]; then
    [ -n "${SKIP_BENCH:-}" ] && export BENCH_ARGS="--only transfers --methods kernel" BENCH_LIMIT=1
    OUT=$out/host SKIP_SERVE=1 bash "$dir/kv_offload_call.sh" run
  fi
  ;;
*)
  echo "usage: $0 bundle [BUILD_DIR] | run" >&2
  exit 2
  ;;
esac
