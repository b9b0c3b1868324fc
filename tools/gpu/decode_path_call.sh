#!/usr/bin/env bash
# Issue 23: the decode path of the Llama-3-8B shape (split-K attention and its merge, the row norms,
# SiLU and rope), in PARTS (default "tests itl"):
#   tests  the GPU tests of the path (paged and quantized attention, the fast attention's graphs,
#          eviction holes, the ops and the model suites; TESTS= a subset of these binaries);
#   itl    batch-1 decode by context (ITL_CONTEXTS, default 128 4096 32768; fp8 + fp8 KV and bf16 + bf16
#          KV), twice;
#   wide   decode-only steps at batch 512 (512 requests of 1,000 tokens, 200 out; fp8 + fp8 KV), twice;
#   ncu    every kernel of one batch-512 decode replay (ncu, the same workload, 100 out; table per bundle);
#   1k     the issue's 1,000 x 1,000/1,000 (fp8 + fp8 KV, 512 sequences, 16,384 tokens a step), once each.
# With BASE=<dir of another call_bundle of pagoda_gpu_engine_bench> the timed runs alternate between
# that bundle and this one (an A/B); with BASE_ENV="VAR=1 ..." the base runs are this bundle with those
# variables set (an A/B of a switch).
# Bundle: DEST=/work/main/.device/<name> tools/gpu/decode_path_call.sh bundle; run (carry .device/<name>):
#   [PARTS="tests itl wide ncu 1k"] [BASE=.device/<old> | BASE_ENV="VAR=1"] [CONFIG=...json] BUDGET=300 bash .device/<name>/decode_path_call.sh run
set -u
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tools/gpu/call_bundle.sh
. "$here/call_bundle.sh"
if [ "${1:-}" = bundle ]; then
  build=$(cd "$here/../.." && pwd)/build
  call_bundle_pack "$0" "$build/bench/gpu/pagoda_gpu_engine_bench" "$build/tests/gpu/paged_attention_gpu_tests" \
    "$build/tests/gpu/quantized_attention_gpu_tests" "$build/tests/gpu_backend/fast_attention_gpu_tests" \
    "$build/tests/gpu_backend/cuda_kv_eviction_tests" "$build/tests/gpu_backend/cuda_model_tests" \
    "$build/tests/gpu_backend/cuda_ops_tests" "$build/tests/gpu_backend/two_batch_overlap_gpu_tests" \
    "$build/tests/gpu_backend/cuda_sampling_tests"; exit
fi
call_bundle_unpack
start=$SECONDS; budget=${BUDGET:-300}
left() { echo $((budget - (SECONDS - start))); }
echo "== binaries of $(cat "$(dirname "$B")/commit"); $(date -u +%FT%TZ); $(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader)"
parts=" ${PARTS:-tests itl} "
[[ $parts == *" tests "* ]] && for t in ${TESTS:-paged_attention_gpu_tests quantized_attention_gpu_tests fast_attention_gpu_tests cuda_kv_eviction_tests cuda_model_tests cuda_ops_tests two_batch_overlap_gpu_tests}; do
  filter=${FILTER:-*}; [ "$t" = cuda_ops_tests ] && filter=${OPS_FILTER:-*:-GemvSpeed.*:*Speed*}
  timeout 150 "$B" "$t" --gtest_filter="$filter" > "$out/$t.log" 2>&1
  echo "== $t exit $? ($((SECONDS - start)) s): $(grep -E '^\[  (PASSED|FAILED) ' "$out/$t.log" | tr '\n' ' ')"
  grep -E "^\[  FAILED  \]|Failure$" "$out/$t.log" | head -8
done
base_b=""
if [ -n "${BASE_ENV:-}" ]; then  # the A/B inside this bundle: the base runs with these variables set
  base_b=$out/base_env.sh
  printf '#!/bin/sh\nexec env %s "%s" "$@"\n' "$BASE_ENV" "$B" > "$base_b" && chmod +x "$base_b"
  echo "== base: this bundle with $BASE_ENV"
elif [ -n "${BASE:-}" ]; then
  [ -x "$BASE/bundle/run.sh" ] || tar xJf "$BASE/bundle.tar.xz" -C "$BASE"
  base_b=$BASE/bundle/run.sh; echo "== base: binaries of $(cat "$BASE/bundle/commit")"
