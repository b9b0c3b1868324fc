#!/usr/bin/env bash
# One device call for session 36 (issues 20 and 23). PARTS in order (default on an H200: "tests goal fp8";
# elsewhere "tests goal"):
#   tests   mla_decode_plan_tests; mla_decode_gpu_tests' fused-merge and merge cases (the folded merge, now
#           combining four items a thread at a time, must still give the merge pass's bits); cuda_model_tests
#           *Deepseek* with PAGODA_MLA_MERGE=fused on swizzled pages;
#   goal    issue 20's figure: mla_decode_bench bf16 H=16, 64 x 4K and 8 x 32K at pages of 64: bulk on swizzled
#           pages and tma on token-major pages, each with the merge pass (plain), folded (fused) and folded by
#           session 35's one-item-a-thread combine (fused-v26, the previous binary), interleaved, ROUNDS rounds;
#           the bulk kernel folded but launched as a plain grid (fused-plain: PAGODA_MLA_FUSED_LAUNCH=plain, what
#           the cooperative launch costs) and without its merge (none: the main pass alone, the merge's headroom);
#   fp8     tma_fp8 at the goal shapes, plain / fused / fused-v26, ROUNDS rounds;
#   small   pages of 16 (64 x 4K): bulk, tma and cp_async on swizzled and token-major pages, merge pass;
#   engine  the V2-Lite-shaped engine (256 x 1,000 in / 300 out, bf16 latent), ENGINE_RUNS "PAGES BLOCK MERGE";
#   k1      issue 23's 1,000 x 1,000/1,000 with bf16 weights + bf16 KV, engine (goal 11,000 on the H200);
#   http    the same through `pagoda serve` + `pagoda bench serve`, then batch-1 ITL over HTTP (HTTP_KINDS,
#           default bf16);
#   itl     batch-1 decode at 128 tokens, fp8 + fp8 KV and bf16 + bf16 KV, two rounds.
# Bundle: tools/gpu/session36_call.sh bundle (-> .device/s36; V26=path of the previous mla_decode_bench);
# run (carry .device/s36): [PARTS=...] [TOTAL=560] bash .device/s36/session36_call.sh
set -u
if [ "${1:-}" = bundle ]; then
  here=$(cd "$(dirname "$0")" && pwd); root=$(cd "$here/../.." && pwd); cd "$root" || exit 1
  . tools/gpu/call_bundle.sh
  b=$root/build
  DEST=$root/.device/s36 call_bundle_pack tools/gpu/session36_call.sh "$b/bench/gpu/pagoda_gpu_engine_bench" \
    "$b/bench/kernels/mla_decode_bench" "$b/tests/gpu/mla_decode_gpu_tests" "$b/tests/gpu/mla_decode_plan_tests" \
    "$b/tests/gpu_backend/cuda_model_tests" "$b/pagoda" ${V26:+"$V26"} || exit 1
  mkdir -p .device/s36/model && cp tools/gpu_backend/llama3_8b_config.json .device/s36/model/config.json
  cp .cache/npm/llama3/package/models/tokenizer.json .cache/npm/llama3/package/models/tokenizer_config.json \
    .device/s36/model/ && xz -T2 .device/s36/model/tokenizer.json && cp tools/gpu/session31_call.sh .device/s36/ &&
    du -sh .device/s36; exit
fi
. "$(dirname "$0")/call_bundle.sh"
call_bundle_unpack
here=$(cd "$(dirname "$0")" && pwd)
t0=$SECONDS; total=${TOTAL:-560}
left() { echo $((total - (SECONDS - t0))); }
gpu=$(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | head -1)
echo "== binaries of $(cat "$(dirname "$B")/commit"); $(date -u +%FT%TZ); $gpu"
if [[ $gpu == *H200* ]]; then parts=" ${PARTS:-tests goal fp8} "; else parts=" ${PARTS:-tests goal} "; fi
rounds=${ROUNDS:-3}
v26=$(dirname "$B")/bin/mla_decode_bench_v26; [ -x "$v26" ] || v26=""
if [[ $parts == *" tests "* ]]; then
  call_gtest mla_decode_plan_tests 60 mla_decode_plan_tests
  call_gtest mla_decode_gpu_tests 200 mla_decode_gpu_tests \
    --gtest_filter='*Fused*:*Bulk*:*ProgrammaticMerge*:*TmaPingPongSmall*:*TmaGraphPlans*:*FixedMode*:*FixedSmall*'
  grep -E "fused == pass" "$out/mla_decode_gpu_tests.log" | sed 's/  */ /g' | head -40
  PAGODA_MLA_MERGE=fused PAGODA_MLA_LATENT_PAGES=swizzled128 call_gtest cuda_model_tests_deepseek_fused_swizzled 200 \
    cuda_model_tests --gtest_filter='*Deepseek*'
  echo "== tests done at $((SECONDS - t0)) s"
