#!/usr/bin/env bash
# One short GPU-machine call after final_suite.sh tests (same bundle): the
# sanitizers over the prefill (v4, block sizes 16 and 64) and the quantized
# decode tests, then the bf16 and fp8 decode figures side by side.
#   run(command="tools/gpu/sanitize_and_decode.sh", carry=[".device/final/bundle.tar.xz"])
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
bundle=$here/.device/final/bundle
[ -x "$bundle/run.sh" ] || tar xJf "$here/.device/final/bundle.tar.xz" -C "$here/.device/final"
export PATH=$PATH:/usr/local/cuda/bin
export LD_LIBRARY_PATH="$bundle/lib:/usr/local/cuda/lib64"
out=${OUT:-/tmp/sanitize}
mkdir -p "$out"
for tool in memcheck synccheck; do
  echo "== $tool prefill"
  timeout 90 compute-sanitizer --tool $tool --print-limit 5 "$bundle/bin/paged_attention_gpu_tests" \
    --gtest_filter='Prefill/*gqa32x8_d128_bs16*:Prefill/*mha4_d128_bs64*:Prefill/*mqa8x1_d128_bs32*' 2>&1 | tail -3
  echo "== $tool quantized decode"
  timeout 120 compute-sanitizer --tool $tool --print-limit 5 "$bundle/bin/quantized_attention_gpu_tests" 2>&1 | tail -3
done
"$bundle/run.sh" attention_bench --only "decode B=|decode fp8 B=|decode int8 B=" --kv-dtype bf16,fp8,int8 \
  > "$out/decode.log" 2>&1
grep -E "us," "$out/decode.log" | cut -c1-75
