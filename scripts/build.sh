#!/usr/bin/env bash
# Configures and builds pagoda into build/ (Release-ish: -O2 with line info).
# Extra arguments go to cmake's configure step, e.g. -DPAGODA_NATIVE=ON.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja "$@" >/dev/null
ninja -C build -j "${PAGODA_BUILD_JOBS:-$(nproc)}"
