#!/usr/bin/env bash
# Issue #20, fp8 MLA decode through TMA (branch mlafp8): one device call.
#   bash .device/mlafp8/run.sh      (carry [".device/mlafp8"], timeout 300 s; ~240 s expected)
# 1. tests (mla_decode_call.sh tests): mla_decode_plan_tests; mla_decode_gpu_tests
#    in parallel processes (every TMA filter, the kTmaFp8 ones, the rest);
#    compute-sanitizer racecheck + synccheck over *TmaFp8Small; cuda_model_tests
#    *Deepseek* with the automatic choice and with PAGODA_MLA_DECODE_KERNEL=cp_async.
# 2. bench, alone on the GPU: bf16 default (tma_pingpong_2chain) at 16 heads,
#    then FlashMLA fp8 records, old path [cp_async] and new [tma_fp8] side by side
#    (64 x 4K and 8 x 32K at blocks of 64; 64 x 4K at blocks of 16).
# Logs under $OUT: summary.log (everything that matters), gpu_tests*.log,
# model_*.log, bench_bf16.log, bench_fp8.log.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-/tmp/mlafp8}
mkdir -p "$out"
export OUT=$out
start=$(date +%s)
SANITIZE_FILTERS='*TmaFp8Small' MODEL_KERNELS='cp_async' bash "$here/mla_decode_call.sh" tests
b=$here/bundle
cd "$here/../.."
unset PAGODA_MLA_DECODE_KERNEL
timeout 80 "$b/run.sh" mla_decode_bench --iters 20 --only "bf16 H=16 B=" --kernel tma_pingpong_2chain \
  --schedule whole > "$out/bench_bf16.log" 2>&1
echo "bench bf16 rc=$?" | tee -a "$out/summary.log"
timeout 100 "$b/run.sh" mla_decode_bench --iters 20 --only "fp8-656 H=16" --kernel all --schedule whole \
  > "$out/bench_fp8.log" 2>&1
echo "bench fp8-656 rc=$?" | tee -a "$out/summary.log"
grep -hE "^mla decode|ceiling|non-finite|error" "$out/bench_bf16.log" "$out/bench_fp8.log" | tee -a "$out/summary.log"
echo "total elapsed $(( $(date +%s) - start )) s" | tee -a "$out/summary.log"
