#!/usr/bin/env bash
# The gpu-labelled CLI tests (cli_gpu_tests: generate/serve --device cuda) on the
# GPU machine, in one device call.
#
#   tests/e2e/run_cli_gpu_tests.sh bundle   # here: build pagoda + cli_gpu_tests, pack them with
#                                           # their Debian libraries into .device/cli/bundle.tar.xz
#   tests/e2e/run_cli_gpu_tests.sh remote   # on the GPU machine (repository root): run them,
#                                           # logs under $OUT
#
# The device call:
#   run(command="tests/e2e/run_cli_gpu_tests.sh remote", carry=[".device/cli/bundle.tar.xz"])
# Environment: BUILD_DIR (default build-cli).
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
dir=$here/.device/cli
build=${BUILD_DIR:-$here/build-cli}

case "${1:-}" in
bundle)
  set -e
  cmake -S "$here" -B "$build" -G Ninja >/dev/null
  ninja -C "$build" -j2 pagoda_cli cli_gpu_tests
  rm -rf "$dir/bundle"
  mkdir -p "$dir"
  "$here/scripts/device-bundle.sh" "$dir/bundle" "$build/pagoda" "$build/tests/e2e/cli_gpu_tests"
  strip "$dir/bundle"/bin/* || true
  git -C "$here" rev-parse --short HEAD > "$dir/bundle/commit"
  tar cJf "$dir/bundle.tar.xz" -C "$dir" bundle
  ls -la "$dir/bundle.tar.xz"
  ;;
remote)
  out=${OUT:-/tmp/cli-gpu}
  mkdir -p "$out"
  tar xJf "$dir/bundle.tar.xz" -C "$dir"
  export PAGODA_SOURCE_DIR=$here
  export PAGODA_CLI="$dir/bundle/run.sh pagoda"
  {
    echo "commit: $(cat "$dir/bundle/commit")"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    $PAGODA_CLI --version
  } 2>&1 | tee "$out/machine.txt"
  timeout 500 "$dir/bundle/run.sh" cli_gpu_tests --gtest_output="xml:$out/cli_gpu_tests.xml" 2>&1 \
    | tee "$out/cli_gpu_tests.log"
  exit "${PIPESTATUS[0]}"
  ;;
*)
  echo "usage: $0 bundle|remote" >&2
  exit 2
  ;;
esac
