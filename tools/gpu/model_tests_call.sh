#!/usr/bin/env bash
# Every gpu-labelled test that reads the bundled model (models/pagoda-tiny), in one device call: what to
# run when the bundled model changes (docs/MODEL.md "Adopting a candidate"), on the working tree's model.
# TESTS selects binaries (default all below), FILTER a gtest filter, BUDGET the seconds (default 300).
# Bundle: DEST=/work/main/.device/<name> tools/gpu/model_tests_call.sh bundle; run (carry .device/<name>):
#   bash .device/<name>/model_tests_call.sh run
# Then, unless RECALL=0, `pagoda eval recall --device cuda` on the model (every policy, budgets 128 / 256 / 512).
# Results: $OUT/summary.txt (the recall table at its end) and logs.tar.gz (one log per binary).
set -u
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tools/gpu/call_bundle.sh
. "$here/call_bundle.sh"
if [ "${1:-}" = bundle ]; then
  build=$(cd "$here/../.." && pwd)/build
  ninja -C "$build" -j2 pagoda_cli cuda_model_tests cuda_tensor_parallel_tests cuda_cross_layer_share_tests \
    cuda_zero_on_free_tests cuda_kv_eviction_tests cuda_host_tier_tests fast_attention_gpu_tests cli_gpu_tests || exit 1
  call_bundle_pack "$0" "$build/pagoda" "$build/tests/gpu_backend/cuda_model_tests" \
    "$build/tests/gpu_backend/cuda_tensor_parallel_tests" "$build/tests/gpu_backend/cuda_cross_layer_share_tests" \
    "$build/tests/gpu_backend/cuda_zero_on_free_tests" "$build/tests/gpu_backend/cuda_kv_eviction_tests" \
    "$build/tests/gpu_backend/cuda_host_tier_tests" "$build/tests/gpu_backend/fast_attention_gpu_tests" \
    "$build/tests/e2e/cli_gpu_tests"; exit
fi
call_bundle_unpack
export PAGODA_CLI="$B pagoda"
start=$SECONDS; budget=${BUDGET:-300}
{
  echo "== binaries of $(cat "$(dirname "$B")/commit"); $(date -u +%FT%TZ); $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
  echo "== model: $(sha256sum models/pagoda-tiny/model.safetensors | cut -c1-16) $(grep -E '"(head_dim|num_key_value_heads|rope_theta)"' models/pagoda-tiny/config.json | tr -d ' \n')"
  for t in ${TESTS:-cuda_model_tests cuda_tensor_parallel_tests cuda_cross_layer_share_tests cuda_zero_on_free_tests cuda_kv_eviction_tests cuda_host_tier_tests fast_attention_gpu_tests cli_gpu_tests}; do
    left=$((budget - (SECONDS - start)))
    [ "$left" -lt 10 ] && { echo "== $t skipped (time)"; continue; }
    timeout "$left" "$B" "$t" --gtest_filter="${FILTER:-*}" > "$out/$t.log" 2>&1
    echo "== $t exit $? ($((SECONDS - start)) s): $(grep -E '^\[  (PASSED|FAILED) ' "$out/$t.log" | tr '\n' ' ')"
    grep -E "^\[  FAILED  \]|Failure$" -A3 "$out/$t.log" | head -40
  done
  # The eviction sweep on the GPU with the bundled model (docs/BENCHMARKS.md's eviction tables), RECALL=0 skips it.
  left=$((budget - (SECONDS - start)))
  if [ "${RECALL:-1}" = 1 ] && [ "$left" -gt 30 ]; then
    timeout "$left" $PAGODA_CLI eval recall --device cuda --model models/pagoda-tiny \
      --text-file models/pagoda-tiny/heldout.txt --policies none,streaming,h2o,snapkv,pyramidkv,entropy \
      --budgets 128,256,512 --context 1200 --depths 256,512,768,1000 --trials 16 > "$out/recall.md" 2> "$out/recall.log"
    echo "== eval recall (cuda) exit $? ($((SECONDS - start)) s)"; cat "$out/recall.md"
  fi
} 2>&1 | tee "$out/summary.txt"
cd "$out" && tar czf logs.tar.gz ./*.log 2>/dev/null && rm -f ./*.log
