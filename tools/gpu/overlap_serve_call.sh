#!/usr/bin/env bash
# Overlapped engine steps through HTTP (issue 23's goals are measured over HTTP): `pagoda serve` on the
# Llama-3-8B shape (random weights, the Llama 3 tokenizer) with --overlap-steps off and auto (on with
# cuda), alternating, each measured by `pagoda bench serve`:
#   itl   batch-1 inter-token latency (--concurrency 1, 128-token prompts, 256 out), fp8 + fp8 KV and
#         bf16 + bf16 KV, plus the stdlib-Python streaming client of serve_itl_call.sh on fp8;
#   1k    1,000 x 1,000 in / 1,000 out all at once, fp8 weights + fp8 KV, 512 running, 16,384 tokens a step.
# Bundle: DEST=/work/main/.device/<name> tools/gpu/serve_measure_call.sh bundle; cp this script and
# tools/gpu/serve_itl_call.sh there. Run (carry .device/<name>): [PARTS="itl 1k"] bash .device/<name>/overlap_serve_call.sh
set -u
dir=$(cd "$(dirname "$0")" && pwd); b=$dir/bundle
[ -x "$b/run.sh" ] || tar xzf "$dir/bundle.tar.gz" -C "$dir"
out=${OUT:-/tmp/overlap_serve}; mkdir -p "$out"
echo "commit $(cat "$b/commit") $(date -u +%T)"; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
# The independent client: serve_itl_call.sh's heredoc.
sed -n "/^cat > \"\$out\/client.py\" <<'PY'$/,/^PY$/p" "$dir/serve_itl_call.sh" | sed '1d;$d' > "$out/client.py"
serve() {  # label serve-flags...: starts a server, sets port and pid
  local label=$1; shift; local t0; t0=$(date +%s)
  "$b/run.sh" pagoda serve --model "$b/llama3-8b-random" --load-format random --device cuda \
    --host 127.0.0.1 --port 0 --max-queued 1024 "$@" > "$out/serve_$label.log" 2>&1 &
  pid=$!; port=""
  for _ in $(seq 1 120); do
    port=$(grep -oP 'listening on http://[0-9.]+:\K[0-9]+' "$out/serve_$label.log" | head -1)
    [ -n "$port" ] && python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/health', timeout=1)" 2>/dev/null && break
    sleep 1
  done
  echo "== $label: serve up after $(( $(date +%s) - t0 )) s"
}
parts=" ${PARTS:-itl 1k} "
if [[ $parts == *" itl "* ]]; then
  for round in 1 2; do
    for ov in off auto; do
      for kind in fp8 bf16; do
        args=(--kv-cache-dtype "$kind" --max-num-seqs 64 --overlap-steps "$ov"); [ "$kind" = fp8 ] && args+=(--quantization fp8)
        serve "itl_${kind}_$ov" "${args[@]}"
        timeout 60 "$b/run.sh" pagoda bench serve --url "http://127.0.0.1:$port" --concurrency 1 --requests 6 \
          --prompt-tokens 128 --output-tokens 256 --warmup 1 --label "r${round}_${kind}_overlap_$ov" --csv "$out/itl.csv" \
          --no-progress 2>&1 | grep -E "ITL|itl|tok/s" | head -3
        [ "$kind" = fp8 ] && timeout 60 python3 "$out/client.py" "$port" 4
        kill $pid; wait $pid 2>/dev/null
      done
    done
  done
fi
if [[ $parts == *" 1k "* ]]; then
  for ov in off auto; do
    serve "1k_$ov" --quantization fp8 --kv-cache-dtype fp8 --max-num-seqs 512 --max-tokens-per-step 16384 \
      --max-model-len 2048 --overlap-steps "$ov"
    timeout ${BENCH_LIMIT:-150} "$b/run.sh" pagoda bench serve --url "http://127.0.0.1:$port" --concurrency 1000 \
      --requests 1000 --prompt-tokens 1000 --output-tokens 1000 --token-high 120000 --warmup 1 --label "1k_overlap_$ov" \
      --csv "$out/tput.csv" --no-progress 2>&1 | tail -12
    kill $pid; wait $pid 2>/dev/null
    grep -iE "error|preempt" "$out/serve_1k_$ov.log" | tail -3
  done
fi
cat "$out"/*.csv
cd "$out" && tar czf logs.tar.gz ./*.log 2>/dev/null && rm -f ./*.log
