#!/usr/bin/env bash
# Issue 23 (helper fp8b2): the new defaults, checked and measured: the e4m3 lm_head with fp8 weights
# (PAGODA_FP8_LM_HEAD=0 turns it off) and rope_qk + kv_write as one launch (PAGODA_FUSE_ROPE_KV=0 turns it
# off); the silu-into-down fusion is removed.
#  1. cuda_ops_tests (GEMV, rope, the fused rope + KV write, KV writes, silu_mul);
#  2. cuda_model_tests (all but DeepSeek's: the fusion bit for bit against =0 and the default, the fp8 lm_head, the fp8
#     checkpoints against the CPU reference with the bf16 head, GEMV dispatch, graphs);
#  3. pagoda eval perplexity --device cuda of models/pagoda-tiny on the decode path: bf16 (default fusion:
#     must equal the unfused run's mean NLL 3.857102129346934 of the previous call), fp8 default (e4m3
#     head), fp8 with PAGODA_FP8_LM_HEAD=0;
#  4. batch-1 ITL (8B shape, latency workload), A/B/A/B per default change: fp8 + fp8 KV default vs
#     PAGODA_FUSE_ROPE_KV=0 and vs PAGODA_FP8_LM_HEAD=0, bf16 + bf16 KV default vs PAGODA_FUSE_ROPE_KV=0;
#  5. with the time left: cuda_kv_eviction_tests and cuda_host_tier_tests (token eviction, the host tier's
#     layer waits: KV paths the fused write now serves by default).
# At most about 150 s; parts past the budget are skipped and say so.
# Needs .device/<name>/bundle.tar.xz (scripts/device-bundle.sh of cuda_ops_tests, cuda_model_tests, cuda_kv_eviction_tests, cuda_host_tier_tests,
# pagoda_gpu_engine_bench and pagoda, plus bundle/commit) beside this script, copied there as run.sh:
#   run(command="bash .device/<name>/run.sh", carry=[".device/<name>"], timeout_s=220).
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${OUT:-/tmp/fp8b2_call}; mkdir -p "$out"
tar xJf "$here/bundle.tar.xz" -C "$here"
export PAGODA_SOURCE_DIR=$root
cd "$root"
start=$SECONDS
budget=${BUDGET:-150}
left() { echo $((budget - (SECONDS - start))); }
B="$here/bundle/run.sh"
echo "== binaries of $(cat "$here/bundle/commit"); $(date -u +%FT%TZ); $(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader)"
timeout 35 "$B" cuda_ops_tests \
  --gtest_filter='*Gemv*:RopeQkKvWrite.*:KvWriteQuantized*:QuantizedKv.*:CudaOps.Rope*:CudaOps.SiluMul*:-GemvSpeed.*' \
  > "$out/ops.log" 2>&1
echo "== cuda_ops_tests exit $? ($((SECONDS - start)) s)"
grep -E "^\[  (PASSED|FAILED)|FAILED|Failure|Expected|Which is" "$out/ops.log" | head -20
timeout 50 "$B" cuda_model_tests \
  --gtest_filter='*Fp8*:*FixtureTest*:CudaModel.*:CudaModelRunner.*:*QuantizedKv*:CheckpointKvScales.*:-*Deepseek*' \
  > "$out/model.log" 2>&1
echo "== cuda_model_tests exit $? ($((SECONDS - start)) s)"
grep -E "^\[  (PASSED|FAILED)|FAILED|Failure|Expected|Which is|lm_head|pagoda_tiny" "$out/model.log" | tail -20
ppl() {  # ppl LABEL ENV... -- ARGS...
  local label=$1; shift
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  local limit=30; [ "$(left)" -lt $limit ] && limit=$(left)
  [ "$limit" -lt 10 ] && { echo "== ppl $label skipped (time)"; return; }
  env "${envs[@]}" timeout "$limit" "$B" pagoda eval perplexity --device cuda --model models/pagoda-tiny \
    --text-file models/pagoda-tiny/heldout.txt --prefill-chunk 1 --max-tokens 4096 --json "$@" \
    > "$out/ppl_$label.log" 2>&1
  echo "== ppl $label (${envs[*]} $*) exit $? ($((SECONDS - start)) s): $(grep -oE '"mean_nll":[0-9.]+,"perplexity":[0-9.]+' "$out/ppl_$label.log" | tail -1)"
  grep -iE "error|invalid" "$out/ppl_$label.log" | head -3
}
ppl bf16 DEFAULTS=1 --
ppl bf16_unfused PAGODA_FUSE_ROPE_KV=0 --
ppl fp8 DEFAULTS=1 -- --quantization fp8
ppl fp8_bf16_head PAGODA_FP8_LM_HEAD=0 -- --quantization fp8
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
  echo "== engine $label (${envs[*]}) exit $? ($((SECONDS - start)) s): $(grep -oE 'batch-1: [0-9.]+ ms per token \(ITL p50\)' "$out/engine_$label.log") | $(grep -oE 'decode-only steps: [0-9]+, [0-9.]+ ms each' "$out/engine_$label.log")"
  grep -iE "error|invalid" "$out/engine_$label.log" | head -3
}
FP8=(--kv-cache-dtype fp8 --quantization fp8)
BF16=(--kv-cache-dtype bf16)
engine fp8_default 22 DEFAULTS=1 -- "${FP8[@]}"
engine fp8_rope_kv0 22 PAGODA_FUSE_ROPE_KV=0 -- "${FP8[@]}"
engine fp8_head0 22 PAGODA_FP8_LM_HEAD=0 -- "${FP8[@]}"
engine fp8_default_b 22 DEFAULTS=1 -- "${FP8[@]}"
engine fp8_rope_kv0_b 22 PAGODA_FUSE_ROPE_KV=0 -- "${FP8[@]}"
engine fp8_head0_b 22 PAGODA_FP8_LM_HEAD=0 -- "${FP8[@]}"
engine bf16_default 22 DEFAULTS=1 -- "${BF16[@]}"
engine bf16_rope_kv0 22 PAGODA_FUSE_ROPE_KV=0 -- "${BF16[@]}"
engine bf16_default_b 22 DEFAULTS=1 -- "${BF16[@]}"
engine bf16_rope_kv0_b 22 PAGODA_FUSE_ROPE_KV=0 -- "${BF16[@]}"
engine fp8_old_defaults 22 PAGODA_FUSE_ROPE_KV=0 PAGODA_FP8_LM_HEAD=0 -- "${FP8[@]}"
engine fp8_default_c 22 DEFAULTS=1 -- "${FP8[@]}"
for t in cuda_kv_eviction_tests cuda_host_tier_tests; do  # the KV paths the fused write now serves by default
  limit=30; [ "$(left)" -lt $limit ] && limit=$(left)
  [ "$limit" -lt 8 ] && { echo "== $t skipped (time)"; continue; }
  timeout "$limit" "$B" $t > "$out/$t.log" 2>&1
  echo "== $t exit $? ($((SECONDS - start)) s)"
  grep -E "^\[  (PASSED|FAILED)|FAILED|Failure|Expected|Which is" "$out/$t.log" | head -8
done
cd "$out" && tar czf logs.tar.gz *.log 2>/dev/null && rm -f engine_*.log
echo "done ($((SECONDS - start)) s)"
