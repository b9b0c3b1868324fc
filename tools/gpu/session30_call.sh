#!/usr/bin/env bash
# One device call for session 30 (issues #20 and #23), PARTS in order (default "tests small engine h200"):
#   tests   mla_decode_plan_tests, mla_decode_gpu_tests, cuda_model_tests *Deepseek* (the automatic kernel
#           as this card takes it);
#   small   mla_decode_bench bf16 H=16 at pages of 16 / 32 / 64 (cp.async, tma, tma_pingpong_2chain on
#           token-major pages; bulk_pingpong_2chain on swizzled pages; the plan's automatic choice), three
#           rounds interleaved: which kernel wins at small pages on this card;
#   engine  the DeepSeek-V2-Lite-shaped engine (bf16 latent, the engine's pages of 16) with the automatic
#           kernel vs tma_pingpong_2chain vs cp_async forced;
#   ncu     every kernel of one batch-512 decode replay of the Llama-3-8B shape (fp8 + fp8 KV), by kind
#           (decode_path_call.sh's ncu part);
#   goal    issue 20's figure: mla_decode_bench bf16 H=16, 64 x 4K and 8 x 32K at pages of 64, decode + merge:
#           bulk_pingpong_2chain on swizzled pages, tma_pingpong_2chain on token-major, cp_async; three rounds;
#   lmhead  the e4m3 lm_head as an fp8 GEMM above the GEMV rows: cuda_ops_tests' Fp8Gemm cases (f32 output
#           included), cuda_model_tests, the bundled model's perplexity (bf16; fp8 with
#           PAGODA_FP8_LM_HEAD_GEMM=0 and by default; fp8 in 1-row steps), then decode_path_call.sh's batch-512
#           decode steps (wide) and, with LMHEAD_1K=1, its 1,000 x 1,000, PAGODA_FP8_LM_HEAD_GEMM=0 vs default
#           (LMHEAD_PARTS="ncu wide": decode_path_call.sh's parts instead, and no tests);
#   h200    on an H200 only, while time is left: the owed overlap A/B of decode_path_call.sh (batch-1 ITL
#           and the 1,000 x 1,000, PAGODA_OVERLAP_STEPS off / on).
# REQUIRE_H200=1: on any other card print its name and stop (a call that only an H200 can answer).
# Bundle: tools/gpu/session30_call.sh bundle (-> .device/s30); run (carry .device/s30):
#   [PARTS=...] [TOTAL=560] bash .device/s30/session30_call.sh
set -u
if [ "${1:-}" = bundle ]; then
  here=$(cd "$(dirname "$0")" && pwd); root=$(cd "$here/../.." && pwd); cd "$root" || exit 1
  . tools/gpu/call_bundle.sh
  b=$root/build
  DEST=$root/.device/s30 call_bundle_pack tools/gpu/session30_call.sh "$b/bench/gpu/pagoda_gpu_engine_bench" \
    "$b/bench/kernels/mla_decode_bench" "$b/tests/gpu/mla_decode_gpu_tests" "$b/tests/gpu/mla_decode_plan_tests" \
    "$b/tests/gpu_backend/cuda_model_tests" "$b/tests/gpu_backend/cuda_ops_tests" "$b/pagoda"
  cp tools/gpu/decode_path_call.sh .device/s30/; exit
fi
. "$(dirname "$0")/call_bundle.sh"
call_bundle_unpack
t0=$SECONDS; total=${TOTAL:-560}
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "== binaries of $(cat "$(dirname "$B")/commit"); $(date -u +%FT%TZ); $gpu"
if [ -n "${REQUIRE_H200:-}" ] && [[ $gpu != *H200* ]]; then echo "== not an H200: nothing run"; exit 0; fi
parts=" ${PARTS:-tests small engine h200} "
if [[ $parts == *" tests "* ]]; then
  call_gtest mla_decode_plan_tests 60 mla_decode_plan_tests
  call_gtest mla_decode_gpu_tests 200 mla_decode_gpu_tests
  call_gtest "cuda_model_tests_deepseek" 150 cuda_model_tests --gtest_filter='*Deepseek*'
fi
# bench_round ROUND "SHAPE" "PAGES KERNEL"...: mla_decode_bench bf16 H=16 at SHAPE, one run per pair.
bench_round() {
  local round=$1 shape=$2 run; shift 2
  for run in "$@"; do
    set -- $run
    timeout 40 "$B" mla_decode_bench --iters 20 --only "bf16 H=16 $shape" --kernel "$2" --schedule whole \
      --pages "$1" 2>&1 | grep -E "^mla decode|^device|HBM copy|error|non-finite" | sed "s/^/r$round /"
  done
}
[[ $parts == *" goal "* ]] && for round in 1 2 3; do
  for shape in "B=64 L=4096 bs=64" "B=8 L=32768 bs=64"; do
    bench_round $round "$shape" "swizzled bulk_pingpong_2chain" "token tma_pingpong_2chain" "token cp_async"
  done
