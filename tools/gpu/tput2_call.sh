#!/usr/bin/env bash
# Issue 23's throughput goal, second call (1,000 x 1,000 in / 1,000 out, all at once, Llama-3-8B shape, random
# weights, fp8 weights + fp8 KV, greedy), in one device call of <= 300 s:
#   ncu:        one run, ncu times every kernel of two steps of the engine's 1,000 x 1,000 (capped): one
#               prefill-carrying step (PAGODA_CUDA_PROFILE_EAGER_STEP=30: ~8K prompt tokens plus the decode
#               rows of the sequences already prefilled) and one decode-only graph replay at batch 512
#               (PAGODA_CUDA_PROFILE_REPLAY=400: first wave, context ~1,400); ncu_step_breakdown.py splits
#               them: per kernel, and per kind (GEMM vs attention vs the rest, attention's DRAM GB/s vs
#               4.8 TB/s, the GEMMs' TFLOP/s at m = 512 and at ~8K);
#   configs:    the engine's whole 1,000 x 1,000 at --max-num-seqs 768, at 894 (the fp8 pool holds 894 full
#               requests at gpu_memory_utilization 0.9), at 512 with --max-tokens-per-step 16384, and last
#               (if time is left) at 512 / 8192, the previous call's settings, with this binary.
# Parts run in that order while the time left allows the next one (BUDGET seconds, default 300).
#
#   BUILD_DIR=build-cuda DEST=/work/main/.device/tput2 tools/gpu/tput2_call.sh bundle
#   run(command="bash .device/tput2/run.sh", carry=[".device/tput2"], timeout_s=...)
# Knobs: PARTS (comma list of ncu,s768,s894,t16k,s512; default all), REPLAY (400), EAGER (30),
#   NCU_SECONDS (50: the wall cap of the profiled run; ncu's time on the first window counts in it), BUDGET (300). Prints a compact summary; logs and ncu CSVs in $OUT/logs.tar.gz, breakdowns in $OUT/*.md.
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)

if [ "${1:-}" = bundle ]; then
  set -e
  build=${BUILD_DIR:-$here/build-cuda}
  dir=${DEST:-$here/.device/tput2}
  rm -rf "$dir" && mkdir -p "$dir"
  bash "$here/scripts/device-bundle.sh" "$dir/bundle" "$build/bench/gpu/pagoda_gpu_engine_bench"
  strip "$dir/bundle/bin/"* || true
  mkdir -p "$dir/bundle/llama3-8b-random"
  cp "$here/tools/gpu_backend/llama3_8b_config.json" "$dir/bundle/llama3-8b-random/config.json"
  cp "$here/tools/gpu/ncu_step_breakdown.py" "$dir/bundle/"
  git -C "$here" rev-parse --short HEAD > "$dir/bundle/commit"
  tar cJf "$dir/bundle.tar.xz" -C "$dir" bundle
  rm -rf "$dir/bundle"
  cp "$0" "$dir/tput2_call.sh"
  printf '#!/usr/bin/env bash\nexec bash "$(dirname "$0")/tput2_call.sh" run "$@"\n' > "$dir/run.sh"
  ls -la "$dir"
  exit 0
fi

[ "${1:-}" = run ] || { echo "usage: $0 bundle|run" >&2; exit 2; }
dir=$(cd "$(dirname "$0")" && pwd)
b=$dir/bundle
[ -x "$b/run.sh" ] || tar xJf "$dir/bundle.tar.xz" -C "$dir"
out=${OUT:-/tmp/tput2}
logs=$out/logs
mkdir -p "$logs"
start=$SECONDS budget=${BUDGET:-300} parts=,${PARTS:-ncu,s768,s894,t16k,s512},
left() { echo $((budget - (SECONDS - start))); }
want() { [[ "$parts" == *",$1,"* ]]; }
echo "date $(date -u +%FT%TZ) commit $(cat "$b/commit"); $(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader)"
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: ${ncu:-none}"
bench=("$b/run.sh" pagoda_gpu_engine_bench --config "$b/llama3-8b-random/config.json" --workload random
  --sampling greedy --num-requests 1000 --input-len 1000 --output-len 1000 --quantization fp8 --kv-cache-dtype fp8)

# One profiler run: two windows inside a capped 1,000 x 1,000 (512 seqs, 8,192 tokens per step), the eager
# (prefill-carrying) step EAGER first, then the decode-only graph replay REPLAY; the CSV splits per step.
profile() {
  [ -z "$ncu" ] && { echo "== ncu skipped: no ncu"; return; }
  local cap=${NCU_SECONDS:-50} limit; limit=$((cap + 45))
  [ "$(left)" -lt "$limit" ] && { echo "== ncu skipped (time: $(left) s left)"; return; }
  local t0=$SECONDS
  PAGODA_CUDA_PROFILE_EAGER_STEP=${EAGER:-30} PAGODA_CUDA_PROFILE_REPLAY=${REPLAY:-400} timeout "$limit" "$ncu" \
    --profile-from-start off --clock-control none --csv --page raw --print-kernel-base function \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,launch__grid_size \
    --log-file "$logs/ncu.csv" "${bench[@]}" --max-num-seqs 512 --max-tokens-per-step 8192 \
    --max-seconds "$cap" > "$logs/ncu.log" 2>&1
  echo "== ncu: eager step ${EAGER:-30} + decode replay ${REPLAY:-400} exit $? ($((SECONDS - t0)) s)"
  grep -E "^engine|step time|error" "$logs/ncu.log" | sed 's/^/  /' | head -4
  # Mixed step: ~8,192 new tokens through the linear layers (2 x 8,192 x 6.98 G = 114,360 GFLOP) + lm_head
  # for ~250 rows. Decode step at batch 512: 2 x 512 x 6.98 G + lm_head 2 x 512 x 0.525 G = 7,685 GFLOP.
  WINDOW=0 python3 "$b/ncu_step_breakdown.py" "$logs/ncu.csv" 0 114620 > "$out/breakdown_mixed.md" 2>&1
  WINDOW=1 python3 "$b/ncu_step_breakdown.py" "$logs/ncu.csv" 0 7685 > "$out/breakdown_decode.md" 2>&1
  for w in decode mixed; do
    echo "-- $w step (top kernels; whole table in breakdown_$w.md)"; head -12 "$out/breakdown_$w.md"
    sed -n '/^| kind/,$p' "$out/breakdown_$w.md"
  done
}

# engine LABEL ARGS...: the whole 1,000 x 1,000 without a profiler.
engine() {
  local label=$1; shift
  [ "$(left)" -lt 85 ] && { echo "== engine $label skipped (time: $(left) s left)"; return; }
  local t0=$SECONDS
  timeout $(($(left) - 2)) "${bench[@]}" "$@" --max-seconds 100 --json "$out/engine_$label.json" \
    > "$logs/engine_$label.log" 2>&1
  echo "== engine 1,000 x 1,000 $label ($*) exit $? ($((SECONDS - t0)) s)"
  grep -E "^engine|step time|\] (prefill-carrying|decode-only steps|timeline)|error" "$logs/engine_$label.log" | sed 's/^/  /'
}

want ncu && profile
want s768 && engine s768 --max-num-seqs 768 --max-tokens-per-step 8192
want s894 && engine s894 --max-num-seqs 894 --max-tokens-per-step 8192
want t16k && engine t16k --max-num-seqs 512 --max-tokens-per-step 16384
want s512 && engine s512 --max-num-seqs 512 --max-tokens-per-step 8192
echo "done ($((SECONDS - start)) s)"
tar czf "$out/logs.tar.gz" -C "$out" logs && rm -rf "$logs"
