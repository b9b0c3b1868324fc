#!/usr/bin/env bash
# Issue 23 (helper fp8w4), what its second call left unrun: the fp8 checkpoint fixtures of CudaFp8ModelTest
# with PDL off (the default) and on, the PDL graph test, and the batch-1 PDL A/B repeated with the order
# swapped (on, off, on, off per weight type). About 80 s.
# Needs .device/<name>/bundle.tar.xz (scripts/device-bundle.sh of cuda_ops_tests, cuda_model_tests and
# pagoda_gpu_engine_bench, plus bundle/commit) beside this script, copied there as verify.sh:
#   run(command="bash .device/<name>/verify.sh", carry=[".device/<name>"], timeout_s=150)
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${OUT:-/tmp/pdl_verify}; mkdir -p "$out"
tar xJf "$here/bundle.tar.xz" -C "$here"
export PAGODA_SOURCE_DIR=$root
cd "$root"
B="$here/bundle/run.sh"
echo "== binaries of $(cat "$here/bundle/commit"); $(date -u +%FT%TZ)"
for pdl in 0 1; do
  PAGODA_PDL=$pdl timeout 40 "$B" cuda_model_tests --gtest_filter='*Fp8*' > "$out/fp8_model_pdl$pdl.log" 2>&1
  echo "== cuda_model_tests *Fp8* PAGODA_PDL=$pdl exit $?"
  grep -E "^\[  (PASSED|FAILED)|figure|Failure" "$out/fp8_model_pdl$pdl.log" | head -12
done
timeout 30 "$B" cuda_ops_tests --gtest_filter='*GemvPdl*:CudaOps.Rope*' > "$out/ops.log" 2>&1
echo "== cuda_ops_tests exit $?"; grep -E "^\[  (PASSED|FAILED)|Failure" "$out/ops.log"
for weights in bf16 fp8; do
  args=(--kv-cache-dtype bf16); [ "$weights" = fp8 ] && args=(--kv-cache-dtype fp8 --quantization fp8)
  for pdl in 1 0 1 0; do
    PAGODA_PDL=$pdl timeout 25 "$B" pagoda_gpu_engine_bench --config tools/gpu_backend/llama3_8b_config.json \
      --sampling greedy --input-len 128 --output-len 128 --latency-tokens 128 --workload latency "${args[@]}" \
      > "$out/engine.log" 2>&1
    echo "$weights PAGODA_PDL=$pdl: $(grep -oE 'batch-1: [0-9.]+ ms per token \(ITL p50\)' "$out/engine.log")"
  done
done
