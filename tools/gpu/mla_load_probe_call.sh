#!/usr/bin/env bash
# Issue 20: the MLA decode kernel's loading pattern alone (bench/kernels/mla_load_probe.cu) beside
# the real kernel (mla_decode_bench, bf16 16 heads, the automatic kernel), in one call.
# Bundle: DEST=/work/main/.device/<name> tools/gpu/mla_load_probe_call.sh bundle
# Run (carry .device/<name>): [PROBE_ARGS=...] [BENCH_ARGS=...] bash .device/<name>/mla_load_probe_call.sh run
set -u
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tools/gpu/call_bundle.sh
. "$here/call_bundle.sh"
if [ "${1:-}" = bundle ]; then
  build=$(cd "$here/../.." && pwd)/build
  call_bundle_pack "$0" "$build/bench/kernels/mla_load_probe" "$build/bench/kernels/mla_decode_bench"; exit
fi
call_bundle_unpack
{
  echo "== binaries of $(cat "$(dirname "$B")/commit"); $(date -u +%FT%TZ); $(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader)"
  echo "== the real kernel (mla_decode_bench --only 'bf16 H=16' --schedule whole ${BENCH_ARGS:-})"
  timeout 120 "$B" mla_decode_bench --iters 20 --only "bf16 H=16" --schedule whole ${BENCH_ARGS:-} 2>&1 | tail -40
  echo "== probe, shuffled pages (64 x 4K) ${PROBE_ARGS:-}"
  timeout 120 "$B" mla_load_probe ${PROBE_ARGS:-} 2>&1
  echo "== probe, 8 x 32K-sized pool again (the same 262,144 tokens), sequential pages"
  timeout 120 "$B" mla_load_probe --sequential ${PROBE_ARGS:-} 2>&1
  echo "== the real kernel again"
  timeout 120 "$B" mla_decode_bench --iters 20 --only "bf16 H=16" --schedule whole ${BENCH_ARGS:-} 2>&1 | tail -40
} 2>&1 | tee "$out/probe.log"
