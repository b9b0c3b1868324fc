#!/usr/bin/env bash
# One device call: batched completions prompts through `pagoda serve` on random weights of the Llama-3-8B config
# (bf16), with tools/gpu/batched_prompts_client.py as the client (one request in flight, as lm-evaluation-harness's
# local-completions sends): scoring (echo + logprobs, max_tokens 0) and greedy generation of PROMPTS prompts, one
# prompt per request against BATCH per request.
# Bundle: tools/gpu/batched_prompts_call.sh bundle (-> .device/batched); run (carry .device/batched):
#   [PROMPTS=256] [BATCH=32] bash .device/batched/batched_prompts_call.sh
set -u
if [ "${1:-}" = bundle ]; then
  here=$(cd "$(dirname "$0")" && pwd); root=$(cd "$here/../.." && pwd); cd "$root" || exit 1
  . tools/gpu/call_bundle.sh
  DEST=$root/.device/batched call_bundle_pack tools/gpu/batched_prompts_call.sh "$root/build/pagoda" || exit 1
  mkdir -p .device/batched/model && cp tools/gpu_backend/llama3_8b_config.json .device/batched/model/config.json &&
    cp tools/gpu/batched_prompts_client.py .device/batched/ && du -sh .device/batched; exit
fi
. "$(dirname "$0")/call_bundle.sh"
call_bundle_unpack
here=$(cd "$(dirname "$0")" && pwd)
model=${MODEL_DIR:-$here/model}
echo "== binaries of $(cat "$(dirname "$B")/commit"); $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
call_serve batched "$model" --served-model-name m --max-model-len 4096
timeout "${CLIENT_SECONDS:-300}" python3 "$here/batched_prompts_client.py" "$port" m "${PROMPTS:-256}" "${BATCH:-32}"
echo "client rc=$?"
kill "$pid"; wait "$pid" 2>/dev/null
grep -iE "error|fatal" "$out/serve_batched.log" | head -5
