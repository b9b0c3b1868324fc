#!/usr/bin/env bash
# One device call for session 40, PARTS in order (default "scoring h200"):
#   scoring  cuda_sampling_tests (any card): prompt scoring on the device (GpuPromptScoring.*, the engine's
#            device scores against the host engine's) and the sampler's cases;
#   h200     only on an H200, the figures the issues owe there: issue 20's MLA goal shapes and small pages
#            (session39_call.sh parts goal and small, MLA_ROUNDS rounds, default 2), then issue 23's 1,000 x 1,000 through the
#            engine with fp8 + fp8 KV and with bf16 + bf16 KV (session31_call.sh part 1k).
# Bundle: tools/gpu/session40_call.sh bundle (-> .device/s40); run (carry .device/s40):
#   [PARTS=...] bash .device/s40/session40_call.sh
set -u
if [ "${1:-}" = bundle ]; then
  here=$(cd "$(dirname "$0")" && pwd); root=$(cd "$here/../.." && pwd); cd "$root" || exit 1
  . tools/gpu/call_bundle.sh
  b=$root/build
  DEST=$root/.device/s40 call_bundle_pack tools/gpu/session40_call.sh "$b/bench/kernels/mla_decode_bench" \
    "$b/bench/gpu/pagoda_gpu_engine_bench" "$b/tests/gpu_backend/cuda_sampling_tests" || exit 1
  cp tools/gpu/session39_call.sh tools/gpu/session31_call.sh tools/gpu/session30_call.sh \
    tools/gpu/decode_path_call.sh .device/s40/ && du -sh .device/s40; exit
fi
. "$(dirname "$0")/call_bundle.sh"
call_bundle_unpack
here=$(cd "$(dirname "$0")" && pwd)
gpu=$(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | head -1)
echo "== binaries of $(cat "$(dirname "$B")/commit"); $(date -u +%FT%TZ); $gpu"
parts=" ${PARTS:-scoring h200} "
[[ $parts == *" scoring "* ]] && call_gtest cuda_sampling_tests 200 cuda_sampling_tests
if [[ $parts == *" h200 "* ]]; then
  if [[ $gpu != *H200* ]]; then
    echo "== not an H200: the H200 figures are not taken"
  else
    OUT=$out/mla PARTS="goal small" ROUNDS=${MLA_ROUNDS:-2} TOTAL=${MLA_TOTAL:-200} bash "$here/session39_call.sh" 2>&1 |
      grep -v "HBM copy" |
      sed 's/  */ /g' | cut -c1-190
    OUT=$out/k1 PARTS="1k" TOTAL=300 bash "$here/session31_call.sh" 2>&1
  fi
fi
cd "$out" && tar czf logs.tar.gz ./*.log 2>/dev/null && rm -f ./*.log
echo "== end"
