#!/usr/bin/env bash
# One device call: penalties and top logprobs on the GPU. cuda_sampling_tests (GpuPenalties.*: the kernels
# against the CPU sampler; EngineOnGpu.*: the engine with penalized and top-logprob rows on the device
# against the host engine), then `pagoda serve` on random weights of the Llama-3-8B config (bf16) with
# tools/gpu/penalty_client.py as the client, twice: the rows on the device (the default) and on the host
# (PAGODA_DEVICE_LOGIT_EDITS=0 PAGODA_DEVICE_SCORING=0); the fixed greedy outputs of both are compared.
# Bundle: tools/gpu/penalty_call.sh bundle (-> .device/penalty); run (carry .device/penalty):
#   [MODES="device host"] [CONC=16] bash .device/penalty/penalty_call.sh
set -u
if [ "${1:-}" = bundle ]; then
  here=$(cd "$(dirname "$0")" && pwd); root=$(cd "$here/../.." && pwd); cd "$root" || exit 1
  . tools/gpu/call_bundle.sh
  DEST=$root/.device/penalty call_bundle_pack tools/gpu/penalty_call.sh "$root/build/pagoda" \
    "$root/build/tests/gpu_backend/cuda_sampling_tests" || exit 1
  mkdir -p .device/penalty/model && cp tools/gpu_backend/llama3_8b_config.json .device/penalty/model/config.json &&
    cp .cache/npm/llama3/package/models/tokenizer.json .cache/npm/llama3/package/models/tokenizer_config.json \
      .device/penalty/model/ && cp tools/gpu/penalty_client.py .device/penalty/ && du -sh .device/penalty; exit
fi
. "$(dirname "$0")/call_bundle.sh"
call_bundle_unpack
here=$(cd "$(dirname "$0")" && pwd)
echo "== binaries of $(cat "$(dirname "$B")/commit"); $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
[ "${TESTS:-1}" = 1 ] && call_gtest cuda_sampling_tests 300 cuda_sampling_tests
for mode in ${MODES:-device host}; do
  if [ "$mode" = host ]; then export PAGODA_DEVICE_LOGIT_EDITS=0 PAGODA_DEVICE_SCORING=0
  else unset PAGODA_DEVICE_LOGIT_EDITS PAGODA_DEVICE_SCORING; fi
  echo "== rows on the $mode"
  call_serve "penalty_$mode" "$here/model" --served-model-name m --max-model-len 4096
  timeout 400 python3 "$here/penalty_client.py" "$port" m "$out/fixed_$mode.json" "${CONC:-16}"
  kill "$pid"; wait "$pid" 2>/dev/null
  grep -iE "error|fatal" "$out/serve_penalty_$mode.log" | head -5
done
unset PAGODA_DEVICE_LOGIT_EDITS PAGODA_DEVICE_SCORING
if [ -f "$out/fixed_device.json" ] && [ -f "$out/fixed_host.json" ]; then
  python3 - "$out/fixed_device.json" "$out/fixed_host.json" <<'PY'
import json, sys
d, h = (json.load(open(p)) for p in sys.argv[1:3])
for a, b in zip(d, h):
    same_text = a["text"] == b["text"]
    worst = 0.0
    for x, y in zip(a["token_logprobs"] or [], b["token_logprobs"] or []):
        worst = max(worst, abs(x - y))
    tops = all(list(p) == list(q) for p, q in zip(a["top_logprobs"] or [], b["top_logprobs"] or []))
    print(f"{json.dumps(a['extra']):90s} text same: {same_text}, max |logprob diff| {worst:.2e}, top tokens same: {tops}")
PY
fi
