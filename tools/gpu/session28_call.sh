#!/usr/bin/env bash
# One device call for session 28's owed GPU work (issues #20 and #23), phases in order:
#   A (in parallel) the MLA decode tests of mla_decode_call.sh (swizzled pages and the bulk kernel included),
#     memcheck over the swizzled-pages decode test, the overlap GPU tests (decode_path_call.sh PARTS=tests
#     with PAGODA_OVERLAP_STEPS=on), the DeepSeek model tests on swizzled pages with the bulk kernel;
#   B (alone) the overlap A/B of decode_path_call.sh (batch-1 ITL, batch-512 steps, 1,000 x 1,000; off / on);
#   C (alone) mla_decode_bench "bf16 H=16": cp.async on token-major vs swizzled pages, tma_pingpong_2chain on
#     token-major vs bulk_pingpong_2chain on swizzled pages, twice;
#   D (alone) mla_load_probe: the tensor-map ring, whole-page bulk stages, the column-block bulk ring.
# Bundle: tools/gpu/session28_call.sh bundle (-> .device/combo); run (carry .device/combo and this script's
# copy there): [TOTAL=560 (seconds the whole call may take)] bash .device/combo/session28_call.sh
set -u
if [ "${1:-}" = bundle ]; then
  here=$(cd "$(dirname "$0")" && pwd); root=$(cd "$here/../.." && pwd); cd "$root" || exit 1
  . tools/gpu/call_bundle.sh
  b=$root/build
  DEST=$root/.device/combo call_bundle_pack tools/gpu/decode_path_call.sh "$b/bench/gpu/pagoda_gpu_engine_bench" \
    "$b/tests/gpu_backend/cuda_kv_eviction_tests" "$b/tests/gpu_backend/cuda_model_tests" \
    "$b/tests/gpu_backend/two_batch_overlap_gpu_tests" "$b/tests/gpu_backend/cuda_sampling_tests" \
    "$b/tests/gpu/mla_decode_gpu_tests" "$b/tests/gpu/mla_decode_plan_tests" "$b/bench/kernels/mla_decode_bench" "$b/bench/kernels/mla_load_probe"
  cp tools/gpu/mla_decode_call.sh .device/combo/
  cp tools/gpu/session28_call.sh .device/combo/; exit
fi
cd "$(dirname "$0")/../.."
root=$(pwd); OUTDIR=${OUT:-/tmp/combo}; mkdir -p "$OUTDIR"
[ -x .device/combo/bundle/run.sh ] || tar xJf .device/combo/bundle.tar.xz -C .device/combo
t0=$SECONDS
echo "== start $(date -u +%T) $(nvidia-smi --query-gpu=name --format=csv,noheader)"
# Phase A (parallel): correctness.
( OUT=$OUTDIR/mla RACECHECK=0 SYNCCHECK=0 MODEL_KERNELS=cp_async bash .device/combo/mla_decode_call.sh tests > "$OUTDIR/mla_tests.txt" 2>&1 ) &
mlap=$!
( OUT=$OUTDIR/ovl PAGODA_OVERLAP_STEPS=on TESTS="cuda_sampling_tests two_batch_overlap_gpu_tests cuda_kv_eviction_tests" PARTS="tests" BUDGET=200 \
    bash .device/combo/decode_path_call.sh run > "$OUTDIR/ovl_tests.txt" 2>&1 ) &
ovp=$!
( b=.device/combo/bundle
  LD_LIBRARY_PATH="$b/lib:/usr/local/cuda/lib64" timeout 150 compute-sanitizer --tool memcheck --print-limit 5 \
    "$b/bin/mla_decode_gpu_tests" --gtest_filter='*SwizzledPagesGiveTheTokenMajorBits' > "$OUTDIR/memcheck.txt" 2>&1
  echo "memcheck rc=$?" >> "$OUTDIR/memcheck.txt" ) &
mcp=$!
( PAGODA_MLA_LATENT_PAGES=swizzled128 PAGODA_MLA_DECODE_KERNEL=bulk_pingpong_2chain timeout 150 .device/combo/bundle/run.sh \
    cuda_model_tests --gtest_filter='*Deepseek*:-*DeepseekSwizzledPages*' > "$OUTDIR/model_bulk.txt" 2>&1
  echo "cuda_model_tests *Deepseek* on swizzled pages + bulk kernel rc=$?" >> "$OUTDIR/model_bulk.txt" ) &
mbp=$!
wait $mlap $ovp $mbp
grep -E "^\[  (PASSED|FAILED)|rc=|Failure|Which is" "$OUTDIR/model_bulk.txt" | head -20
echo "== phase A done at $((SECONDS - t0)) s"
grep -E "rc=|FAILED|Failure|Which is|differ" "$OUTDIR/mla_tests.txt" | head -30
cat "$OUTDIR/ovl_tests.txt" | tail -20
wait $mcp
tail -4 "$OUTDIR/memcheck.txt"
# Phase B (alone): the overlap A/B.
left=$((${TOTAL:-560} - (SECONDS - t0) - 120))
echo "== overlap A/B with budget $left s"
OUT=$OUTDIR/ovl PAGODA_OVERLAP_STEPS=on PARTS="itl wide 1k" ITL_CONTEXTS=128 BASE_ENV="PAGODA_OVERLAP_STEPS=off" BUDGET=$left \
  bash .device/combo/decode_path_call.sh run 2>&1 | tail -30
# Phase C (alone): the cp.async MLA decode on token-major vs swizzled pages.
b=.device/combo/bundle
for round in 1 2; do for run in "token cp_async" "swizzled cp_async" "token tma_pingpong_2chain" "swizzled bulk_pingpong_2chain"; do
  set -- $run
  timeout 30 "$b/run.sh" mla_decode_bench --iters 20 --only "bf16 H=16" --kernel $2 --schedule whole --pages $1 2>&1 \
    | grep -E "^mla decode|error|non-finite|ceiling" | sed "s/^/r$round /"
done; done
echo "== end at $((SECONDS - t0)) s"
# Phase D: stage 0's probe, the column-block ring of 1-D bulk copies over swizzled pages of 64 / 16 / 8 tokens.
for o in "producer 18 slots" "bulk 2 stages x 9" "ring 18"; do
  timeout 60 "$b/run.sh" mla_load_probe --iters 20 --cycles "0 3000 5500" --only "$o" 2>&1 | grep -vE "^$"
done
echo "== end probe at $((SECONDS - t0)) s"
