#!/usr/bin/env bash
# Issue 23 (helper fp8w6): the fp8 GEMV's load depths (gemv_fp8 depth 1/2/4, PAGODA_GEMV_FP8_DEPTH) and the
# e4m3 lm_head (PAGODA_FP8_LM_HEAD): their gpu tests, model tests (CudaModel.Fp8LmHead, the GEMV dispatch, the fp8 checkpoints), GemvSpeed (every depth per
# Llama-3-8B shape, the fp8 lm_head GEMV), the engine's batch-1 ITL with fp8 weights + fp8 KV per knob, the bf16 ITL with PAGODA_PDL
# 0/1/0/1 (pdl_verify.sh's A/B, to settle PDL's default). About 150 s;
# parts past the budget are skipped and say so.
# Needs .device/<name>/bundle.tar.xz (scripts/device-bundle.sh of cuda_ops_tests, cuda_model_tests and
# pagoda_gpu_engine_bench, plus bundle/commit) beside this script, copied there as run.sh:
#   run(command="bash .device/<name>/run.sh", carry=[".device/<name>"], timeout_s=220).
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${OUT:-/tmp/fp8w6_call}; mkdir -p "$out"
tar xJf "$here/bundle.tar.xz" -C "$here"
export PAGODA_SOURCE_DIR=$root
cd "$root"
start=$SECONDS
budget=${BUDGET:-195}
left() { echo $((budget - (SECONDS - start))); }
B="$here/bundle/run.sh"
echo "== binaries of $(cat "$here/bundle/commit"); $(date -u +%FT%TZ); $(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader)"
timeout 40 "$B" cuda_ops_tests --gtest_filter='*Gemv*:-GemvSpeed.*' > "$out/ops.log" 2>&1
echo "== cuda_ops_tests *Gemv* exit $? ($((SECONDS - start)) s)"
grep -E "^\[  (PASSED|FAILED)|FAILED|Failure|Expected|Which is|depth" "$out/ops.log" | head -30
lim=45; [ "$(left)" -lt $lim ] && lim=$(left)
if [ "$lim" -ge 15 ]; then
  timeout "$lim" "$B" cuda_model_tests --gtest_filter='CudaModel.Fp8LmHead*:CudaModel.Gemv*:*Fp8*' > "$out/model.log" 2>&1
  echo "== cuda_model_tests exit $? ($((SECONDS - start)) s)"
  grep -E "^\[  (PASSED|FAILED)|FAILED|Failure|Expected|Which is|figure" "$out/model.log" | tail -16
else
  echo "== cuda_model_tests skipped (time)"
fi
timeout 45 "$B" cuda_ops_tests --gtest_filter='GemvSpeed.*' > "$out/speed.log" 2>&1
echo "== GemvSpeed exit $? ($((SECONDS - start)) s)"
# Every depth line, the lm_head lines (bf16 GEMV vs the e4m3 one) and the m = 1 bf16 lines (the full table
# is in speed.log, logs.tar.gz).
grep -E "gemv-speed" "$out/speed.log" | grep -E "fp8 depth|lm_head|m=1 .*bf16" | sed -E 's/ +/ /g; s/gemv-speed //; s/ (us|GB\/s)//g'
engine() {  # engine LABEL LIMIT ENV... -- ARGS...
  local label=$1 limit=$2; shift 2
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  [ "$(left)" -lt "$limit" ] && limit=$(left)
  [ "$limit" -lt 12 ] && { echo "== engine $label skipped (time)"; return; }
  env "${envs[@]}" timeout "$limit" "$B" pagoda_gpu_engine_bench \
    --config tools/gpu_backend/llama3_8b_config.json --sampling greedy --input-len 128 --output-len 128 \
    --latency-tokens 128 --workload latency "$@" > "$out/engine_$label.log" 2>&1
  echo "== engine $label (${envs[*]}) exit $? ($((SECONDS - start)) s): $(grep -oE 'batch-1: [0-9.]+ ms per token \(ITL p50\)' "$out/engine_$label.log") | $(grep -E 'step time' "$out/engine_$label.log" | head -1)"
  grep -iE "error|invalid" "$out/engine_$label.log" | head -3
}
FP8=(--kv-cache-dtype fp8 --quantization fp8)
BF16=(--kv-cache-dtype bf16)
engine fp8_d1 25 PAGODA_GEMV_FP8_DEPTH=1 PAGODA_FP8_LM_HEAD=0 -- "${FP8[@]}"
engine fp8_d2 25 PAGODA_GEMV_FP8_DEPTH=2 PAGODA_FP8_LM_HEAD=0 -- "${FP8[@]}"
engine fp8_d4 25 PAGODA_GEMV_FP8_DEPTH=4 PAGODA_FP8_LM_HEAD=0 -- "${FP8[@]}"
engine fp8_d1_head 25 PAGODA_GEMV_FP8_DEPTH=1 PAGODA_FP8_LM_HEAD=1 -- "${FP8[@]}"
engine fp8_d2_head 25 PAGODA_GEMV_FP8_DEPTH=2 PAGODA_FP8_LM_HEAD=1 -- "${FP8[@]}"
engine bf16_pdl0 25 PAGODA_PDL=0 -- "${BF16[@]}"
engine bf16_pdl1 25 PAGODA_PDL=1 -- "${BF16[@]}"
engine bf16_pdl0b 25 PAGODA_PDL=0 -- "${BF16[@]}"
engine bf16_pdl1b 25 PAGODA_PDL=1 -- "${BF16[@]}"
engine fp8_d1b 25 PAGODA_GEMV_FP8_DEPTH=1 PAGODA_FP8_LM_HEAD=0 -- "${FP8[@]}"
cd "$out" && tar czf logs.tar.gz *.log 2>/dev/null && rm -f engine_*.log
echo "done ($((SECONDS - start)) s)"
