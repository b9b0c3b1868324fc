#!/usr/bin/env bash
# The whole test suite on a fresh machine: installs packages, fetches test data,
# builds, and runs every ctest label except gpu (run those with scripts/gpu-run.sh),
# then a CI-sized libFuzzer run of every fuzz target on its committed corpus
# (scripts/fuzz.sh: Clang, ASan + UBSan, build-fuzz/), failing on any crash,
# leak or sanitizer report. PAGODA_CI_FUZZ_SECONDS per target (default 20;
# 0 skips it). The fuzz build is most of its cost (about 20 min on 2 cores).
# Then the unit, kv, security and e2e tests built with ASan + UBSan in that
# same build (scripts/sanitize_tests.sh), failing on any sanitizer report,
# in a test or in a server it started (PAGODA_CI_SANITIZE=0 skips it;
# docs/SECURITY.md, "Fuzzing and sanitizers": what runs, its cost).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
[ -x scripts/fetch-test-data.sh ] && bash scripts/fetch-test-data.sh
bash scripts/build.sh
(cd build && ctest -LE gpu --output-on-failure -j "$(nproc)" --timeout 900)
fuzz_seconds="${PAGODA_CI_FUZZ_SECONDS:-20}"
if [ "$fuzz_seconds" -gt 0 ]; then
  JOBS="${PAGODA_BUILD_JOBS:-$(nproc)}" bash scripts/fuzz.sh "$fuzz_seconds"
fi
if [ "${PAGODA_CI_SANITIZE:-1}" != 0 ]; then
  JOBS="${PAGODA_BUILD_JOBS:-$(nproc)}" bash scripts/sanitize_tests.sh
fi
