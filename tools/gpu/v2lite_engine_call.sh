#!/usr/bin/env bash
# The DeepSeek-V2-Lite-shaped engine run (random weights, fp8 latent cache) with each
# MLA decode kernel, several times: the check that found the tma_fp8 staging ring's
# intermittent CUDA error 719 (docs/KERNELS.md v17) and its A/B against cp.async.
#   tools/gpu/v2lite_engine_call.sh bundle   # BUILD_DIR (default build) -> DEST (default .device/v2lite)
# then a device call with carry [".device/v2lite"] (~45 s a run):
#   KERNELS="auto cp_async" RUNS=2 .device/v2lite/v2lite_engine_call.sh run
# Each run: 512 requests of 1,000 prompt + OUTPUT_LEN (default 1,000) tokens, 512 sequences,
# greedy, --kv-cache-dtype fp8 (KV_DTYPE). summary.log in $OUT (default /tmp/v2lite) has, per
# run, the failed requests (with the first error) or the engine's tok/s and decode-only step time.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
case "${1:-}" in
bundle)
  set -e
  root=$(cd "$here/../.." && pwd)
  build=${BUILD_DIR:-$root/build}
  dest=${DEST:-$root/.device/v2lite}
  ninja -C "$build" -j2 pagoda_gpu_engine_bench
  rm -rf "$dest"
  "$root/scripts/device-bundle.sh" "$dest/bundle" "$build/bench/gpu/pagoda_gpu_engine_bench"
  strip "$dest"/bundle/bin/* || true
  cp "$root/tools/gpu_backend/deepseek_v2_lite_config.json" "$dest/bundle/"
  tar cJf "$dest/bundle.tar.xz" -C "$dest" bundle && rm -rf "$dest/bundle"
  cp "$0" "$dest/v2lite_engine_call.sh"
  git -C "$root" rev-parse --short HEAD > "$dest/commit"
  du -sh "$dest"
  ;;
run)
  [ -x "$here/bundle/run.sh" ] || tar xJf "$here/bundle.tar.xz" -C "$here"
  b=$here/bundle
  out=${OUT:-/tmp/v2lite}; mkdir -p "$out"; S=$out/summary.log
  { echo "commit $(cat "$here/commit" 2>/dev/null) $(date -u +%FT%TZ)"
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } | tee -a "$S"
  for run in $(seq 1 "${RUNS:-2}"); do
    for k in ${KERNELS:-auto cp_async}; do
      t0=$SECONDS; log=$out/engine_$k.log
      PAGODA_MLA_DECODE_KERNEL=$k timeout "${RUN_TIMEOUT:-100}" "$b/run.sh" pagoda_gpu_engine_bench \
        --config "$b/deepseek_v2_lite_config.json" --workload random --sampling greedy --no-step-profile \
        --kv-cache-dtype "${KV_DTYPE:-fp8}" --num-requests 512 --input-len 1000 \
        --output-len "${OUTPUT_LEN:-1000}" --max-num-seqs 512 > "$log" 2>&1
      rc=$?
      echo "== run $run kernel $k rc=$rc $((SECONDS - t0)) s: failed requests $(grep -c ' failed: ' "$log")" \
        "$(grep -m1 -E 'CUDA error' "$log" | cut -c1-160)" | tee -a "$S"
      grep -m2 -E '^engine|decode-only' "$log" | cut -c1-230 | tee -a "$S"
    done
  done
  ;;
*)
  sed -n '2,10p' "$0"; exit 2 ;;
esac
