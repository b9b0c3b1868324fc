#!/usr/bin/env bash
# Prefill schedules at three warm-ups (PAGODA_BENCH_WARMUP_MS 0 / 50 / 500), with the SM clock, power and
# throttle reasons sampled every 100 ms beside them: how much of a prefill figure is the clock it ran at.
#   run(command="bash tools/gpu/prefill_clocks_call.sh", carry=[".device/final/bundle.tar.xz"])
source "$(dirname "$0")/call_common.sh"
start_clock_sampling
for warm in 0 50 500 0; do
  echo "== warm-up $warm ms"
  PAGODA_BENCH_WARMUP_MS=$warm "$bundle/run.sh" attention_bench \
    --only "=prefill L=16384|=prefill v4 L=16384|=prefill v4-lockstep L=16384|=prefill L=4096|=prefill v4 L=4096" 2>&1 |
    grep -E " us, " | sed -E 's/\(prefill[^)]*\)//' | cut -c1-80
done
stop_clock_sampling
