#!/usr/bin/env bash
# Issue 20: the MLA decode kernel's loading pattern alone (bench/kernels/mla_load_probe.cu: the kernel's
# tensor-map boxes, the same with tiles prefetched into L2 ahead, 1-D bulk copies of whole pages, the
# plain-load read ceiling) beside the real kernel
# (mla_decode_bench, bf16 16 heads, tma_pingpong_2chain, with and without its merge pass), in one call.
# Bundle: DEST=/work/main/.device/<name> tools/gpu/mla_load_probe_call.sh bundle
# Run (carry .device/<name>): [CYCLES="0 3000 5500"] [PROBE_ARGS=...] [BENCH_ARGS=...] bash .device/<name>/mla_load_probe_call.sh run
set -u
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tools/gpu/call_bundle.sh
. "$here/call_bundle.sh"
if [ "${1:-}" = bundle ]; then
  build=$(cd "$here/../.." && pwd)/build
  call_bundle_pack "$0" "$build/bench/kernels/mla_load_probe" "$build/bench/kernels/mla_decode_bench"; exit
fi
call_bundle_unpack
bench() { timeout 120 "$B" mla_decode_bench --iters 20 --only "bf16 H=16" --schedule whole --kernel tma_pingpong_2chain "$@" ${BENCH_ARGS:-} 2>&1; }
probe() { timeout 150 "$B" mla_load_probe --cycles "${CYCLES:-0 3000 5500}" "$@" ${PROBE_ARGS:-} 2>&1; }
{
  echo "== binaries of $(cat "$(dirname "$B")/commit"); $(date -u +%FT%TZ); $(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader)"
  echo "== the real kernel (automatic: tma_pingpong_2chain), decode + merge, then the decode pass alone (--merge none)"
  bench
  bench --merge none
  echo "== probe, shuffled pages (64 x 4K): the kernel's tensor-map boxes (22 slots; L2 prefetch ahead), then 1-D bulk copies of whole pages"
  echo "   (each run ends with the plain-load read ceiling of the same pages)"
  probe --only "producer 18 slots"
  probe --only "producer 22 slots"
  probe --only "L2 +"
  probe --only bulk
  echo "== probe, sequential pages"
  probe --sequential --only "producer 18 slots"
  probe --sequential --only "bulk 2 stages x 1"
  echo "== the real kernel again"
  bench
  bench --merge none
} 2>&1 | tee "$out/probe.log"
