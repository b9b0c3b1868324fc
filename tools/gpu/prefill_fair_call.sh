#!/usr/bin/env bash
# pagoda's default prefill and PyTorch's cuDNN SDPA at L=16,384 (causal, GQA 32/8, d=128, bf16) under the
# same conditions: each in its own process, after 3 s idle, with the same warm-up (PAGODA_BENCH_WARMUP_MS
# = 50, then 2,000: clocks settled at the card's power cap; WARMUPS overrides), alternating which goes first; the SM clock,
# power and throttle reasons sampled every 100 ms beside them.
#   run(command="bash tools/gpu/prefill_fair_call.sh", carry=[".device/final/bundle.tar.xz"])
source "$(dirname "$0")/call_common.sh"
echo "date: $(date -u +%Y-%m-%dT%H:%MZ)  commit: $(cat "$bundle/commit")"
start_clock_sampling
pagoda() {
  sleep 3
  PAGODA_BENCH_WARMUP_MS=$1 timeout 120 "$bundle/run.sh" attention_bench --only "=prefill L=16384" 2>&1 |
    grep -E " us, " | sed -E 's/ \(prefill[^)]*\)//; s/^/pagoda  warm-up '"$1"' ms: /'
}
cudnn() {
  sleep 3
  PAGODA_BENCH_WARMUP_MS=$1 timeout 120 python3 "$here/bench/kernels/torch_baselines.py" prefill 16384 2>&1 |
    grep -E "^prefill" | sed -E 's/^/cudnn   warm-up '"$1"' ms: /'
}
for warm in ${WARMUPS:-50 2000}; do
  pagoda $warm; cudnn $warm
  cudnn $warm; pagoda $warm
done
stop_clock_sampling
