#!/usr/bin/env bash
# Every gpu-labelled test and the end-to-end benchmarks from one build, in as
# few device calls as possible (the session's device time is short and every
# cold start costs a minute or two):
#
#   tools/gpu/final_suite.sh bundle    # here: build the gpu tests, pagoda and the GPU benchmarks
#                                      # in BUILD_DIR (default build), pack .device/final/bundle.tar.xz
#   tools/gpu/final_suite.sh tests     # on the GPU machine: the Mistral sliding-window fixture
#                                      # (transformers), every gpu test binary, the CLI gpu tests
#   tools/gpu/final_suite.sh bench     # on the GPU machine: the engine on the Llama-3-8B shape
#                                      # (random weights) with each KV cache dtype, same call
#   tools/gpu/final_suite.sh profile   # on the GPU machine: ncu counters (speed of light, pipes,
#                                      # warp stall reasons) for one launch of each attention_bench
#                                      # figure in NCU_FIGURES ("decode fp8 B=8 L=32768;prefill L=16384")
#
# Device calls (run them back to back so the second finds the machine warm):
#   run(command="tools/gpu/final_suite.sh tests", carry=[".device/final/bundle.tar.xz"])
#   run(command="tools/gpu/final_suite.sh bench", carry=[".device/final/bundle.tar.xz"])
# Logs and results land under $OUT as a few archives (the device tool returns a handful of files).
# Environment (bench): KERNELS (1: attention_bench copy / decode per BENCH_KV_DTYPES / prefill first),
# TORCH (0; 1: PyTorch SDPA's cuDNN / flash baselines on the kernel shapes, after the kernels),
# PEER (1: pagoda and transformers generate_batch on 256 x 512/256 greedy last), KV_DTYPES (empty; e.g. bf16,fp8,int8,int4: the first SECONDS_PER_DTYPE (60) s of
# the workload per KV dtype at MAX_NUM_SEQS (384) running), FULL_RUNS (fp8:384,bf16:384: whole
# 1,000 x 1,000/1,000 runs as KV_DTYPE:RUNNING; empty to skip).
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
dir=$here/.device/final
bundle=$dir/bundle
build=${BUILD_DIR:-$here/build}
gpu_tests=(paged_attention_gpu_tests quantized_attention_gpu_tests cuda_ops_tests cuda_model_tests
           cuda_sampling_tests fast_attention_gpu_tests)

unpack() {
  [ -x "$bundle/run.sh" ] || tar xJf "$dir/bundle.tar.xz" -C "$dir"
  export PAGODA_SOURCE_DIR=$here
  out=${OUT:-/tmp/final-suite}
  mkdir -p "$out/logs"
  {
    echo "date: $(date -u +%Y-%m-%dT%H:%MZ)  commit: $(cat "$bundle/commit")"
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
  } 2>&1 | tee "$out/logs/machine.txt"
}

# "name: N passed, M failed" from a gtest log.
summarize() {
  local name=$1 log=$2 rc=$3
  local passed failed
  passed=$(grep -oP '^\[  PASSED  \] \K[0-9]+' "$log" | tail -1)
  failed=$(grep -c '^\[  FAILED  \] .*(' "$log")
  echo "$name: exit $rc, ${passed:-0} passed, $failed failed"
  grep '^\[  FAILED  \] .*(' "$log" | head -10
}

