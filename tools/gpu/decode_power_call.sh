#!/usr/bin/env bash
# Every gpu test, then bf16 and fp8 decode at B=8 L=32K at three warm-ups (PAGODA_BENCH_WARMUP_MS 0 / 50 / 500)
# with the SM clock, power and throttle reasons sampled beside them: does the power cap move the fp8 / bf16 ratio?
#   run(command="bash tools/gpu/decode_power_call.sh", carry=[".device/final/bundle.tar.xz"])
source "$(dirname "$0")/call_common.sh"
"$here/tools/gpu/final_suite.sh" tests | tail -9
mv "$out/logs.tar.gz" "$out/test_logs.tar.gz"; rm -f "$out/fixture.tar.gz"
start_clock_sampling
for warm in 0 50 500 0; do
  echo "== warm-up $warm ms"
  PAGODA_BENCH_WARMUP_MS=$warm "$bundle/run.sh" attention_bench --only "=decode B=8 L=32768|=decode fp8 B=8 L=32768|=decode B=64 L=4096|=decode fp8 B=64 L=4096" \
    --kv-dtype bf16,fp8 2>&1 | grep -E " us, " | cut -c1-60
done
stop_clock_sampling