fi
# bench_round ROUND "SHAPE" "PAGES KERNEL MERGE"...: mla_decode_bench FORMAT H=16 at SHAPE, one run per triple;
# MERGE fused-v26 runs the previous binary's folded merge.
bench_round() {
  local round=$1 shape=$2 run bin merge; shift 2
  for run in "$@"; do
    set -- $run
    bin=("$B" mla_decode_bench); merge=$3; launch=cooperative
    if [ "$3" = fused-v26 ]; then [ -n "$v26" ] || continue; bin=("$B" mla_decode_bench_v26); merge=fused; fi
    if [ "$3" = fused-plain ]; then merge=fused; launch=plain; fi
    PAGODA_MLA_FUSED_LAUNCH=$launch timeout 40 "${bin[@]}" --iters 20 --only "${FORMAT:-bf16} H=16 $shape" --kernel "$2" --schedule whole \
      --pages "$1" --merge "$merge" 2>&1 | grep -E "^mla decode|HBM copy|error|non-finite" | sed "s/^/r$round $3 /"
  done
}
runs=("swizzled bulk_pingpong_2chain plain" "swizzled bulk_pingpong_2chain fused" "swizzled bulk_pingpong_2chain fused-v26"
  "swizzled bulk_pingpong_2chain fused-plain" "swizzled bulk_pingpong_2chain none"
  "token tma_pingpong_2chain plain" "token tma_pingpong_2chain fused" "token tma_pingpong_2chain fused-v26")
[[ $parts == *" goal "* ]] && for round in $(seq 1 "$rounds"); do
  for shape in "B=64 L=4096 bs=64" "B=8 L=32768 bs=64"; do
    [ "$(left)" -lt 30 ] && break 2
    bench_round "$round" "$shape" "${runs[@]}"
  done
done
[[ $parts == *" fp8 "* ]] && for round in $(seq 1 "$rounds"); do
  for shape in "B=64 L=4096 bs=64" "B=8 L=32768 bs=64"; do
    [ "$(left)" -lt 30 ] && break 2
    FORMAT=fp8-656 bench_round "$round" "$shape" "token tma_fp8 plain" "token tma_fp8 fused" "token tma_fp8 fused-v26"
  done
done
[[ $parts == *" small "* ]] && for round in $(seq 1 "$rounds"); do
  [ "$(left)" -lt 30 ] && break
  bench_round "$round" "B=64 L=4096 bs=16" "swizzled bulk_pingpong_2chain plain" "token tma_pingpong_2chain plain" \
    "token cp_async plain" "swizzled cp_async plain"
done
echo "== MLA bench done at $((SECONDS - t0)) s"
engine_runs=${ENGINE_RUNS:-token-major 16 pass|swizzled128 16 pass|token-major 64 pass|swizzled128 64 pass}
IFS='|' read -r -a eruns <<< "$engine_runs"
[[ $parts == *" engine "* ]] && for run in "${eruns[@]}"; do
  set -- $run
  [ "$(left)" -lt 110 ] && break
  PAGODA_MLA_MERGE=$3 PAGODA_MLA_LATENT_PAGES=$1 timeout 100 "$B" pagoda_gpu_engine_bench \
    --config tools/gpu_backend/deepseek_v2_lite_config.json --workload random --sampling greedy --no-step-profile \
    --kv-cache-dtype bf16 --block-size "$2" --num-requests 256 --input-len 1000 --output-len 300 \
    --max-num-seqs 256 > "$out/v2lite_$1_$2_$3.log" 2>&1
  echo "v2lite $1 pages of $2, merge $3 rc=$? failed $(grep -c ' failed: ' "$out/v2lite_$1_$2_$3.log"):" \
    "$(grep -m2 -E '^engine|decode-only' "$out/v2lite_$1_$2_$3.log" | cut -c1-200 | tr '\n' ' ')"
done
if [[ $parts == *" k1 "* ]] && [[ $gpu == *H200* || -n "${K1_ANY:-}" ]] && [ "$(left)" -gt 155 ]; then
  timeout 150 "$B" pagoda_gpu_engine_bench --config tools/gpu_backend/llama3_8b_config.json --sampling greedy \
    --workload random --num-requests 1000 --max-num-seqs 512 --max-tokens-per-step 16384 --input-len 1000 \
    --output-len 1000 --kv-cache-dtype bf16 > "$out/k1_bf16.log" 2>&1
  echo "1k bf16 + bf16 KV rc=$?: $(grep -oE '[0-9]+ output tok/s' "$out/k1_bf16.log" | head -1) |" \
    "$(grep -oE 'decode-only steps: [0-9]+, [0-9.]+ s \([0-9]+% of wall\), [0-9.]+ ms each' "$out/k1_bf16.log")"
fi
if [[ $parts == *" http "* ]]; then  # session31_call.sh's http part on this bundle (it shares the unpacked bundle)
  OUT=$out/http PARTS=http HTTP_KINDS=${HTTP_KINDS:-bf16} TOTAL=$(left) bash "$here/session31_call.sh" 2>&1 |
    grep -vE "^== (binaries|end)"
fi
[[ $parts == *" itl "* ]] && for round in 1 2; do
  for kind in fp8 bf16; do
    [ "$(left)" -lt 40 ] && break 2
    args=(--kv-cache-dtype "$kind"); [ "$kind" = fp8 ] && args+=(--quantization fp8)
    timeout 60 "$B" pagoda_gpu_engine_bench --config tools/gpu_backend/llama3_8b_config.json --sampling greedy \
      --output-len 128 --latency-tokens 128 --workload latency --latency-input-len 128 "${args[@]}" > "$out/itl.log" 2>&1
    echo "r$round itl $kind rc=$?: $(grep -oE 'decode-only steps: [0-9]+, [0-9.]+ s \([0-9]+% of wall\), [0-9.]+ ms each' "$out/itl.log") | $(grep -m1 -oE 'ITL[^|]*p50[^|,]*' "$out/itl.log")"
  done
done
cd "$out" && tar czf logs.tar.gz ./*.log 2>/dev/null && rm -f ./*.log
echo "== end at $((SECONDS - t0)) s"
