#!/usr/bin/env bash
# Prefill schedules at three warm-ups (PAGODA_BENCH_WARMUP_MS 0 / 50 / 500), with the SM clock, power and
# temperature sampled every 100 ms beside them: how much of a prefill figure is the clock it ran at.
#   run(command="bash tools/gpu/prefill_clocks_call.sh", carry=[".device/final/bundle.tar.xz"])
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
bundle=$here/.device/final/bundle
[ -x "$bundle/run.sh" ] || tar xJf "$here/.device/final/bundle.tar.xz" -C "$here/.device/final"
out=${OUT:-/tmp/prefill-clocks}
mkdir -p "$out"
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv -lms 100 \
  > "$out/clocks.csv" 2>&1 &
smi=$!
for warm in 0 50 500 0; do
  echo "== warm-up $warm ms"
  PAGODA_BENCH_WARMUP_MS=$warm "$bundle/run.sh" attention_bench \
    --only "=prefill L=16384|=prefill v4 L=16384|=prefill v4-lockstep L=16384|=prefill L=4096|=prefill v4 L=4096" 2>&1 |
    grep -E " us, " | sed -E 's/\(prefill[^)]*\)//' | cut -c1-80
done
kill $smi
awk -F', ' 'NR > 1 { n++; c += $2; p += $3; if ($2 + 0 < min || min == 0) min = $2 + 0 } END { printf "samples %d, mean SM clock %.0f MHz (min %d), mean power %.0f W\n", n, c / n, min, p / n }' "$out/clocks.csv"
cut -d, -f5 "$out/clocks.csv" | sort | uniq -c | sort -rn | head -5
gzip "$out/clocks.csv"
