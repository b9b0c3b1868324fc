#!/bin/bash
# Jump-forward on vs off through HTTP on the CPU (docs/BENCHMARKS.md, "Jump-forward on the CPU"):
# the bundled model served with and without --no-jump-forward, each loaded by `pagoda bench serve`
# with a json_schema of long fixed keys (greedy), then the engine's step and forced-token counters.
#
#   bench/serve/jump_forward_cpu.sh            (from the repository root, after building build/pagoda)
#   MODES="on off on off" CONC=1 REQS=12 bench/serve/jump_forward_cpu.sh
set -u
PAGODA=${PAGODA:-build/pagoda}
MODEL=${MODEL:-models/pagoda-tiny}
SCHEMA='{"type":"array","minItems":60,"items":{"type":"object","properties":{"customer_full_name":{"type":"string","maxLength":6},"customer_account_number":{"type":"integer"},"subscription_status":{"enum":["active_and_paid","cancelled_by_customer"]}},"required":["customer_full_name","customer_account_number","subscription_status"],"additionalProperties":false}}'
EXTRA="{\"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": \"customers\", \"schema\": $SCHEMA}}, \"temperature\": 0}"
for mode in ${MODES:-on off}; do
  log=$(mktemp)
  flag=""
  [ "$mode" = off ] && flag="--no-jump-forward"
  "$PAGODA" serve --model "$MODEL" --host 127.0.0.1 --port 0 --max-running 16 $flag > "$log" 2>&1 &
  pid=$!
  port=""
  for _ in $(seq 1 150); do
    port=$(grep -oE 'http://127\.0\.0\.1:[0-9]+' "$log" | head -1 | sed 's/.*://')
    [ -n "$port" ] && curl -s "127.0.0.1:$port/v1/models" > /dev/null && break
    sleep 0.2
  done
  [ -z "$port" ] && { echo "server did not start: $(cat "$log")"; kill $pid; exit 1; }
  "$PAGODA" bench serve --url "http://127.0.0.1:$port" --concurrency "${CONC:-1,4}" --requests "${REQS:-8}" \
    --prompt-tokens 64 --output-tokens 256 --extra-body "$EXTRA" --label "jump_forward_$mode" --no-progress | tail -n +2
  curl -s "127.0.0.1:$port/metrics" |
    grep -E '^pagoda_(jump_forward_tokens_total|generation_tokens_total|engine_steps_total|grammar_cache_bytes) '
  kill $pid
  wait $pid 2>/dev/null
  rm -f "$log"
done
