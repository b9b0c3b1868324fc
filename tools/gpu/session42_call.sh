#!/usr/bin/env bash
# One device call for session 42, PARTS in order (default "auto": "h200 batch" on an H200, else "batch"):
#   h200   only on an H200: session40_call.sh's part h200 (issue 20's MLA goal shapes and small pages,
#          issue 23's 1,000 x 1,000 engine runs, fp8 and bf16);
#   batch  batched_prompts_call.sh (any card): batched completions prompts through `pagoda serve`, one request
#          in flight, BATCH prompts per request against one.
# Bundle: tools/gpu/session42_call.sh bundle (-> .device/s42); run (carry .device/s42):
#   [PARTS=...] [MLA_ROUNDS=1] bash .device/s42/session42_call.sh
set -u
if [ "${1:-}" = bundle ]; then
  here=$(cd "$(dirname "$0")" && pwd); root=$(cd "$here/../.." && pwd); cd "$root" || exit 1
  . tools/gpu/call_bundle.sh
  b=$root/build
  DEST=$root/.device/s42 call_bundle_pack tools/gpu/session42_call.sh "$b/pagoda" "$b/bench/kernels/mla_decode_bench" \
    "$b/bench/gpu/pagoda_gpu_engine_bench" "$b/tests/gpu_backend/cuda_sampling_tests" || exit 1
  cp tools/gpu/session40_call.sh tools/gpu/session39_call.sh tools/gpu/session31_call.sh tools/gpu/session30_call.sh \
    tools/gpu/decode_path_call.sh tools/gpu/batched_prompts_call.sh tools/gpu/batched_prompts_client.py \
    .device/s42/ && mkdir -p .device/s42/model && cp tools/gpu_backend/llama3_8b_config.json .device/s42/model/config.json &&
    du -sh .device/s42; exit
fi
here=$(cd "$(dirname "$0")" && pwd)
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
parts=" ${PARTS:-auto} "
if [[ $parts == " auto " ]]; then
  if [[ $gpu == *H200* ]]; then parts=" h200 batch "; else parts=" batch "; fi
fi
[[ $parts == *" h200 "* ]] && PARTS=h200 bash "$here/session40_call.sh"
[[ $parts == *" batch "* ]] && OUT=${OUT:-/tmp/s42}/batch CLIENT_SECONDS=${CLIENT_SECONDS:-240} \
  bash "$here/batched_prompts_call.sh"
echo "== end $(date -u +%FT%TZ)"
