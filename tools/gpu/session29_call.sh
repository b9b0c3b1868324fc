#!/usr/bin/env bash
# One device call for session 29's checks (issues #20 and #23):
#   1. cli_gpu_tests (generate / serve --device cuda against transformers) with --overlap-steps at its new
#      default (auto: on over CUDA);
#   2. overlap_stress_call.sh: a mixed HTTP load on `pagoda serve --device cuda`, overlap off then default;
#   3. the MLA decode plan / GPU tests and the DeepSeek model suite with the automatic kernel choice (swizzled
#      pages take the bulk-copy kernel at pages of 64), the suite once more on swizzled pages;
#   4. the engine's 1,000 x 1,000 (fp8 + fp8 KV) with the new default: how many steps overlapped.
# Bundle: tools/gpu/session29_call.sh bundle (-> .device/s29); run (carry .device/s29):
#   bash .device/s29/session29_call.sh
set -u
if [ "${1:-}" = bundle ]; then
  here=$(cd "$(dirname "$0")" && pwd); root=$(cd "$here/../.." && pwd); cd "$root" || exit 1
  . tools/gpu/call_bundle.sh
  b=$root/build
  DEST=$root/.device/s29 call_bundle_pack tools/gpu/session29_call.sh "$b/pagoda" "$b/tests/e2e/cli_gpu_tests" \
    "$b/tests/gpu/mla_decode_gpu_tests" "$b/tests/gpu/mla_decode_plan_tests" "$b/tests/gpu_backend/cuda_model_tests" \
    "$b/bench/kernels/mla_decode_bench" "$b/bench/gpu/pagoda_gpu_engine_bench"
  cp tools/gpu/overlap_stress_call.sh .device/s29/; exit
fi
. "$(dirname "$0")/call_bundle.sh"
call_bundle_unpack
t0=$SECONDS
echo "== binaries of $(cat "$(dirname "$B")/commit"); $(date -u +%FT%TZ); $(nvidia-smi --query-gpu=name --format=csv,noheader)"
PAGODA_CLI="$B pagoda" timeout 240 "$B" cli_gpu_tests > "$out/cli_gpu_tests.log" 2>&1
echo "cli_gpu_tests rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$out/cli_gpu_tests.log" | tr '\n' ' ') ($((SECONDS - t0)) s)"
grep -E "^\[  FAILED|Failure" "$out/cli_gpu_tests.log" | head -10
# The stress script finds this bundle beside it (.device/s29/bundle), already unpacked.
OUT=$out/stress timeout 240 bash "$(dirname "$0")/overlap_stress_call.sh" 2>&1 | tail -14
echo "== stress done at $((SECONDS - t0)) s"
call_gtest mla_decode_plan_tests 60 mla_decode_plan_tests
call_gtest mla_decode_gpu_tests 200 mla_decode_gpu_tests
call_gtest cuda_model_tests_deepseek 150 cuda_model_tests --gtest_filter='*Deepseek*'
PAGODA_MLA_LATENT_PAGES=swizzled128 call_gtest cuda_model_tests_deepseek_swizzled 150 cuda_model_tests --gtest_filter='*Deepseek*'
echo "== tests done at $((SECONDS - t0)) s"
# How many of a 1,000 x 1,000 run's steps overlap, and why not the rest (fp8 + fp8 KV, 512 running).
timeout 150 "$B" pagoda_gpu_engine_bench --config tools/gpu_backend/llama3_8b_config.json --sampling greedy \
  --workload random --num-requests 1000 --max-num-seqs 512 --max-tokens-per-step 16384 --input-len 1000 \
  --output-len 1000 --quantization fp8 --kv-cache-dtype fp8 --json "$out/1k.json" > "$out/1k.log" 2>&1
echo "1k rc=$?"; grep -E "output tok/s|steps" "$out/1k.log" | head -12
python3 -c "import json,sys; r=json.load(open(sys.argv[1])); r=r[0] if isinstance(r,list) else r; print({k: v for k, v in r.items() if not isinstance(v, (list, dict))})" "$out/1k.json" 2>&1 | head -5
echo "== end at $((SECONDS - t0)) s"
