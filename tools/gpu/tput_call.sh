#!/usr/bin/env bash
# Issue 23's throughput goal, profiled (1,000 x 1,000 in / 1,000 out, all at once, Llama-3-8B shape, random
# weights), in one device call:
#   profile: pagoda_gpu_engine_bench --workload gemm,prefill: plain cuBLASLt GEMMs of one layer's shapes,
#            bf16 and fp8 (the ceiling), and prefill alone at 2K/4K/8K/16K tokens per step with fp8 weights +
#            fp8 KV; then prefill alone at 8K/16K with fp8 weights + bf16 KV and bf16 weights + bf16 KV;
#   goal:    the engine benchmark's 1,000 x 1,000 (greedy, with its step profile: prefill-carrying vs
#            decode-only steps, decode batch histogram, timeline with free KV blocks), then `pagoda serve`
#            + `pagoda bench serve` at the same settings (same binaries, same model shape, greedy).
#
#   BUILD_DIR=build-cuda tools/gpu/tput_call.sh bundle      packs DEST (default <tree>/.device/tput)
#   run(command="bash .device/tput/tput_call.sh run", carry=[".device/tput"])
# Knobs: PARTS=all|profile|goal; SEQS (--max-num-seqs, default 512), TOKENS (--max-tokens-per-step, 8192),
#   CHUNKS (prefill token budgets of the fp8 run), CHUNKS2 (of the other two), GOAL_SECONDS (cap of each goal
#   run, 110). Expected: profile ~90 s, goal ~190 s (PARTS=profile and PARTS=goal fit a 220 s call each).
# Prints a compact summary; full logs in $OUT/logs.tar.gz.
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)

if [ "${1:-}" = bundle ]; then
  set -e
  build=${BUILD_DIR:-$here/build-cuda}
  dir=${DEST:-$here/.device/tput}
  rm -rf "$dir" && mkdir -p "$dir"
  bash "$here/scripts/device-bundle.sh" "$dir/bundle" "$build/pagoda" "$build/bench/gpu/pagoda_gpu_engine_bench"
  strip "$dir/bundle/bin/"* || true
  model=$dir/bundle/llama3-8b-random
  mkdir -p "$model"
  cp "$here/tools/gpu_backend/llama3_8b_config.json" "$model/config.json"
  cp "$here/.cache/npm/llama3/package/models/tokenizer.json" "$here/.cache/npm/llama3/package/models/tokenizer_config.json" "$model/"
  git -C "$here" rev-parse --short HEAD > "$dir/bundle/commit"
  tar cJf "$dir/bundle.tar.xz" -C "$dir" bundle
  rm -rf "$dir/bundle"
  cp "$0" "$dir/tput_call.sh"
  ls -la "$dir"
  exit 0
fi

[ "${1:-}" = run ] || { echo "usage: $0 bundle|run" >&2; exit 2; }
dir=$(cd "$(dirname "$0")" && pwd)
b=$dir/bundle
[ -x "$b/run.sh" ] || tar xJf "$dir/bundle.tar.xz" -C "$dir"
out=${OUT:-/tmp/tput}
logs=$out/logs
mkdir -p "$logs"
seqs=${SEQS:-512} tokens=${TOKENS:-8192} chunks=${CHUNKS:-2048,4096,8192,16384} cap=${GOAL_SECONDS:-110}
echo "date $(date -u +%FT%TZ) commit $(cat "$b/commit") SEQS=$seqs TOKENS=$tokens"
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
bench=("$b/run.sh" pagoda_gpu_engine_bench --config "$b/llama3-8b-random/config.json")
summary() { grep -E "$1" "$2" | sed 's/^/  /'; }

