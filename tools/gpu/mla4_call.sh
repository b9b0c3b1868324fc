#!/usr/bin/env bash
# DeepSeek tensor-core MLA prefill + CUDA graphs capped by batch (issue #20), on the GPU machine,
# from a bundle packed here with
#   tools/gpu/mla4_call.sh bundle      # BUILD_DIR (default build-cuda) -> /work/main/.device/mla4
# then in a device call (carry .device/mla4):
#   .device/mla4/mla4_call.sh tests    # model gpu tests (prefill vs simple kernel, fixtures), the CLI's
#                                      # DeepSeek tests, step times (prefill, eager vs graph decode sweep)
#   .device/mla4/mla4_call.sh bench    # the engine at 1K/1K: MLA vs MHA-sized concurrency (WITH_TESTS=1: the
#                                      # tests first, WITH_TIMING=1: step times too)
#   .device/mla4/mla4_call.sh final    # the prefill / fast-decode model tests and the fixture figure printer,
#                                      # the 1K/1K runs, then step times up to batch 64
# Logs go to $OUT.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
[ "${1:-}" = bundle ] || [ -x "$here/bundle/run.sh" ] || tar xzf "$here/bundle.tar.gz" -C "$here"
root=$(cd "$here/../.." && pwd)
out=${OUT:-/tmp/mla4}
export PAGODA_SOURCE_DIR=$root PAGODA_V2_LITE_CONFIG=$here/deepseek_v2_lite_config.json
timing() {
  timeout "${1:-90}" "$here/bundle/run.sh" cuda_model_tests --gtest_filter='CudaDeepseekTiming*' \
    --gtest_also_run_disabled_tests > "$out/timing.log" 2>&1
  echo "timing rc=$?"; grep -E "figure|FAILED|Failure" "$out/timing.log"
}
case "${1:-}" in
bundle)
  set -e
  build=${BUILD_DIR:-$root/build-cuda}
  dest=${DEST:-/work/main/.device/mla4}
  ninja -C "$build" -j2 pagoda_cli cuda_model_tests cli_gpu_tests pagoda_gpu_engine_bench
  rm -rf "$dest"
  "$root/scripts/device-bundle.sh" "$dest/bundle" "$build/pagoda" "$build/tests/gpu_backend/cuda_model_tests" \
    "$build/tests/e2e/cli_gpu_tests" "$build/bench/gpu/pagoda_gpu_engine_bench"
  strip "$dest"/bundle/bin/* || true
  tar czf "$dest/bundle.tar.gz" -C "$dest" bundle && rm -rf "$dest/bundle"
  cp "$0" "$dest/mla4_call.sh"
  cp "$root/tools/gpu_backend/deepseek_v2_lite_config.json" "$dest/"
  git -C "$root" rev-parse --short HEAD > "$dest/commit"
  du -sh "$dest"
  ;;
tests)
  mkdir -p "$out"
  cd "$root"
  { echo "commit $(cat "$here/commit")  $(date -u +%FT%TZ)"; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; } | tee "$out/tests.log"
  timeout 100 "$here/bundle/run.sh" cuda_model_tests --gtest_filter='*Deepseek*:-*Timing*' >> "$out/tests.log" 2>&1
  echo "cuda_model_tests (DeepSeek) rc=$?"
  grep -E "Failure|FAILED|PASSED|Which is|actual:|figure" "$out/tests.log" | head -60
  export PAGODA_CLI="$here/bundle/run.sh pagoda"
  timeout 25 "$here/bundle/run.sh" cli_gpu_tests --gtest_filter='*Deepseek*' > "$out/cli.log" 2>&1
  echo "cli_gpu_tests (DeepSeek) rc=$?"
  grep -E "Failure|FAILED|PASSED" "$out/cli.log" | head -10
  [ -n "${SKIP_TIMING:-}" ] || PAGODA_V2_LITE_MAX_SEQS=${SEQS:-1024} timing 80
  ;;
bench)
  mkdir -p "$out"
  cd "$root"
  echo "commit $(cat "$here/commit")  $(date -u +%FT%TZ)" | tee "$out/bench.log"
  [ -n "${WITH_TESTS:-}" ] && SKIP_TIMING=1 "$0" tests
  [ -z "${WITH_TIMING:-}" ] || PAGODA_V2_LITE_MAX_SEQS=${SEQS:-1024} timing 80
  cfg=$here/deepseek_v2_lite_config.json
  for run in ${RUNS:-mla:512:512:85 mha:182:182:50}; do
    IFS=: read -r name seqs reqs secs <<< "$run"
    echo "== $name: max-num-seqs $seqs, $reqs requests 1000/1000, ${secs} s" | tee -a "$out/bench.log"
    timeout $((secs + 20)) "$here/bundle/run.sh" pagoda_gpu_engine_bench --config "$cfg" --workload random \
      --sampling greedy --num-requests "$reqs" --input-len 1000 --output-len 1000 --max-num-seqs "$seqs" \
      --max-seconds "$secs" --kv-cache-dtype ${KV:-bf16} --json "$out/bench_$name.json" >> "$out/bench.log" 2>&1
    echo "rc=$?"; tail -8 "$out/bench.log"
  done
  ;;
final)
  mkdir -p "$out"
  cd "$root"
  echo "commit $(cat "$here/commit")  $(date -u +%FT%TZ)" | tee "$out/final.log"
  timeout 30 "$here/bundle/run.sh" cuda_model_tests --gtest_also_run_disabled_tests \
    --gtest_filter='*DeepseekFixtureTest.PrefillAndTeacher*:*TensorCorePrefillRows*:*DeepseekPrefill*:*FastDecode*' \
    >> "$out/final.log" 2>&1
  echo "cuda_model_tests rc=$?"; grep -E "FAILED|PASSED|figure.*(prompt rows|MLA prefill vs)" "$out/final.log" | cut -c1-600 | head -40
  RUNS=${RUNS:-mla:512:512:75 mha:182:182:45} "$0" bench
  PAGODA_V2_LITE_MAX_SEQS=64 timing 45
  ;;
*) echo "usage: $0 bundle|tests|bench|final" >&2; exit 2 ;;
esac
