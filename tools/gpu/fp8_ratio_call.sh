#!/usr/bin/env bash
# The quantized / bf16 decode ratio (issue 9's goal shape, B=8 L=32K) and its neighbours, after the
# attention tests: quantized + paged decode tests (SANITIZE=1: the quantized ones under compute-sanitizer
# memcheck too), then two rounds of one attention_bench process each over KV_DTYPES (default bf16, fp8
# (per-vector records), fp8-tensor (per-tensor scales, no records) and int8), at the automatic split
# and at splits 4096 / 8192.
#   run(command="bash tools/gpu/fp8_ratio_call.sh", carry=[".device/final/bundle.tar.xz"])
source "$(dirname "$0")/call_common.sh"
echo "date: $(date -u +%Y-%m-%dT%H:%MZ)  commit: $(cat "$bundle/commit")"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
for t in ${TESTS-quantized_attention_gpu_tests paged_attention_gpu_tests}; do
  timeout 200 "$bundle/run.sh" "$t" > "$out/$t.log" 2>&1
  echo "$t: exit $?, $(grep -E '^\[  (PASSED|FAILED)  \]' "$out/$t.log" | tr '\n' ' ')"
done
if [ "${SANITIZE:-0}" = 1 ]; then
  LD_LIBRARY_PATH="$bundle/lib:/usr/local/cuda/lib64" timeout 300 /usr/local/cuda/bin/compute-sanitizer --tool memcheck \
    --print-limit 5 "$bundle/bin/quantized_attention_gpu_tests" > "$out/memcheck_quantized.txt" 2>&1
  echo "memcheck quantized: exit $? $(grep -E 'ERROR SUMMARY|PASSED|FAILED' "$out/memcheck_quantized.txt" | tr '\n' ' ')"
fi
kv=${KV_DTYPES:-bf16,fp8,fp8-tensor,int8}
names=()
IFS=, read -r -a dtypes <<< "$kv"
for dtype in "${dtypes[@]}"; do
  tag="decode $dtype"; [ "$dtype" = bf16 ] && tag=decode
  for shape in "B=64 L=4096" "B=8 L=32768" "B=256 L=1024" "B=8 L=32768 split 4096" "B=8 L=32768 split 8192" \
               "MHA 32 d=64 B=64 L=2048" "cuda-cores B=8 L=32768"; do
    names+=("=$tag $shape")
  done
done
only=$(IFS='|'; echo "${names[*]}")
for round in ${ROUNDS-1 2}; do
  echo "== round $round"
  timeout 200 "$bundle/run.sh" attention_bench --only "$only" --kv-dtype "$kv" \
    --json "$out/round$round.json" 2>&1 | grep -E " us, " | sed -E 's/ \(decode, /  (/; s/, rel L2 vs naive/, rel/'
done
