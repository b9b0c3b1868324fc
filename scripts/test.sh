#!/usr/bin/env bash
# The whole test suite on a fresh machine: installs packages, fetches test data,
# builds, and runs every ctest label except gpu (run those with scripts/gpu-run.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
[ -x scripts/fetch-test-data.sh ] && bash scripts/fetch-test-data.sh
bash scripts/build.sh
cd build
ctest -LE gpu --output-on-failure -j "$(nproc)" --timeout 900
