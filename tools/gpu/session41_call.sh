#!/usr/bin/env bash
# One device call for session 41, PARTS in order (default "auto": h200 on an H200, else penalty):
#   penalty  penalty_call.sh: cuda_sampling_tests (penalties and top logprobs on the device) and the HTTP
#            A/B of penalized / top-logprob rows on the device against the host (any card);
#   h200     only on an H200: session40_call.sh's part h200 (issue 20's MLA goal shapes and small pages,
#            issue 23's 1,000 x 1,000 engine runs, fp8 and bf16).
# Bundle: tools/gpu/session41_call.sh bundle (-> .device/s41); run (carry .device/s41):
#   [PARTS=...] [MLA_ROUNDS=1] bash .device/s41/session41_call.sh
set -u
if [ "${1:-}" = bundle ]; then
  here=$(cd "$(dirname "$0")" && pwd); root=$(cd "$here/../.." && pwd); cd "$root" || exit 1
  . tools/gpu/call_bundle.sh
  b=$root/build
  DEST=$root/.device/s41 call_bundle_pack tools/gpu/session41_call.sh "$b/pagoda" "$b/bench/kernels/mla_decode_bench" \
    "$b/bench/gpu/pagoda_gpu_engine_bench" "$b/tests/gpu_backend/cuda_sampling_tests" || exit 1
  cp tools/gpu/session40_call.sh tools/gpu/session39_call.sh tools/gpu/session31_call.sh tools/gpu/session30_call.sh \
    tools/gpu/decode_path_call.sh tools/gpu/penalty_call.sh tools/gpu/penalty_client.py .device/s41/ &&
    mkdir -p .device/s41/model && cp tools/gpu_backend/llama3_8b_config.json .device/s41/model/config.json &&
    cp .cache/npm/llama3/package/models/tokenizer_config.json .device/s41/model/ &&
    xz -T2 -c .cache/npm/llama3/package/models/tokenizer.json > .device/s41/model/tokenizer.json.xz &&
    du -sh .device/s41; exit
fi
here=$(cd "$(dirname "$0")" && pwd)
[ -f "$here/model/tokenizer.json" ] || xz -dc "$here/model/tokenizer.json.xz" > "$here/model/tokenizer.json"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
parts=" ${PARTS:-auto} "
if [[ $parts == " auto " ]]; then
  if [[ $gpu == *H200* ]]; then parts=" h200 "; else parts=" penalty "; fi
fi
[[ $parts == *" h200 "* ]] && PARTS=h200 bash "$here/session40_call.sh"
[[ $parts == *" penalty "* ]] && bash "$here/penalty_call.sh"
echo "== end $(date -u +%FT%TZ)"
