#!/usr/bin/env bash
# One device call for session 34 (issue 23, and issue 20's goal where an H200 comes), PARTS in order:
#   goal      issue 20's MLA decode goal shapes (session30_call.sh's goal part; mla_decode_bench);
#   tests     the L2 prefetch's GPU tests (l2_prefetch.h): GemvPdlTest with the prefetch in the PDL chain,
#             L2Prefetch.RangesAndLaunches, CudaModel.L2PrefetchLeavesTheLogitsBitForBit, and the decode fusion
#             / tensor-core GEMV model tests beside them;
#   prefetch  batch-1 decode at 128 tokens (fp8 + fp8 KV, bf16 + bf16 KV) over PREFETCH_SETS (MiB:mode pairs for
#             PAGODA_L2_PREFETCH_MB / _MODE; default "0 16:bulk 8:lines 16:lines 24:lines 32:lines 48:lines"),
#             two rounds interleaved: the decode-only step;
#   itl / 1k / http   session31_call.sh's parts (on an H200: the batch-1 goal A/B with the tensor-core GEMV at
#             1-2 rows, the 1,000 x 1,000 engine, then through `pagoda serve`).
# Default PARTS: "goal tests prefetch itl 1k" on an H200, "tests prefetch" elsewhere.
# Bundle: tools/gpu/session34_call.sh bundle (-> .device/s34); run (carry .device/s34):
#   [PARTS=...] [TOTAL=560] bash .device/s34/session34_call.sh
set -u
if [ "${1:-}" = bundle ]; then
  here=$(cd "$(dirname "$0")" && pwd); root=$(cd "$here/../.." && pwd); cd "$root" || exit 1
  . tools/gpu/call_bundle.sh
  b=$root/build
  DEST=$root/.device/s34 call_bundle_pack tools/gpu/session34_call.sh "$b/bench/gpu/pagoda_gpu_engine_bench" \
    "$b/bench/kernels/mla_decode_bench" "$b/tests/gpu_backend/cuda_model_tests" "$b/tests/gpu_backend/cuda_ops_tests" \
    "$b/pagoda" || exit 1
  cp tools/gpu/session31_call.sh tools/gpu/decode_path_call.sh tools/gpu/session30_call.sh .device/s34/
  mkdir -p .device/s34/model && cp tools/gpu_backend/llama3_8b_config.json .device/s34/model/config.json
  cp .cache/npm/llama3/package/models/tokenizer.json .cache/npm/llama3/package/models/tokenizer_config.json \
    .device/s34/model/ && xz -T2 .device/s34/model/tokenizer.json && du -sh .device/s34; exit
fi
. "$(dirname "$0")/call_bundle.sh"
call_bundle_unpack
here=$(cd "$(dirname "$0")" && pwd)
t0=$SECONDS; total=${TOTAL:-560}
left() { echo $((total - (SECONDS - t0))); }
gpu=$(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | head -1)
echo "== binaries of $(cat "$(dirname "$B")/commit"); $(date -u +%FT%TZ); $gpu"
if [[ $gpu == *H200* ]]; then parts=" ${PARTS:-goal tests prefetch itl 1k} "; else parts=" ${PARTS:-tests prefetch} "; fi
if [[ $parts == *" goal "* ]]; then
  OUT=$out/goal PARTS="goal" TOTAL=150 bash "$here/session30_call.sh" 2>&1 | grep -vE "^== (binaries|end)" | tail -24
fi
if [[ $parts == *" tests "* ]]; then
  call_gtest cuda_ops_tests_prefetch 120 cuda_ops_tests --gtest_filter='*GemvPdl*:L2Prefetch.*'
  call_gtest cuda_model_tests_prefetch 200 cuda_model_tests \
    --gtest_filter='CudaModel.L2Prefetch*:CudaModel.DecodeFusions*:CudaModel.Fp8MmaGemv*:CudaModel.*Graph*'
fi
if [[ $parts == *" prefetch "* ]]; then
  for round in 1 2; do
    for kind in fp8 bf16; do
      args=(--kv-cache-dtype "$kind"); [ "$kind" = fp8 ] && args+=(--quantization fp8)
      for set in ${PREFETCH_SETS:-0 16:bulk 8:lines 16:lines 24:lines 32:lines 48:lines}; do
        [ "$(left)" -lt 20 ] && { echo "== prefetch skipped (time)"; break 3; }
        mb=${set%%:*}; mode=bulk; [[ $set == *:* ]] && mode=${set#*:}
        PAGODA_L2_PREFETCH_MB=$mb PAGODA_L2_PREFETCH_MODE=$mode timeout 60 "$B" pagoda_gpu_engine_bench --config tools/gpu_backend/llama3_8b_config.json \
          --sampling greedy --output-len 128 --latency-tokens 128 --workload latency --latency-input-len 128 \
          "${args[@]}" > "$out/engine.log" 2>&1
        echo "r$round $kind prefetch $mb MiB $mode rc=$?: $(grep -oE 'batch-1: [0-9.]+ ms per token \(ITL p50\)' "$out/engine.log") | $(grep -oE 'decode-only steps: [0-9]+, [0-9.]+ ms each' "$out/engine.log")"
        grep -iE "error" "$out/engine.log" | head -2
      done
    done
  done
fi
rest=""
for p in itl 1k http; do [[ $parts == *" $p "* ]] && rest+="$p "; done
if [ -n "$rest" ] && [ "$(left)" -gt 60 ]; then
  OUT=$out/s31 PARTS="$rest" ITL_BASE_ENV="${ITL_BASE_ENV:-PAGODA_GEMV_MAX_ROWS=0}" TOTAL=$(left) \
    bash "$here/session31_call.sh" 2>&1 | grep -vE "^== binaries"
fi
cd "$out" && tar czf logs.tar.gz ./*.log 2>/dev/null && rm -f ./*.log
echo "== end at $((SECONDS - t0)) s"
