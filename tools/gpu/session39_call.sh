#!/usr/bin/env bash
# One device call for session 39 (issue 20): the merge folded by cluster pairs (mla_decode_pair.cuh,
# MlaDecodePlan::paired_merge). PARTS in order (default "tests goal"):
#   tests   mla_decode_plan_tests; every mla_decode_gpu_tests case (FusedMergeGivesTheMergePassBits now holds
#           rows in pairs: the paired merge, and the counters' folded merge of the same rows, must give the
#           merge pass's bits); cuda_model_tests *Deepseek*:*Mla* with the default merge, token-major and
#           swizzled pages;
#   goal    issue 20's figure: mla_decode_bench bf16 H=16, 64 x 4K (rows in 2 segments: paired) and 8 x 32K (16
#           segments: not paired) at pages of 64, bulk on swizzled pages and tma on token-major pages, each with
#           the merge pass (plain), folded (fused: by pairs where the plan pairs), folded through the counters
#           (fused_global) and, bulk only, without any merge (none), interleaved, ROUNDS rounds;
#   fp8     tma_fp8 at the goal shapes, plain / fused (paired at 64 x 4K) / fused_global, ROUNDS rounds;
#   release the counters' arrival as a release reduction (this binary) against fence + atomicAdd (V29=the
#           previous mla_decode_bench, bundled as mla_decode_bench_v29): bulk, fused, both shapes, interleaved;
#   small   stage 4 at small pages (docs/MLA_SWIZZLED_PAGES.md): bf16 H=16 64 x 4K at pages of 16 and 32, cp_async
#           on token-major and swizzled pages, tma_pingpong_2chain on token-major, bulk_pingpong_2chain on
#           swizzled, and the plan's automatic kernel on each layout, all with the default (folded) merge,
#           interleaved, ROUNDS rounds;
#   engine  the V2-Lite-shaped engine (256 x 1,000 in / 300 out, bf16 latent, pages of 64) with the pool's layout
#           unasked (swizzled there since session 39) and token-major (PAGODA_MLA_LATENT_PAGES=token-major).
# Bundle: [V29=...] tools/gpu/session39_call.sh bundle (-> .device/s39); run (carry .device/s39):
#   [PARTS=...] [ROUNDS=2] [TOTAL=560] bash .device/s39/session39_call.sh
set -u
if [ "${1:-}" = bundle ]; then
  here=$(cd "$(dirname "$0")" && pwd); root=$(cd "$here/../.." && pwd); cd "$root" || exit 1
  . tools/gpu/call_bundle.sh
  b=$root/build
  DEST=$root/.device/s39 call_bundle_pack tools/gpu/session39_call.sh "$b/bench/kernels/mla_decode_bench" \
    "$b/tests/gpu/mla_decode_gpu_tests" "$b/tests/gpu/mla_decode_plan_tests" "$b/tests/gpu_backend/cuda_model_tests" \
    "$b/bench/gpu/pagoda_gpu_engine_bench" ${V29:+"$V29"}
  exit
fi
. "$(dirname "$0")/call_bundle.sh"
call_bundle_unpack
t0=$SECONDS; total=${TOTAL:-560}
left() { echo $((total - (SECONDS - t0))); }
gpu=$(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | head -1)
echo "== binaries of $(cat "$(dirname "$B")/commit"); $(date -u +%FT%TZ); $gpu"
parts=" ${PARTS:-tests goal} "
rounds=${ROUNDS:-2}
if [[ $parts == *" tests "* ]]; then
  call_gtest mla_decode_plan_tests 60 mla_decode_plan_tests
  call_gtest mla_decode_gpu_tests 300 mla_decode_gpu_tests
  grep -E "fused == pass" "$out/mla_decode_gpu_tests.log" | sed 's/  */ /g' | grep -E "pairs|NO" | head -20
  call_gtest cuda_model_tests_mla 200 cuda_model_tests --gtest_filter='*Deepseek*:*Mla*'
  PAGODA_MLA_LATENT_PAGES=swizzled128 call_gtest cuda_model_tests_mla_swizzled 200 cuda_model_tests \
    --gtest_filter='*Deepseek*:*Mla*'
  echo "== tests done at $((SECONDS - t0)) s"
