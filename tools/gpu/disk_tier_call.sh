#!/usr/bin/env bash
# The KV tiers below the host on the H200 (issue #19), in one device call (for the lead; not run by
# the helper that wrote it):
#   1. restart-and-replay through `pagoda serve --device cuda` with --kv-offload-disk: the Llama-3-8B
#      shape with random weights (fp8 KV), 16 token prompts of 2,048 tokens; run 1 computes on an empty
#      disk tier, run 2 is a fresh process on the same directory, run 3 a fresh process without it:
#      TTFT and prefill tokens saved (bench/serve/disk_tier_replay.py);
#   2. pagoda_bench_kv_tiers: disk read / write GB/s per block size on the GPU host's disk (page cache).
# The GPU host has no redis-server, so the redis tier is measured on the CPU box only.
#
# Here:   tools/gpu/disk_tier_call.sh bundle [BUILD_DIR]   (default build-cuda, configured with
#         -DPAGODA_BUILD_BENCH=ON) packs DEST (default .device/disktier)
# There:  run(command="bash .device/disktier/disk_tier_call.sh run", carry=[".device/disktier"], timeout_s=240)
# Results: $OUT/summary.txt, logs in $OUT/logs.tar.gz.
set -uo pipefail
case "${1:-}" in
bundle)
  set -e
  here=$(cd "$(dirname "$0")/../.." && pwd)
  build=${2:-$here/build-cuda}
  dest=${DEST:-$here/.device/disktier}
  ninja -C "$build" -j2 pagoda_cli pagoda_bench_kv_tiers
  rm -rf "$dest" && mkdir -p "$dest"
  stage=$(mktemp -d)
  "$here/scripts/device-bundle.sh" "$stage/bundle" "$build/pagoda" "$build/bench/kv/pagoda_bench_kv_tiers"
  strip "$stage"/bundle/bin/* || true
  git -C "$here" rev-parse --short HEAD > "$stage/bundle/commit"
  tar cJf "$dest/bundle.tar.xz" -C "$stage" bundle
  cp "$0" "$dest/disk_tier_call.sh"
  cp "$here/bench/serve/disk_tier_replay.py" "$dest/"
  rm -rf "$stage"
  ls -la "$dest"
  ;;
run)
  dir=$(cd "$(dirname "$0")" && pwd)
  tar xJf "$dir/bundle.tar.xz" -C /tmp
  bundle=/tmp/bundle
  out=${OUT:-/tmp/disk_tier}
  mkdir -p "$out/logs"
  {
    echo "date: $(date -u +%Y-%m-%dT%H:%MZ)  commit: $(cat "$bundle/commit")"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    df -h /tmp | tail -1
  } | tee "$out/summary.txt"
  timeout ${REPLAY_LIMIT:-170} python3 "$dir/disk_tier_replay.py" --pagoda "$bundle/run.sh pagoda" \
    --token-prompts ${PROMPT_TOKENS:-2048} --prompts ${PROMPTS:-16} --offload-memory 8GiB --disk-size 40GiB --dir /tmp \
    --serve-args "--device cuda --load-format random --config tools/gpu_backend/llama3_8b_config.json --kv-cache-dtype fp8" \
    > "$out/logs/replay.log" 2>&1
  echo "replay: exit $?" | tee -a "$out/summary.txt"
  tail -8 "$out/logs/replay.log" | tee -a "$out/summary.txt"
  mkdir -p /tmp/disk_tier_bench
  timeout ${BENCH_LIMIT:-50} "$bundle/run.sh" pagoda_bench_kv_tiers --disk /tmp/disk_tier_bench --total-mib 512 \
    > "$out/logs/bench.log" 2>&1
  echo "bench: exit $?" | tee -a "$out/summary.txt"
  cat "$out/logs/bench.log" | tee -a "$out/summary.txt"
  rm -rf /tmp/disk_tier_bench
  tar czf "$out/logs.tar.gz" -C "$out" logs
  rm -rf "$out/logs"
  ;;
*)
  echo "usage: $0 bundle [BUILD_DIR] | run" >&2
  exit 2
  ;;
esac