done
[[ $parts == *" small "* ]] && for round in 1 2 3; do
  for bs in 16 32 64; do
    bench_round $round "B=64 L=4096 bs=$bs" "token cp_async" "token tma" "token tma_pingpong_2chain" \
      "swizzled bulk_pingpong_2chain" "token auto" "swizzled auto"
  done
done
echo "== MLA bench done at $((SECONDS - t0)) s"
# The engine at its default pages of 16, bf16 latent: 256 requests x 1,000 in / 300 out, 256 running.
[[ $parts == *" engine "* ]] && for round in 1 2; do
  for k in auto tma_pingpong_2chain cp_async; do
    PAGODA_MLA_DECODE_KERNEL=$k timeout 100 "$B" pagoda_gpu_engine_bench --config tools/gpu_backend/deepseek_v2_lite_config.json \
      --workload random --sampling greedy --no-step-profile --kv-cache-dtype bf16 --num-requests 256 --input-len 1000 \
      --output-len 300 --max-num-seqs 256 > "$out/v2lite_$k.log" 2>&1
    echo "r$round v2lite bf16 latent kernel $k rc=$? failed $(grep -c ' failed: ' "$out/v2lite_$k.log"):" \
      "$(grep -m2 -E '^engine|decode-only' "$out/v2lite_$k.log" | cut -c1-200 | tr '\n' ' ')"
  done
done
echo "== engine done at $((SECONDS - t0)) s"
if [[ $parts == *" ncu "* ]]; then
  OUT=$out/ncu PARTS="ncu" BUDGET=200 bash "$(dirname "$0")/decode_path_call.sh" run 2>&1 | tail -40
fi
if [[ $parts == *" lmhead "* ]] && [ -z "${LMHEAD_PARTS:-}" ]; then
  call_gtest cuda_ops_tests_fp8 120 cuda_ops_tests --gtest_filter='Shapes/Fp8GemmTest.*:Fp8ScaleModeTest.*'
  call_gtest cuda_model_tests 280 cuda_model_tests
  m=models/pagoda-tiny
  # The engine's eval runs one sequence, so its head rows come one at a time (the GEMV head); with
  # PAGODA_GEMV_MAX_ROWS=0 every projection and the head take the GEMM path, the arithmetic of a batched
  # step, so the A/B of the head there is the one serving sees.
  for run in "bf16 1 " "fp8_head_bf16 0 --quantization fp8" "fp8_head_fp8 1 --quantization fp8"; do
    set -- $run; label=$1 gemm=$2; shift 2
    PAGODA_GEMV_MAX_ROWS=0 PAGODA_FP8_LM_HEAD_GEMM=$gemm timeout 120 "$B" pagoda eval perplexity --device cuda \
      --model $m --text-file $m/heldout.txt "$@" --json > "$out/ppl_$label.json" 2> "$out/ppl_$label.err"
    echo "perplexity (GEMM path) $label rc=$?: $(grep -oE '"(mean_nll|perplexity|tokens)":[0-9.]+' "$out/ppl_$label.json" | tr '\n' ' ')"
    tail -2 "$out/ppl_$label.err" | grep -i error
  done
  tar czf "$out/ppl.tar.gz" -C "$out" $(cd "$out" && ls ppl_*) && rm -f "$out"/ppl_*
fi
if [[ $parts == *" lmhead "* ]]; then
  w=${LMHEAD_PARTS:-wide}; [ -n "${LMHEAD_1K:-}" ] && w="$w 1k"
  OUT=$out/lmhead PARTS="$w" BASE_ENV="PAGODA_FP8_LM_HEAD_GEMM=0" BUDGET=$((total - (SECONDS - t0) - 15)) \
    bash "$(dirname "$0")/decode_path_call.sh" run 2>&1 | tail -70
fi
[[ $parts == *" h200 "* ]] && case $gpu in
*H200*)
  left=$((total - (SECONDS - t0) - 20))
  echo "== H200: overlap A/B with budget $left s"
  OUT=$out/ovl PAGODA_OVERLAP_STEPS=on PARTS="itl 1k" ITL_CONTEXTS=128 BASE_ENV="PAGODA_OVERLAP_STEPS=off" BUDGET=$left \
    bash "$(dirname "$0")/decode_path_call.sh" run 2>&1 | tail -30 ;;
esac
echo "== end at $((SECONDS - t0)) s"
