#!/usr/bin/env bash
# Builds the unit and security tests with AddressSanitizer + UBSan
# (-DPAGODA_SANITIZE=ON, GCC with ccache) and runs them: the CI-sized
# sanitizer run. Any report fails the run (halt_on_error; UBSan does not recover).
#
#   scripts/sanitize_tests.sh [CTEST_LABEL_REGEX=security|unit]
#
# Environment: BUILD_DIR (default build-asan), JOBS (default 2), TARGETS
# (default: the test binaries of core, kv, tokenizer, chat, engine, server,
# fuzz regressions).
set -euo pipefail
cd "$(dirname "$0")/.."
label="${1:-security|unit}"
build="${BUILD_DIR:-build-asan}"
jobs="${JOBS:-2}"
targets=${TARGETS:-"core_tests kv_tests kv_security_tests pagoda_tokenizer_unit_test chat_jinja_compatibility_test
  chat_template_test chat_template_errors_test chat_value_test engine_unit_tests engine_security_tests
  server_unit_tests server_security_tests http_front_tests fuzz_regression_tests"}
if [ ! -f "$build/build.ninja" ]; then
  cmake -S . -B "$build" -G Ninja -DPAGODA_SANITIZE=ON -DPAGODA_CUDA=OFF -DPAGODA_BUILD_BENCH=OFF \
    -DCMAKE_CXX_COMPILER_LAUNCHER=ccache
fi
# shellcheck disable=SC2086
ninja -C "$build" -j"$jobs" $targets
export ASAN_OPTIONS="halt_on_error=1:detect_leaks=1:abort_on_error=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
# Only the binaries built above have registered tests (gtest discovery runs after each link).
ctest --test-dir "$build" -L "$label" -j"$jobs" --output-on-failure --timeout 600 2>&1 | tee "$build/sanitize-tests.log"
