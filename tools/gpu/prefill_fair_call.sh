#!/usr/bin/env bash
# pagoda's default prefill and PyTorch's cuDNN SDPA at L=16,384 (causal, GQA 32/8, d=128, bf16) under the
# same conditions: each in its own process, after 3 s idle, with the same warm-up (PAGODA_BENCH_WARMUP_MS
# = 50, then 2,000: clocks settled at the card's power cap; WARMUPS overrides), alternating which goes first; the SM clock,
# power and throttle reasons sampled every 100 ms beside them.
#   run(command="bash tools/gpu/prefill_fair_call.sh", carry=[".device/final/bundle.tar.xz"])
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
bundle=$here/.device/final/bundle
[ -x "$bundle/run.sh" ] || tar xJf "$here/.device/final/bundle.tar.xz" -C "$here/.device/final"
out=${OUT:-/tmp/prefill-fair}
mkdir -p "$out"
echo "date: $(date -u +%Y-%m-%dT%H:%MZ)  commit: $(cat "$bundle/commit")"
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,clocks_throttle_reasons.active --format=csv -lms 100 \
  > "$out/clocks.csv" 2>&1 &
smi=$!
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
kill $smi
awk -F', ' 'NR > 1 { n++; c += $2; p += $3 } END { printf "samples %d, mean SM clock %.0f MHz, mean power %.0f W\n", n, c / n, p / n }' "$out/clocks.csv"
cut -d, -f4 "$out/clocks.csv" | sort | uniq -c | sort -rn | head -4
gzip "$out/clocks.csv"
