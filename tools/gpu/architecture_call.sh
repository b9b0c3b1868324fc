#!/usr/bin/env bash
# One GPU-machine call after a restructuring (the final_suite.sh bundle): every gpu test, `pagoda eval
# agreement --device cuda` (the GPU KV quantization's quality through the engine), then the whole
# 1,000 x 1,000/1,000 engine runs per KV dtype for comparison with docs/BENCHMARKS.md.
#   BUILD_DIR=build-cuda tools/gpu/final_suite.sh bundle          # here
#   run(command="bash tools/gpu/architecture_call.sh", carry=[".device/final/bundle.tar.xz"])
# FULL_RUNS (default fp8:384,bf16:384) as in final_suite.sh; EVAL=0 skips the eval.
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
bundle=$here/.device/final/bundle
out=${OUT:-/tmp/architecture}
mkdir -p "$out"
"$here/tools/gpu/final_suite.sh" tests | tail -9
mv "$out/logs.tar.gz" "$out/test_logs.tar.gz"; rm -f "$out/fixture.tar.gz"
if [ "${EVAL:-1}" = 1 ]; then
  model=$here/models/pagoda-tiny
  timeout 120 "$bundle/run.sh" pagoda eval agreement --device cuda --model "$model" \
    --text-file "$model/heldout.txt" --kv-dtype fp8,int8,int4 --baseline-kv-dtype bf16 --max-tokens 16384 --json \
    > "$out/eval_agreement_cuda.jsonl" 2> "$out/eval_agreement_cuda.err"
  echo "eval agreement --device cuda: exit $?"
  timeout 60 "$bundle/run.sh" pagoda eval perplexity --device cuda --model "$model" \
    --text-file "$model/heldout.txt" --kv-dtype bf16 --max-tokens 16384 --json > "$out/eval_perplexity_cuda.json" 2>&1
  echo "eval perplexity --device cuda: exit $?"
  cat "$out/eval_agreement_cuda.jsonl" "$out/eval_perplexity_cuda.json" | cut -c1-400
fi
KERNELS=0 TORCH=0 PEER=0 FULL_RUNS=${FULL_RUNS-fp8:384,bf16:384} "$here/tools/gpu/final_suite.sh" bench | grep -vE '^ "' | tail -20
