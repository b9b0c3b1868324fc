#!/usr/bin/env bash
# The CI-sized AddressSanitizer + UBSan (+ LeakSanitizer) run: builds the
# unit, kv, security and e2e tests and the `pagoda` binary the e2e tests start,
# all sanitized, and runs those labels (not gpu, not reference: the numeric
# reference tests are long under ASan and hold no parsing or server code).
# Any sanitizer report fails the run, in a test binary or in a server it
# started: reports go to $BUILD_DIR/sanitizer-logs/ (log_path), and the run
# fails if that directory is not empty at the end, whatever the tests said.
#
#   scripts/sanitize_tests.sh
#
# Environment: BUILD_DIR (default build-fuzz: the same configuration as
# scripts/fuzz.sh, Clang with -DPAGODA_FUZZ=ON, which sanitizes every target,
# so CI compiles the library once for both), JOBS (default 2), TARGETS
# (default: every test binary of those labels, and pagoda_cli), LABELS
# (default unit|kv|security|e2e).
set -euo pipefail
cd "$(dirname "$0")/.."
build="${BUILD_DIR:-build-fuzz}"
jobs="${JOBS:-2}"
labels="${LABELS:-unit|kv|security|e2e}"
targets=${TARGETS:-"pagoda_cli core_tests kv_tests kv_property_tests kv_security_tests kvcalc_tests kvstore_tests kv_tier_settings_tests
  pagoda_tokenizer_unit_test pagoda_grammar_unit_test chat_jinja_compatibility_test chat_template_test
  chat_template_errors_test chat_value_test chat_render_chat_cli_test model_tests tensor_shard_test kernels_tests
  thread_communicator_test cpu_host_tier_tests cpu_lower_tier_tests kv_eviction_tests cross_layer_share_tests
  engine_unit_tests engine_security_tests server_unit_tests server_security_tests http_front_tests
  fuzz_regression_tests eval_tests router_unit_tests router_e2e_tests router_front_e2e_tests server_http_e2e_tests
  server_host_tier_e2e_tests openai_client_e2e_tests cli_runner_flags_e2e_tests server_security_e2e_tests
  server_user_isolation_e2e_tests server_timing_e2e_tests server_soak_e2e_tests structured_output_e2e_tests
  deepseek_cli_e2e_tests server_disk_tier_e2e_tests"}
if [ ! -f "$build/build.ninja" ]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DPAGODA_FUZZ=ON -DPAGODA_CUDA=OFF \
    -DPAGODA_BUILD_BENCH=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo
fi
# shellcheck disable=SC2086
ninja -C "$build" -j"$jobs" $targets
logs="$(pwd)/$build/sanitizer-logs"
rm -rf "$logs"
mkdir -p "$logs"
# Children (the servers the e2e tests start) inherit these. abort_on_error:
# a report ends the process with SIGABRT, which no test mistakes for success.
export ASAN_OPTIONS="halt_on_error=1:detect_leaks=1:abort_on_error=1:log_path=$logs/asan"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:log_path=$logs/ubsan"
# The soak test's resident-memory check is off: ASan's quarantine keeps up
# to 256 MiB of freed memory resident by design (the server's RSS grew by
# 243 MiB in 12 s under it); LeakSanitizer checks the server at its exit.
export PAGODA_SOAK_RSS_LIMIT_KIB=0
# Excluded, each for a reason (ctest -E):
#   (none)
exclude="${EXCLUDE:-^$}"
status=0
# Only the binaries built above have registered tests (gtest discovery runs after each link).
ctest --test-dir "$build" -L "$labels" -LE 'gpu|reference' -E "$exclude" -j"$jobs" --output-on-failure \
  --timeout 900 2>&1 | tee "$build/sanitize-tests.log" || status=1
if [ -n "$(ls -A "$logs")" ]; then
  echo "sanitizer reports (in $logs):"
  for f in "$logs"/*; do
    echo "== $f"
    head -c 20000 "$f"
  done
  status=1
fi
exit $status