fi
# bench_round ROUND "SHAPE" "PAGES KERNEL MERGE [BINARY]"...: mla_decode_bench FORMAT H=16 at SHAPE, one run per
# entry (BINARY: mla_decode_bench or a bundled older one).
bench_round() {
  local round=$1 shape=$2 run; shift 2
  for run in "$@"; do
    set -- $run
    [ "${4:-mla_decode_bench}" != mla_decode_bench ] && [ ! -x "$(dirname "$B")/bin/$4" ] && continue
    timeout 40 "$B" "${4:-mla_decode_bench}" --iters 20 --only "${FORMAT:-bf16} H=16 $shape" --kernel "$2" \
      --schedule whole --pages "$1" --merge "$3" 2>&1 | grep -E "^mla decode|HBM copy ceiling \(|error|non-finite" |
      sed "s/^/r$round $3 ${4:-} /"
  done
}
runs=("swizzled bulk_pingpong_2chain plain" "swizzled bulk_pingpong_2chain fused"
  "swizzled bulk_pingpong_2chain fused_global" "swizzled bulk_pingpong_2chain none"
  "token tma_pingpong_2chain plain" "token tma_pingpong_2chain fused" "token tma_pingpong_2chain fused_global")
[[ $parts == *" goal "* ]] && for round in $(seq 1 "$rounds"); do
  for shape in "B=64 L=4096 bs=64" "B=8 L=32768 bs=64"; do
    [ "$(left)" -lt 30 ] && break 2
    bench_round "$round" "$shape" "${runs[@]}"
  done
done
[[ $parts == *" fp8 "* ]] && for round in $(seq 1 "$rounds"); do
  for shape in "B=64 L=4096 bs=64" "B=8 L=32768 bs=64"; do
    [ "$(left)" -lt 30 ] && break 2
    FORMAT=fp8-656 bench_round "$round" "$shape" "token tma_fp8 plain" "token tma_fp8 fused" \
      "token tma_fp8 fused_global"
  done
done
[[ $parts == *" release "* ]] && for round in $(seq 1 "$rounds"); do
  for shape in "B=8 L=32768 bs=64" "B=64 L=4096 bs=64"; do
    [ "$(left)" -lt 30 ] && break 2
    bench_round "$round" "$shape" "swizzled bulk_pingpong_2chain fused_global" \
      "swizzled bulk_pingpong_2chain fused_global mla_decode_bench_v29" "swizzled bulk_pingpong_2chain plain"
  done
done
small_runs=("token cp_async fused" "swizzled cp_async fused" "token tma_pingpong_2chain fused"
  "swizzled bulk_pingpong_2chain fused" "token auto fused" "swizzled auto fused")
[[ $parts == *" small "* ]] && for round in $(seq 1 "$rounds"); do
  for shape in "B=64 L=4096 bs=16" "B=64 L=4096 bs=32"; do
    [ "$(left)" -lt 30 ] && break 2
    bench_round "$round" "$shape" "${small_runs[@]}"
  done
done
echo "== MLA bench done at $((SECONDS - t0)) s"
[[ $parts == *" engine "* ]] && for pages in auto token-major auto token-major; do
  [ "$(left)" -lt 110 ] && break
  PAGODA_MLA_LATENT_PAGES=$pages timeout 100 "$B" pagoda_gpu_engine_bench \
    --config tools/gpu_backend/deepseek_v2_lite_config.json --workload random --sampling greedy --no-step-profile \
    --kv-cache-dtype bf16 --block-size 64 --num-requests 256 --input-len 1000 --output-len 300 \
    --max-num-seqs 256 > "$out/v2lite_$pages.log" 2>&1
  echo "v2lite pages $pages rc=$? failed $(grep -c ' failed: ' "$out/v2lite_$pages.log"):" \
    "$(grep -m2 -E '^engine|decode-only' "$out/v2lite_$pages.log" | cut -c1-200 | tr '\n' ' ')"
done
cd "$out" && tar czf logs.tar.gz ./*.log 2>/dev/null && rm -f ./*.log
echo "== end at $((SECONDS - t0)) s"
