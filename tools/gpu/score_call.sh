#!/usr/bin/env bash
# One device call: prompt scoring (echo, prompt_logprobs) through `pagoda serve` on random weights of the
# Llama-3-8B config (bf16 weights and KV), with tools/gpu/score_client.py as the client: first the scoring
# tests (cuda_sampling_tests: the kernel against the CPU's score_token, the engine scoring on the device
# against the host engine), then the server with the rows scored on the device (the default) and with
# PAGODA_DEVICE_SCORING=0 (the rows' logits scored on the host, as before), one after the other (RUNS, default
# "device:128 host:128": scoring:--max-prompt-rows-per-step pairs).
# Bundle: tools/gpu/score_call.sh bundle (-> .device/score); run (carry .device/score): bash .device/score/score_call.sh
set -u
if [ "${1:-}" = bundle ]; then
  here=$(cd "$(dirname "$0")" && pwd); root=$(cd "$here/../.." && pwd); cd "$root" || exit 1
  . tools/gpu/call_bundle.sh
  DEST=$root/.device/score call_bundle_pack tools/gpu/score_call.sh "$root/build/pagoda" \
    "$root/build/tests/gpu_backend/cuda_sampling_tests" || exit 1
  mkdir -p .device/score/model && cp tools/gpu_backend/llama3_8b_config.json .device/score/model/config.json &&
    cp .cache/npm/llama3/package/models/tokenizer.json .cache/npm/llama3/package/models/tokenizer_config.json \
      .device/score/model/ && cp tools/gpu/score_client.py .device/score/ && du -sh .device/score; exit
fi
. "$(dirname "$0")/call_bundle.sh"
call_bundle_unpack
here=$(cd "$(dirname "$0")" && pwd)
echo "== binaries of $(cat "$(dirname "$B")/commit"); $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
call_gtest cuda_sampling_tests 200 cuda_sampling_tests
# RUNS: scoring:rows pairs, rows = --max-prompt-rows-per-step.
for run in ${RUNS:-device:128 host:128}; do
  scoring=${run%%:*} rows=${run##*:}
  if [ "$scoring" = host ]; then export PAGODA_DEVICE_SCORING=0; else unset PAGODA_DEVICE_SCORING; fi
  echo "== rows scored on the $scoring, --max-prompt-rows-per-step $rows"
  call_serve "score_${scoring}_$rows" "$here/model" --served-model-name m --max-model-len 8192 \
    --max-prompt-rows-per-step "$rows"
  timeout 200 python3 "$here/score_client.py" "$port" m
  kill "$pid"; wait "$pid" 2>/dev/null
  grep -iE "error|fatal" "$out/serve_score_${scoring}_$rows.log" | head -5
done
unset PAGODA_DEVICE_SCORING