fi
# CONFIG: the model config of every part but itl's contexts over 8,192 (e.g. tools/gpu/llama3_8b_128k_config.json: the same
# shape with Llama-3.1's 131,072-token max_model_len, where per-step work that grows with it shows).
c8=${CONFIG:-tools/gpu_backend/llama3_8b_config.json}; c40=tools/gpu/llama3_8b_40k_config.json
step() {  # step LABEL BUNDLE_RUN CONFIG CONTEXT ARGS...
  local label=$1 run=$2 cfg=$3 ctx=$4; shift 4
  [ "$(left)" -lt 25 ] && { echo "== $label skipped (time)"; return; }
  timeout 60 "$run" pagoda_gpu_engine_bench --config "$cfg" --sampling greedy --output-len 128 --latency-tokens 128 \
    --workload latency --latency-input-len "$ctx" "$@" > "$out/engine.log" 2>&1
  echo "$label ctx $ctx rc=$?: $(grep -oE 'batch-1: [0-9.]+ ms per token \(ITL p50\)' "$out/engine.log") | $(grep -oE 'decode-only steps: [0-9]+, [0-9.]+ ms each' "$out/engine.log")"
  grep -iE "error" "$out/engine.log" | head -2
}
[[ $parts == *" itl "* ]] && for round in 1 2; do
  for ctx in ${ITL_CONTEXTS:-128 4096 32768}; do
    cfg=$c8; [ "$ctx" -gt 8192 ] && cfg=$c40
    for kind in fp8 bf16; do
      args=(--kv-cache-dtype "$kind"); [ "$kind" = fp8 ] && args+=(--quantization fp8)
      [ -n "$base_b" ] && step "round $round base $kind" "$base_b" "$cfg" "$ctx" "${args[@]}"
      step "round $round this $kind" "$B" "$cfg" "$ctx" "${args[@]}"
    done
  done
done
wide() {  # wide LABEL BUNDLE_RUN
  [ "$(left)" -lt 50 ] && { echo "== $1 skipped (time)"; return; }
  timeout 80 "$2" pagoda_gpu_engine_bench --config "$c8" --sampling greedy --workload random --num-requests 512 \
    --max-num-seqs 512 --max-tokens-per-step 16384 --input-len 1000 --output-len 200 --quantization fp8 \
    --kv-cache-dtype fp8 > "$out/engine.log" 2>&1
  echo "$1 rc=$?: $(grep -oE 'decode-only steps: [0-9]+, [0-9.]+ ms each at mean batch [0-9.]+' "$out/engine.log")"
  grep -iE "error" "$out/engine.log" | head -2
}
[[ $parts == *" wide "* ]] && for round in 1 2; do
  [ -n "$base_b" ] && wide "round $round base batch 512" "$base_b"
  wide "round $round this batch 512" "$B"
done
wide_args=(--config "$c8" --sampling greedy --workload random --num-requests 512 --max-num-seqs 512
  --max-tokens-per-step 16384 --input-len 1000 --output-len 100 --quantization fp8 --kv-cache-dtype fp8)
profile() {  # profile LABEL BUNDLE_RUN: ncu of graph replay 30 (batch 512, context ~1,050)
  local ncu; ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
  [ -z "$ncu" ] || [ "$(left)" -lt 60 ] && { echo "== ncu $1 skipped"; return; }
  PAGODA_CUDA_PROFILE_REPLAY=30 timeout 150 "$ncu" --profile-from-start off --clock-control none --csv --page raw \
    --print-kernel-base function --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,launch__grid_size \
    --log-file "$out/ncu_$1.csv" "$2" pagoda_gpu_engine_bench "${wide_args[@]}" > "$out/engine.log" 2>&1
  echo "== ncu $1 rc=$?"; python3 "$PAGODA_SOURCE_DIR/tools/gpu/ncu_step_breakdown.py" "$out/ncu_$1.csv" > "$out/breakdown_$1.md" 2>&1
  head -24 "$out/breakdown_$1.md"; rm -f "$out/ncu_$1.csv"
}
if [[ $parts == *" ncu "* ]]; then
  [ -n "$base_b" ] && profile base "$base_b"
  profile this "$B"
fi
thousand() {  # thousand LABEL BUNDLE_RUN
  [ "$(left)" -lt 100 ] && { echo "== 1k $1 skipped (time)"; return; }
  timeout 120 "$2" pagoda_gpu_engine_bench --config "$c8" --sampling greedy --workload random --num-requests 1000 \
    --max-num-seqs 512 --max-tokens-per-step 16384 --input-len 1000 --output-len 1000 --quantization fp8 \
    --kv-cache-dtype fp8 > "$out/engine.log" 2>&1
  echo "1k $1 rc=$?: $(grep -oE '[0-9]+ output tok/s' "$out/engine.log" | head -1) | $(grep -oE 'decode-only steps: [0-9]+, [0-9.]+ s \([0-9]+% of wall\), [0-9.]+ ms each' "$out/engine.log")"
  grep -iE "error" "$out/engine.log" | head -2
}
if [[ $parts == *" 1k "* ]]; then
  [ -n "$base_b" ] && thousand base "$base_b"
  thousand this "$B"
fi
rm -f "$out/engine.log" "$out/base_env.sh"; cd "$out" && tar czf logs.tar.gz ./*.log 2>/dev/null && rm -f ./*.log
echo "done ($((SECONDS - start)) s)"
