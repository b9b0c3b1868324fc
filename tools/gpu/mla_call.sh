#!/usr/bin/env bash
# DeepSeek (MLA + MoE) on the GPU machine, from a bundle packed here with
#   tools/gpu/mla_call.sh bundle       # BUILD_DIR (default build-cuda): gpu tests, pagoda, the engine bench
# then, on the GPU machine (device call, carry .device/mla-runner):
#   .device/mla-runner/mla_call.sh tests   # DeepSeek gpu tests, the whole cuda_model_tests, the CLI gpu tests
#   .device/mla-runner/mla_call.sh bench   # DeepSeek-V2-Lite shape, random weights, 1K/1K: MLA KV at full
#                                          # concurrency vs the concurrency MHA KV of the same shape would fit
# Logs go to $OUT.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
[ "${1:-}" = bundle ] || [ -x "$here/bundle/run.sh" ] || tar xJf "$here/bundle.tar.xz" -C "$here"
case "${1:-}" in
bundle)
  set -e
  root=$(cd "$here/../.." && pwd)
  build=${BUILD_DIR:-$root/build-cuda}
  dest=${DEST:-/work/main/.device/mla-runner}
  ninja -C "$build" -j2 pagoda_cli cuda_model_tests cli_gpu_tests pagoda_gpu_engine_bench
  rm -rf "$dest"
  "$root/scripts/device-bundle.sh" "$dest/bundle" "$build/pagoda" "$build/tests/gpu_backend/cuda_model_tests" \
    "$build/tests/e2e/cli_gpu_tests" "$build/bench/gpu/pagoda_gpu_engine_bench"
  strip "$dest"/bundle/bin/* || true
  tar cJf "$dest/bundle.tar.xz" -C "$dest" bundle && rm -rf "$dest/bundle"
  cp "$0" "$dest/mla_call.sh"
  cp "$root/tools/gpu_backend/deepseek_v2_lite_config.json" "$dest/"
  git -C "$root" rev-parse --short HEAD > "$dest/commit"
  du -sh "$dest"
  ;;
tests)
  root=$(cd "$here/../.." && pwd)
  export PAGODA_SOURCE_DIR=$root PAGODA_V2_LITE_CONFIG=$here/deepseek_v2_lite_config.json
  out=${OUT:-/tmp/mla}
  mkdir -p "$out"
  cd "$root"
  { echo "commit $(cat "$here/commit")  $(date -u +%FT%TZ)"; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; } | tee "$out/tests.log"
  timeout 100 "$here/bundle/run.sh" cuda_model_tests --gtest_filter='*Deepseek*' --gtest_also_run_disabled_tests >> "$out/tests.log" 2>&1
  echo "cuda_model_tests (DeepSeek) rc=$?"
  grep -E "Failure|FAILED|PASSED|Which is|actual:|^step" "$out/tests.log" | head -40
  grep -E "figure.*(V2-Lite|random|block16_bf16:|block16_fp8:)" "$out/tests.log"
  export PAGODA_CLI="$here/bundle/run.sh pagoda"
  timeout 120 "$here/bundle/run.sh" cli_gpu_tests --gtest_filter='*Deepseek*' > "$out/cli.log" 2>&1
  echo "cli_gpu_tests (DeepSeek) rc=$?"
  grep -E "Failure|FAILED|PASSED|greedy tokens equal|KV cache|attention MLA|weights" "$out/cli.log" | head -20
  ;;
bench)
  root=$(cd "$here/../.." && pwd)
  out=${OUT:-/tmp/mla}
  mkdir -p "$out"
  cfg=$here/deepseek_v2_lite_config.json
  secs=${SECONDS_PER_RUN:-60}
  for run in ${RUNS:-mla:512 mha:160}; do
    name=${run%%:*}; seqs=${run##*:}
    echo "== $name: max-num-seqs $seqs, ${secs} s" | tee -a "$out/bench.log"
    timeout $((secs + 90)) "$here/bundle/run.sh" pagoda_gpu_engine_bench --config "$cfg" --workload random \
      --sampling greedy --num-requests 1000 --input-len 1000 --output-len 1000 --max-num-seqs "$seqs" \
      --max-seconds "$secs" --kv-cache-dtype ${KV:-bf16} --json "$out/bench_$name.json" >> "$out/bench.log" 2>&1
    echo "rc=$?"; tail -22 "$out/bench.log"
  done
  ;;
*) echo "usage: $0 bundle|tests|bench" >&2; exit 2 ;;
esac
