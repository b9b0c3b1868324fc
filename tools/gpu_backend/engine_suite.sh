#!/usr/bin/env bash
# GPU sampling and the engine on the GPU, in one device call: the sampling and
# engine-on-GPU tests (plus the model tests as a regression check), then
# pagoda_gpu_engine_bench on the Llama-3-8B shape (random weights): the GPU
# sampler alone, batch-1 decode latency, 1,000 x 1,000/1,000 through the engine
# with top-p and greedy sampling on the GPU, and the shared-prefix TTFT with the
# prefix cache off and on.
#
#   tools/gpu_backend/engine_suite.sh bundle   # here: build, pack .device/gpusample/bundle.tar.xz
#   # device tool: run(command="tar xJf .device/gpusample/bundle.tar.xz -C .device/gpusample &&
#   #                  tools/gpu_backend/engine_suite.sh remote", carry=[".device/gpusample/bundle.tar.xz"])
#
# Environment: BUILD_DIR (build-gpusample), RANDOM_SECONDS (time cap per random
# run, 150), SAMPLINGS (top-p,greedy), WORKLOADS (sampler,latency,random,shared-prefix:
# the bench's order), PREFIX=0 drops shared-prefix, TESTS=0 skips the tests,
# MAX_NUM_SEQS (256).
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
bundle=$here/.device/gpusample/bundle
build=${BUILD_DIR:-$here/build-gpusample}

case "${1:-}" in
bundle)
  set -e
  cmake -S "$here" -B "$build" -G Ninja >/dev/null
  ninja -C "$build" -j2 cuda_sampling_tests pagoda_gpu_engine_bench
  bins=("$build/tests/gpu_backend/cuda_sampling_tests" "$build/bench/gpu/pagoda_gpu_engine_bench")
  if ninja -C "$build" -j2 cuda_model_tests; then bins+=("$build/tests/gpu_backend/cuda_model_tests"); fi
  rm -rf "$bundle"
  "$here/scripts/device-bundle.sh" "$bundle" "${bins[@]}"
  strip "$bundle"/bin/* || true
  git -C "$here" rev-parse --short HEAD > "$bundle/commit"
  tar cJf "$bundle.tar.xz" -C "$(dirname "$bundle")" "$(basename "$bundle")"
  ls -la "$bundle.tar.xz"
  ;;
remote)
  out=${OUT:-/tmp/engine-suite}
  mkdir -p "$out"
  export PAGODA_SOURCE_DIR=$here
  run="$bundle/run.sh"
  {
    echo "date: $(date -u +%Y-%m-%dT%H:%MZ)  commit: $(cat "$bundle/commit" 2>/dev/null)"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  } 2>&1 | tee "$out/machine.txt"
  if [ "${TESTS:-1}" = 1 ]; then
    for t in cuda_sampling_tests cuda_model_tests; do
      [ -x "$bundle/bin/$t" ] || continue
      timeout 150 "$run" "$t" --gtest_output="xml:$out/$t.xml" > "$out/$t.log" 2>&1
      echo "$t exit $?" | tee -a "$out/tests.txt"
      grep -E "^\[  (FAILED|PASSED) |^\[  SKIPPED \] [0-9]" "$out/$t.log" | head -20
    done
  fi
  secs=${RANDOM_SECONDS:-150}
  workloads=${WORKLOADS:-sampler,latency,random,shared-prefix}
  [ "${PREFIX:-1}" = 1 ] || workloads=$(echo "$workloads" | sed 's/,*shared-prefix//')
  timeout $(( 2 * secs + 200 )) "$run" pagoda_gpu_engine_bench --config tools/gpu_backend/llama3_8b_config.json \
    --workload "$workloads" --sampling "${SAMPLINGS:-top-p,greedy}" --max-num-seqs "${MAX_NUM_SEQS:-256}" \
    --max-seconds "$secs" --prefix-max-seconds 60 --json "$out/engine_bench.json" 2>&1 | tee "$out/engine_bench.log" |
    grep -v "^\[" 
  echo "engine bench exit ${PIPESTATUS[0]}" | tee -a "$out/tests.txt"
  ;;
*)
  echo "usage: $0 bundle|remote" >&2
  exit 2
  ;;
esac
