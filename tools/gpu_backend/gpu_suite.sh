#!/usr/bin/env bash
# The CUDA backend's tests and benchmarks on the GPU machine, in one device call.
#
#   tools/gpu_backend/gpu_suite.sh bundle     # here: build the gpu tests, the benchmark
#                                             # and pagoda, pack them (+ their Debian
#                                             # libraries) into .device/cuda-bundle
#   tools/gpu_backend/gpu_suite.sh remote     # on the GPU machine (repository root, $OUT
#                                             # set): run everything, log under $OUT,
#                                             # print a table
#
# The device call (the archive keeps the carry under 64 MiB):
#   run(command="tar xJf .device/cuda-bundle.tar.xz -C .device && tools/gpu_backend/gpu_suite.sh remote",
#       carry=[".device/cuda-bundle.tar.xz"])
# WITH_ENGINE=1 (bundle) + ENGINE_BENCH=1 (remote) add the engine-driven runs; GRAPH_BENCH=1
# (remote) adds the decode-in-graphs attention comparison.
# Environment: BUILD_DIR (default build-cuda), BENCH_SECONDS (throughput time cap, 200),
# NUM_REQUESTS / INPUT_LEN / OUTPUT_LEN (1000 / 1000 / 1000), MAX_NUM_SEQS (256).
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
bundle=$here/.device/cuda-bundle
build=${BUILD_DIR:-$here/build-cuda}

case "${1:-}" in
bundle)
  set -e
  cmake -S "$here" -B "$build" -G Ninja >/dev/null
  ninja -C "$build" -j2 cuda_ops_tests cuda_model_tests cuda_backend_host_tests pagoda_gpu_bench \
    fast_attention_gpu_tests fast_attention_plan_tests pagoda_graph_attention_bench
  # The CLI links every module; WITH_CLI=1 adds it (for `pagoda --version` there).
  extra=()
  if [ "${WITH_CLI:-0}" = 1 ] && ninja -C "$build" -j2 pagoda_cli; then extra+=("$build/pagoda"); fi
  # The engine-driven benchmark (links the engine); WITH_ENGINE=1 adds it.
  if [ "${WITH_ENGINE:-0}" = 1 ] && ninja -C "$build" -j2 pagoda_gpu_engine_bench; then
    extra+=("$build/bench/gpu/pagoda_gpu_engine_bench")
  fi
  rm -rf "$bundle"
  "$here/scripts/device-bundle.sh" "$bundle" "$build/tests/gpu_backend/cuda_ops_tests" \
    "$build/tests/gpu_backend/cuda_model_tests" "$build/tests/gpu_backend/cuda_backend_host_tests" \
    "$build/bench/gpu/pagoda_gpu_bench" "$build/tests/gpu_backend/fast_attention_gpu_tests" \
    "$build/tests/gpu_backend/fast_attention_plan_tests" "$build/bench/gpu/pagoda_graph_attention_bench" \
    "${extra[@]}"
  strip "$bundle"/bin/* || true
  git -C "$here" rev-parse --short HEAD > "$bundle/commit"
  # The device tool carries at most 64 MiB with the working tree: carry the archive.
  tar cJf "$bundle.tar.xz" -C "$(dirname "$bundle")" "$(basename "$bundle")"
  ls -la "$bundle.tar.xz"
  ;;
remote)
  out=${OUT:-/tmp/gpu-suite}
  mkdir -p "$out"
  export PAGODA_SOURCE_DIR=$here
  run="$bundle/run.sh"
  {
    echo "date: $(date -u +%Y-%m-%dT%H:%MZ)  commit: $(cat "$bundle/commit" 2>/dev/null)"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    [ -x "$bundle/bin/pagoda" ] && "$run" pagoda --version
  } 2>&1 | tee "$out/machine.txt"
  for t in cuda_backend_host_tests cuda_ops_tests cuda_model_tests fast_attention_plan_tests fast_attention_gpu_tests; do
    timeout 240 "$run" "$t" --gtest_output="xml:$out/$t.xml" > "$out/$t.log" 2>&1
    echo "$t exit $?" >> "$out/tests.txt"
  done
  # Decode step time in graphs, builtin vs backend/cuda/attention attention (about 30 s): GRAPH_BENCH=1.
  if [ "${GRAPH_BENCH:-0}" = 1 ]; then
    timeout 120 "$run" pagoda_graph_attention_bench --config tools/gpu_backend/llama3_8b_config.json \
      --json "$out/graph_attention.json" > "$out/graph_attention.log" 2>&1
    echo "graph attention bench exit $?" >> "$out/tests.txt"
  fi
  # One benchmark process (one 8B model on the GPU): attention check, batch-1 latency,
  # static-batch decode sweep, then the throughput run. If it dies (e.g. a kernel
  # fault), run again without backend/cuda/attention's attention and a shorter time cap.
  bench() {
    local limit=$1; shift
    timeout "$limit" "$run" pagoda_gpu_bench --config tools/gpu_backend/llama3_8b_config.json --load-format random \
      --mode all --num-requests "${NUM_REQUESTS:-1000}" --input-len "${INPUT_LEN:-1000}" \
      --output-len "${OUTPUT_LEN:-1000}" --max-num-seqs "${MAX_NUM_SEQS:-256}" "$@"
  }
  secs=${BENCH_SECONDS:-200}
  bench $(( secs + 150 )) --max-seconds "$secs" --json "$out/bench.json" > "$out/bench.log" 2>&1
  echo "bench exit $?" >> "$out/tests.txt"
  if ! grep -q '"throughput"' "$out/bench.json" 2>/dev/null; then
    bench 200 --fast-attention off --max-graph-batch 0 --max-seconds 90 --json "$out/bench_fallback.json" \
      > "$out/bench_fallback.log" 2>&1
    echo "bench (fallback, --fast-attention off) exit $?" >> "$out/tests.txt"
  fi
  # Through the engine (WITH_ENGINE=1 bundles it): the random workload, then shared prefix on/off.
  if [ -x "$bundle/bin/pagoda_gpu_engine_bench" ] && [ "${ENGINE_BENCH:-0}" = 1 ]; then
    timeout $(( secs + 60 )) "$run" pagoda_gpu_engine_bench --config tools/gpu_backend/llama3_8b_config.json \
      --workload random --num-requests "${NUM_REQUESTS:-1000}" --input-len "${INPUT_LEN:-1000}" \
      --output-len "${OUTPUT_LEN:-1000}" --max-num-seqs "${MAX_NUM_SEQS:-256}" --max-seconds "$secs" \
      --json "$out/engine_random.json" > "$out/engine_random.log" 2>&1
    echo "engine bench (random) exit $?" >> "$out/tests.txt"
    timeout 300 "$run" pagoda_gpu_engine_bench --config tools/gpu_backend/llama3_8b_config.json \
      --workload shared-prefix --num-requests 256 --prefix-len 2000 --input-len 100 --output-len 64 \
      --max-seconds 120 --json "$out/engine_prefix.json" > "$out/engine_prefix.log" 2>&1
    echo "engine bench (shared prefix) exit $?" >> "$out/tests.txt"
  fi
  python3 "$here/tools/gpu_backend/print_table.py" "$out" || cat "$out"/*.txt
  ;;
*)
  echo "usage: $0 bundle|remote" >&2
  exit 2
  ;;
esac
