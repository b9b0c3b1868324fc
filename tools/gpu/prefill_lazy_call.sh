#!/usr/bin/env bash
# The lazy O rescale (PAGODA_PREFILL_SM90=v4-lazy) against v4 at settled clocks: the prefill tests under
# v4-lazy, then three attention_bench processes over both schedules (16K, 4K, 16K at block 64) at the
# default 50 ms warm-up and one at 500 ms, with the SM clock, power and throttle reasons sampled beside
# them, the enforced power limit, and the consumers' SASS instruction mix of both kernels.
#   run(command="bash tools/gpu/prefill_lazy_call.sh", carry=[".device/final/bundle.tar.xz"])
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
bundle=$here/.device/final/bundle
[ -x "$bundle/run.sh" ] || tar xJf "$here/.device/final/bundle.tar.xz" -C "$here/.device/final"
export PAGODA_SOURCE_DIR=$here
out=${OUT:-/tmp/prefill-lazy}
mkdir -p "$out"
echo "date: $(date -u +%Y-%m-%dT%H:%MZ)  commit: $(cat "$bundle/commit")"
nvidia-smi -q -d POWER | grep -iE "power limit|power draw" | sort -u | head -8
for schedule in v4-lazy; do
  PAGODA_PREFILL_SM90=$schedule timeout 150 "$bundle/run.sh" paged_attention_gpu_tests --gtest_filter='Prefill/*' \
    > "$out/prefill_tests_$schedule.txt" 2>&1
  echo "prefill tests under $schedule: exit $? $(grep -E '^\[  PASSED|FAILED TEST' "$out/prefill_tests_$schedule.txt" | tr '\n' ' ')"
done
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,clocks_throttle_reasons.active --format=csv -lms 100 \
  > "$out/clocks.csv" 2>&1 &
smi=$!
only="=prefill v4 L=16384|=prefill v4-lazy L=16384|=prefill v4 L=4096|=prefill v4-lazy L=4096"
only="$only|=prefill v4 bs=64 L=16384|=prefill v4-lazy bs=64 L=16384|=prefill L=16384"
for warm in 50 50 500 50; do
  echo "== warm-up $warm ms"
  PAGODA_BENCH_WARMUP_MS=$warm timeout 150 "$bundle/run.sh" attention_bench --only "$only" 2>&1 |
    grep -E " us, " | sed -E 's/\(prefill[^)]*\)//' | cut -c1-80
done
kill $smi
awk -F', ' 'NR > 1 { n++; c += $2; p += $3 } END { printf "samples %d, mean SM clock %.0f MHz, mean power %.0f W\n", n, c / n, p / n }' "$out/clocks.csv"
cut -d, -f4 "$out/clocks.csv" | sort | uniq -c | sort -rn | head -4
gzip "$out/clocks.csv"
# SASS of the two ws kernels (instruction mix of the whole function).
export PATH=$PATH:/usr/local/cuda/bin
if command -v cuobjdump > /dev/null; then
  cuobjdump -sass -fun prefill_attention_sm90_ws_kernel "$bundle/bin/attention_bench" > "$out/ws_sass.txt" 2>&1 ||
    cuobjdump -sass "$bundle/bin/attention_bench" > "$out/all_sass.txt" 2>&1
  gzip -f "$out"/*sass.txt
fi
