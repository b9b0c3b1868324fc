#!/usr/bin/env bash
# Serving benchmark on this machine: starts `pagoda serve` on loopback, runs
# `pagoda bench serve` (a concurrency sweep, then the article's customer-service
# case: a shared 2,000-token system prompt + 100 unique tokens per request,
# prefix cache on vs off), writes results.csv / prefix.csv and PNG plots here.
#
#   bench/serve/run.sh [build-dir] [model-dir]
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="${1:-$root/build-engine}"
model="${2:-$root/models/pagoda-tiny}"
name="$(basename "$model")"
out="$root/bench/serve"
pagoda="$build/pagoda"
port=18431

serve() {  # serve <extra flags...>; sets server_pid
  "$pagoda" serve --model "$model" --port "$port" --max-model-len 2304 --kv-cache-memory 1073741824 \
    --max-running 32 --max-queued 512 "$@" > "$out/server.log" 2>&1 &
  server_pid=$!
  for _ in $(seq 100); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  echo "server did not start; see $out/server.log" >&2
  exit 1
}
stop() { kill -TERM "$server_pid"; wait "$server_pid"; }

rm -f "$out/results.csv" "$out/prefix.csv"
url="http://127.0.0.1:$port"

serve
"$pagoda" bench serve --url "$url" --model "$name" --label sweep --concurrency 1,2,4,8,16 --requests 32 \
  --prompt-tokens 128 --output-tokens 32 --csv "$out/results.csv" --plot "$out/latency_throughput.png"
"$pagoda" bench serve --url "$url" --model "$name" --label prefix-on --concurrency 1,4,8 --requests 16 \
  --shared-prefix-tokens 2000 --prompt-tokens 100 --output-tokens 16 --csv "$out/prefix.csv"
curl -s "$url/metrics" | grep -E '^pagoda_(prefix_cache_hit_rate|preemptions_total|kv_blocks_total) ' || true
stop

serve --no-prefix-cache
"$pagoda" bench serve --url "$url" --model "$name" --label prefix-off --concurrency 1,4,8 --requests 16 \
  --shared-prefix-tokens 2000 --prompt-tokens 100 --output-tokens 16 --csv "$out/prefix.csv" \
  --plot "$out/prefix_on_off.png"
stop
echo "wrote $out/results.csv $out/prefix.csv and plots"