case "${1:-}" in
bundle)
  set -e
  cmake -S "$here" -B "$build" -G Ninja >/dev/null
  ninja -C "$build" -j2 pagoda_cli "${gpu_tests[@]}" cli_gpu_tests pagoda_gpu_bench pagoda_gpu_engine_bench \
    attention_bench
  bins=("$build/pagoda" "$build/tests/e2e/cli_gpu_tests" "$build/bench/gpu/pagoda_gpu_bench"
        "$build/bench/gpu/pagoda_gpu_engine_bench" "$build/bench/kernels/attention_bench")
  for t in "${gpu_tests[@]}"; do bins+=("$(find "$build/tests" -name "$t" -type f | head -1)"); done
  rm -rf "$bundle"
  mkdir -p "$dir"
  "$here/scripts/device-bundle.sh" "$bundle" "${bins[@]}"
  strip "$bundle"/bin/* || true
  git -C "$here" rev-parse --short HEAD > "$bundle/commit"
  tar cJf "$dir/bundle.tar.xz" -C "$dir" bundle
  ls -la "$dir/bundle.tar.xz"
  ;;
tests)
  unpack
  # The sliding-window fixture first: transformers is the reference (tests/reference reads it).
  ( timeout 120 python3 tools/make_model_fixtures.py --only mistral_sliding_bf16 --out "$out/models" \
      > "$out/logs/fixture.log" 2>&1; echo "fixture exit $?" >> "$out/logs/fixture.log" ) &
  fixture_pid=$!
  # One process per binary, all at once (each is small next to the GPU); a kernel fault stays in its process.
  pids=()
  for t in "${gpu_tests[@]}"; do
    ( timeout 240 "$bundle/run.sh" "$t" > "$out/logs/$t.log" 2>&1; echo $? > "$out/logs/$t.rc" ) &
    pids+=($!)
  done
  wait "${pids[@]}" "$fixture_pid"
  # The CLI tests size a KV pool from free GPU memory: alone on the GPU.
  PAGODA_CLI="$bundle/run.sh pagoda" timeout 150 "$bundle/run.sh" cli_gpu_tests > "$out/logs/cli_gpu_tests.log" 2>&1
  echo $? > "$out/logs/cli_gpu_tests.rc"
  {
    for t in "${gpu_tests[@]}" cli_gpu_tests; do summarize "$t" "$out/logs/$t.log" "$(cat "$out/logs/$t.rc")"; done
    tail -1 "$out/logs/fixture.log"
  } | tee "$out/logs/summary.txt"
  tar czf "$out/logs.tar.gz" -C "$out" logs
  [ -d "$out/models" ] && tar czf "$out/fixture.tar.gz" -C "$out/models" .
  rm -rf "$out/logs" "$out/models"
  ;;
bench)
  unpack
  engine() {  # engine() LABEL LIMIT_SECONDS ARGS...
    local label=$1 limit=$2; shift 2
    timeout "$limit" "$bundle/run.sh" pagoda_gpu_engine_bench --config tools/gpu_backend/llama3_8b_config.json \
      --json "$out/logs/engine_$label.json" "$@" > "$out/logs/engine_$label.log" 2>&1
    echo "engine $label exit $?" | tee -a "$out/logs/summary.txt"
    grep -iE "output tok/s|ttft|itl|ms/token|kv pool|KV cache" "$out/logs/engine_$label.log" | head -12
  }
  # The attention kernels first, in one process per part (copy rate, decode per KV dtype, prefill).
  if [ "${KERNELS:-1}" = 1 ]; then
    for only in copy decode prefill; do
      timeout 120 "$bundle/run.sh" attention_bench --only "$only" --kv-dtype "${BENCH_KV_DTYPES:-bf16,fp8,int8,int4}" \
        >> "$out/logs/attention_bench.log" 2>&1
      echo "attention_bench $only exit $?" | tee -a "$out/logs/summary.txt"
    done
  fi
  if [ "${TORCH:-0}" = 1 ]; then
    PYTHONUNBUFFERED=1 timeout 240 python3 bench/kernels/torch_baselines.py > "$out/logs/torch_baselines.log" 2>&1
    echo "torch baselines exit $?" | tee -a "$out/logs/summary.txt"
    grep -E "decode|prefill|copy" "$out/logs/torch_baselines.log" | grep -v expanded
  fi
  secs=${SECONDS_PER_DTYPE:-60}
  IFS=, read -r -a dtypes <<< "${KV_DTYPES-}"
  # Same workload, same cap, one KV dtype after another: 1,000 x 1,000/1,000, top-p on the GPU.
  for d in "${dtypes[@]}"; do
    engine "random_$d" $(( secs + 120 )) --workload random --sampling top-p --kv-cache-dtype "$d" \
      --max-num-seqs "${MAX_NUM_SEQS:-384}" --max-seconds "$secs"
  done
  # Whole 1,000 x 1,000/1,000 runs, uncapped but for a safety limit: DTYPE:RUNNING, comma-separated.
  IFS=, read -r -a fulls <<< "${FULL_RUNS-fp8:384,bf16:384}"
  for f in "${fulls[@]}"; do
    d=${f%%:*} n=${f##*:}
    engine "full_${d}_$n" 260 --workload random --sampling top-p --kv-cache-dtype "$d" --max-num-seqs "$n" \
      --max-seconds 200
  done
  # The peer on its own shape (REFERENCE.md): pagoda, then transformers' generate_batch, 256 x 512/256 greedy.
  if [ "${PEER:-1}" = 1 ]; then
    engine peer_shape 120 --workload random --sampling greedy --num-requests 256 --input-len 512 --output-len 256 \
      --max-num-seqs 256
    PYTHONUNBUFFERED=1 timeout 200 python3 tools/gpu_backend/transformers_peer.py \
      --config tools/gpu_backend/llama3_8b_config.json --attn 'paged|sdpa' --json "$out/logs/transformers_peer.json" \
      > "$out/logs/transformers_peer.log" 2>&1
    echo "transformers peer exit $?" | tee -a "$out/logs/summary.txt"
    tail -3 "$out/logs/transformers_peer.log"
  fi
  tar czf "$out/logs.tar.gz" -C "$out" logs
  rm -rf "$out/logs"
  ;;
profile)
  unpack
  export PATH=$PATH:/usr/local/cuda/bin
  IFS=';' read -r -a figures <<< "${NCU_FIGURES:-decode fp8 B=8 L=32768;prefill L=16384}"
  for f in "${figures[@]}"; do
    kernel=decode_attention
    [[ $f == prefill* ]] && kernel=prefill_attention_sm90
    echo "== $f" >> "$out/logs/ncu.txt"
    LD_LIBRARY_PATH="$bundle/lib:/usr/local/cuda/lib64" timeout 90 ncu --clock-control none -k "regex:$kernel" \
      --launch-count 1 --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \
      --section InstructionStats --section Occupancy --section MemoryWorkloadAnalysis --section LaunchStats \
      "$bundle/bin/attention_bench" --only "$f" --kv-dtype bf16,fp8,int8 --iters 2 >> "$out/logs/ncu.txt" 2>&1
    echo "ncu '$f' exit $?" | tee -a "$out/logs/summary.txt"
  done
  grep -E "^== |Duration|DRAM Throughput|Issue Slots Busy|Warp Cycles Per Issued|Stall|stall|Pipe|Executed Ipc" \
    "$out/logs/ncu.txt" | head -80
  tar czf "$out/logs.tar.gz" -C "$out" logs
  rm -rf "$out/logs"
  ;;
*)
  echo "usage: $0 bundle|tests|bench|profile" >&2
  exit 2
  ;;
esac
