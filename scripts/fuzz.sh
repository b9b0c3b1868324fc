#!/usr/bin/env bash
# Builds the libFuzzer targets (Clang, ASan + UBSan) and runs each for a
# bounded time on a copy of its committed corpus. A crash leaves its input in
# build-fuzz/crashes/<target>/; copy it to tests/fuzz/regressions/<target>/
# (the normal build's fuzz_regression_tests replays it) and fix the bug.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET=60] [TARGET...]
#   scripts/fuzz.sh 30 http_request openai_request
#
# Environment: BUILD_DIR (default build-fuzz), JOBS (default 2).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
shift || true
build="${BUILD_DIR:-build-fuzz}"
jobs="${JOBS:-2}"
targets=("$@")
if ((${#targets[@]} == 0)); then
  targets=(api_keys chat_template checkpoint_index http_request openai_request safetensors tokenizer_json)
fi
if [ ! -f "$build/build.ninja" ]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DPAGODA_FUZZ=ON -DPAGODA_CUDA=OFF \
    -DPAGODA_BUILD_BENCH=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo
fi
ninja -C "$build" -j"$jobs" "${targets[@]/#/fuzz_}"
status=0
for t in "${targets[@]}"; do
  work="$build/fuzz-work/$t"
  crashes="$build/crashes/$t"
  rm -rf "$work"
  mkdir -p "$work" "$crashes"
  cp tests/fuzz/corpus/"$t"/* "$work"/
  [ -d tests/fuzz/regressions/"$t" ] && cp tests/fuzz/regressions/"$t"/* "$work"/ 2>/dev/null || true
  echo "== fuzz_$t: ${seconds}s"
  if ! "$build/tests/fuzz/fuzz_$t" "$work" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
      -max_len=65536 -artifact_prefix="$crashes/" -print_final_stats=1 2>"$build/fuzz-$t.log"; then
    status=1
    echo "   CRASH: see $build/fuzz-$t.log and $crashes/"
  fi
  grep -E "^stat::number_of_executed_units|^stat::peak_rss_mb|^#[0-9]+ *DONE" "$build/fuzz-$t.log" | tr '\n' ' '
  echo
done
exit $status
