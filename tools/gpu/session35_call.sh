#!/usr/bin/env bash
# One device call for session 35 (issue 20): the merge folded into the MLA decode kernel
# (MlaMergeMode::kFused, mla_decode_merge.cuh) against the merge pass. PARTS in order (default "tests goal"):
#   tests   mla_decode_plan_tests; mla_decode_gpu_tests' fused-merge, bulk, merge and graph cases (the folded
#           merge gives the merge pass's bits); cuda_model_tests *Deepseek* with PAGODA_MLA_MERGE=fused, on
#           token-major and on swizzled pages;
#   goal    issue 20's figure: mla_decode_bench bf16 H=16, 64 x 4K and 8 x 32K at pages of 64, the bulk kernel on
#           swizzled pages and the tensor-map kernel on token-major pages, each with the merge pass (plain) and
#           folded (fused), interleaved, ROUNDS rounds (default 3);
#   small   the same four and cp_async on either layout at pages of 16 (64 x 4K), ROUNDS rounds;
#   fp8     FlashMLA's fp8 records at the goal shapes: tma_fp8, merge pass vs folded, ROUNDS rounds;
#   engine  the V2-Lite-shaped engine (256 x 1,000 in / 300 out, bf16 latent), each of ENGINE_RUNS ("PAGES BLOCK
#           MERGE" triples, default: token-major and swizzled128 at pages of 16 with the merge pass, at 64 with
#           the pass and swizzled128 at 64 folded), once.
# Bundle: tools/gpu/session35_call.sh bundle (-> .device/s35); run (carry .device/s35):
#   [PARTS=...] [TOTAL=560] bash .device/s35/session35_call.sh
set -u
if [ "${1:-}" = bundle ]; then
  here=$(cd "$(dirname "$0")" && pwd); root=$(cd "$here/../.." && pwd); cd "$root" || exit 1
  . tools/gpu/call_bundle.sh
  b=$root/build
  DEST=$root/.device/s35 call_bundle_pack tools/gpu/session35_call.sh "$b/bench/gpu/pagoda_gpu_engine_bench" \
    "$b/bench/kernels/mla_decode_bench" "$b/tests/gpu/mla_decode_gpu_tests" "$b/tests/gpu/mla_decode_plan_tests" \
    "$b/tests/gpu_backend/cuda_model_tests"
  exit
fi
. "$(dirname "$0")/call_bundle.sh"
call_bundle_unpack
t0=$SECONDS; total=${TOTAL:-560}
gpu=$(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | head -1)
echo "== binaries of $(cat "$(dirname "$B")/commit"); $(date -u +%FT%TZ); $gpu"
parts=" ${PARTS:-tests goal} "
rounds=${ROUNDS:-3}
if [[ $parts == *" tests "* ]]; then
  call_gtest mla_decode_plan_tests 60 mla_decode_plan_tests
  call_gtest mla_decode_gpu_tests 200 mla_decode_gpu_tests \
    --gtest_filter='*Fused*:*Bulk*:*ProgrammaticMerge*:*TmaPingPongSmall*:*TmaGraphPlans*:*FixedMode*:*FixedSmall*'
  grep -E "fused == pass" "$out/mla_decode_gpu_tests.log" | sed 's/  */ /g' | head -40
  PAGODA_MLA_MERGE=fused call_gtest cuda_model_tests_deepseek_fused 200 cuda_model_tests --gtest_filter='*Deepseek*'
  PAGODA_MLA_MERGE=fused PAGODA_MLA_LATENT_PAGES=swizzled128 call_gtest cuda_model_tests_deepseek_fused_swizzled 200 \
    cuda_model_tests --gtest_filter='*Deepseek*'
  echo "== tests done at $((SECONDS - t0)) s"
fi
# bench_round ROUND "SHAPE" "PAGES KERNEL MERGE"...: mla_decode_bench bf16 H=16 at SHAPE, one run per triple.
bench_round() {
  local round=$1 shape=$2 run; shift 2
  for run in "$@"; do
    set -- $run
    timeout 40 "$B" mla_decode_bench --iters 20 --only "${FORMAT:-bf16} H=16 $shape" --kernel "$2" --schedule whole \
      --pages "$1" --merge "$3" 2>&1 | grep -E "^mla decode|HBM copy|error|non-finite" | sed "s/^/r$round $3 /"
  done
}
four="swizzled bulk_pingpong_2chain plain|swizzled bulk_pingpong_2chain fused|token tma_pingpong_2chain plain|token tma_pingpong_2chain fused"
IFS='|' read -r -a runs <<< "$four"
[[ $parts == *" goal "* ]] && for round in $(seq 1 "$rounds"); do
  for shape in "B=64 L=4096 bs=64" "B=8 L=32768 bs=64"; do
    [ $((total - (SECONDS - t0))) -lt 30 ] && break 2
    bench_round "$round" "$shape" "${runs[@]}"
  done
done
[[ $parts == *" small "* ]] && for round in $(seq 1 "$rounds"); do
  [ $((total - (SECONDS - t0))) -lt 30 ] && break
  bench_round "$round" "B=64 L=4096 bs=16" "${runs[@]}" "token cp_async plain" "swizzled cp_async plain"
done
[[ $parts == *" fp8 "* ]] && for round in $(seq 1 "$rounds"); do
  for shape in "B=64 L=4096 bs=64" "B=8 L=32768 bs=64"; do
    [ $((total - (SECONDS - t0))) -lt 30 ] && break 2
    FORMAT=fp8-656 bench_round "$round" "$shape" "token tma_fp8 plain" "token tma_fp8 fused"
  done
done
echo "== MLA bench done at $((SECONDS - t0)) s"
engine_runs=${ENGINE_RUNS:-token-major 16 pass|swizzled128 16 pass|token-major 64 pass|swizzled128 64 pass|swizzled128 64 fused}
IFS='|' read -r -a eruns <<< "$engine_runs"
[[ $parts == *" engine "* ]] && for run in "${eruns[@]}"; do
  set -- $run
  [ $((total - (SECONDS - t0))) -lt 110 ] && break
  PAGODA_MLA_MERGE=$3 PAGODA_MLA_LATENT_PAGES=$1 timeout 100 "$B" pagoda_gpu_engine_bench \
    --config tools/gpu_backend/deepseek_v2_lite_config.json --workload random --sampling greedy --no-step-profile \
    --kv-cache-dtype bf16 --block-size "$2" --num-requests 256 --input-len 1000 --output-len 300 \
    --max-num-seqs 256 > "$out/v2lite_$1_$2_$3.log" 2>&1
  echo "v2lite $1 pages of $2, merge $3 rc=$? failed $(grep -c ' failed: ' "$out/v2lite_$1_$2_$3.log"):" \
    "$(grep -m2 -E '^engine|decode-only' "$out/v2lite_$1_$2_$3.log" | cut -c1-200 | tr '\n' ' ')"
done
echo "== end at $((SECONDS - t0)) s"