if [ "${PARTS:-all}" != goal ]; then
  t0=$(date +%s)
  "${bench[@]}" --workload gemm,prefill --prefill-chunks "$chunks" --prefill-requests 256 --quantization fp8 \
    --kv-cache-dtype fp8 --max-num-seqs "$seqs" --json "$out/prefill_fp8.json" > "$logs/prefill_fp8.log" 2>&1
  echo "== fp8 weights + fp8 KV: GEMM ceiling and prefill alone ($(( $(date +%s) - t0 )) s)"
  summary "gemm ceiling|stack of|^prefill,|error|prefill-carrying" "$logs/prefill_fp8.log"
  # fp8 weights + bf16 KV, then bf16 + bf16: what the fp8 KV costs prefill (its chunks attend through a
  # dequantized bf16 copy), and the bf16 goal's prefill.
  for kvw in "fp8 bf16" "none bf16"; do
    set -- $kvw
    t0=$(date +%s)
    "${bench[@]}" --workload prefill --prefill-chunks "${CHUNKS2:-8192,16384}" --prefill-requests 128 \
      --quantization "$1" --kv-cache-dtype "$2" --max-num-seqs "$seqs" --json "$out/prefill_w$1_kv$2.json" \
      > "$logs/prefill_w$1_kv$2.log" 2>&1
    echo "== weights $1 (none: bf16), KV $2: prefill alone ($(( $(date +%s) - t0 )) s)"
    summary "^prefill,|error|prefill-carrying" "$logs/prefill_w$1_kv$2.log"
  done
fi

if [ "${PARTS:-all}" != profile ]; then
  t0=$(date +%s)
  "${bench[@]}" --workload random --sampling greedy --num-requests 1000 --input-len 1000 --output-len 1000 \
    --quantization fp8 --kv-cache-dtype fp8 --max-num-seqs "$seqs" --max-tokens-per-step "$tokens" \
    --max-seconds "$cap" --json "$out/engine_1kx1k.json" > "$logs/engine_1kx1k.log" 2>&1
  echo "== engine 1,000 x 1,000, fp8 + fp8 KV, $seqs seqs, $tokens tokens/step ($(( $(date +%s) - t0 )) s)"
  summary "^engine|step time|step profile|error|pool" "$logs/engine_1kx1k.log"

  t0=$(date +%s)
  "$b/run.sh" pagoda serve --model "$b/llama3-8b-random" --load-format random --device cuda --host 127.0.0.1 \
    --port 0 --max-queued 1024 --quantization fp8 --kv-cache-dtype fp8 --max-num-seqs "$seqs" \
    --max-tokens-per-step "$tokens" --max-model-len 2048 > "$logs/serve.log" 2>&1 &
  pid=$! port=""
  for _ in $(seq 240); do
    port=$(grep -oP 'listening on http://[0-9.]+:\K[0-9]+' "$logs/serve.log" | head -1)
    [ -n "$port" ] && python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/health', timeout=1)" 2>/dev/null && break
    kill -0 $pid 2>/dev/null || break
    sleep 0.5
  done
  echo "== HTTP 1,000 x 1,000, same settings (serve up after $(( $(date +%s) - t0 )) s, port $port)"
  if [ -n "$port" ]; then
    timeout "$cap" "$b/run.sh" pagoda bench serve --url "http://127.0.0.1:$port" --concurrency 1000 --requests 1000 \
      --prompt-tokens 1000 --output-tokens 1000 --token-high 120000 --warmup 1 --label "fp8w_fp8kv_${seqs}" \
      --csv "$out/tput.csv" --no-progress > "$logs/bench_serve.log" 2>&1
    tail -12 "$logs/bench_serve.log" | sed 's/^/  /'
    python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:$port/metrics').read().decode())" \
      > "$logs/metrics.txt" 2>&1
    grep -E '^pagoda_(preemptions_total|swap_preemptions_total|engine_steps_total|kv_blocks_total|prompt_tokens_total|generation_tokens_total) ' "$logs/metrics.txt" | sed 's/^/  /'
  fi
  kill $pid 2>/dev/null; wait $pid 2>/dev/null
  summary "capacity|preempt|error" "$logs/serve.log" | tail -4
  cat "$out/tput.csv" 2>/dev/null
fi
tar czf "$out/logs.tar.gz" -C "$out" logs && rm -rf "$logs"
