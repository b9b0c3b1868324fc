# Sourced by the tools/gpu/*_call.sh scripts (on the GPU machine): strict mode, $here (the tree),
# $bundle (final_suite.sh's bundle, unpacked once), $out ($OUT, or /tmp/<script name>), and the
# clock sampler: start_clock_sampling, then stop_clock_sampling prints the mean SM clock and power and
# the throttle reasons seen, and leaves $out/clocks.csv.gz (100 ms samples).
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
bundle=$here/.device/final/bundle
[ -x "$bundle/run.sh" ] || tar xJf "$here/.device/final/bundle.tar.xz" -C "$here/.device/final"
export PAGODA_SOURCE_DIR=$here
out=${OUT:-/tmp/$(basename "$0" .sh)}
mkdir -p "$out"

start_clock_sampling() {
  nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,clocks_throttle_reasons.active --format=csv -lms 100 \
    > "$out/clocks.csv" 2>&1 &
  clock_sampler=$!
}

stop_clock_sampling() {
  kill "$clock_sampler"
  awk -F', ' 'NR > 1 { n++; c += $2; p += $3; if ($2 + 0 < min || min == 0) min = $2 + 0 }
    END { printf "samples %d, mean SM clock %.0f MHz (min %d), mean power %.0f W\n", n, c / n, min, p / n }' \
    "$out/clocks.csv"
  echo "throttle reasons (samples):"
  cut -d, -f4 "$out/clocks.csv" | sort | uniq -c | sort -rn | head -4
  gzip -f "$out/clocks.csv"
}
