#!/usr/bin/env bash
# The fp8 / bf16 decode ratio (issue 9's goal shape, B=8 L=32K) and its neighbours, after the
# attention tests: quantized + paged decode tests and the plan tests, then two rounds of one
# attention_bench process each over bf16, fp8 (per-vector records), fp8-tensor (per-tensor
# scales, no records) and int8, at the automatic split and at splits 4096 / 8192.
#   run(command="bash tools/gpu/fp8_ratio_call.sh", carry=[".device/final/bundle.tar.xz"])
source "$(dirname "$0")/call_common.sh"
echo "date: $(date -u +%Y-%m-%dT%H:%MZ)  commit: $(cat "$bundle/commit")"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
for t in ${TESTS-attention_plan_tests quantized_attention_gpu_tests paged_attention_gpu_tests}; do
  timeout 200 "$bundle/run.sh" "$t" > "$out/$t.log" 2>&1
  echo "$t: exit $?, $(grep -E '^\[  (PASSED|FAILED)  \]' "$out/$t.log" | tr '\n' ' ')"
done
names=()
for tag in decode "decode fp8" "decode fp8-tensor" "decode int8"; do
  for shape in "B=64 L=4096" "B=8 L=32768" "B=256 L=1024" "B=8 L=32768 split 4096" "B=8 L=32768 split 8192"; do
    names+=("=$tag $shape")
  done
done
only=$(IFS='|'; echo "${names[*]}")
for round in ${ROUNDS-1 2}; do
  echo "== round $round"
  timeout 200 "$bundle/run.sh" attention_bench --only "$only" --kv-dtype bf16,fp8,fp8-tensor,int8 \
    --json "$out/round$round.json" 2>&1 | grep -E " us, " | sed -E 's/ \(decode, /  (/; s/, rel L2 vs naive/, rel/'
done
