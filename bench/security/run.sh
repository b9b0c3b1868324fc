#!/usr/bin/env bash
# The KS timing benchmark (ks_timing.py) against `pagoda serve` on the bundled
# model, once per defence: none, per-user salt, prefix-share unit, TTFT floor
# (scope all / hits). Writes bench/security/ks_results.csv. A right guess shares
# 448 of 640 prompt tokens with the victim's secret; honest traffic shares a
# 448-token system prompt (below the 512-token share unit: what the unit costs).
#
#   bench/security/run.sh [build-dir] [model-dir] [samples] [floor-ms]
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="${1:-$root/build}"
model="${2:-$root/models/pagoda-tiny}"
samples="${3:-60}"
floor="${4:-2000}"
out="$root/bench/security"
port=18471
keys="$(mktemp)"
log="$(mktemp)"
trap 'rm -f "$keys" "$log"' EXIT
echo '{"keys": [{"key": "sk-app", "tenant": "acme", "user_salt": true}]}' > "$keys"

serve() {  # serve <extra flags...>
  "$build/pagoda" serve --model "$model" --port "$port" --api-keys "$keys" --kv-cache-memory 268435456 \
    --max-running 16 "$@" > "$log" 2>&1 &
  server_pid=$!
  for _ in $(seq 100); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  echo "server did not start:" >&2
  cat "$log" >&2
  exit 1
}
stop() { kill -TERM "$server_pid"; wait "$server_pid" || true; }
run() {  # run <config> <attacker> <ks flags> -- <serve flags>
  local config="$1" attacker="$2"; shift 2
  local ks=()
  while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do ks+=("$1"); shift; done
  shift
  serve "$@"
  python3 "$out/ks_timing.py" --port "$port" --config "$config" --attacker "$attacker" --samples "$samples" \
    "${ks[@]}" | tee -a "$out/ks_results.csv"
  stop
}

echo "config,attacker,d,p_value,hit_ms_median,miss_ms_median,n,cost_ttft_mean_ms,cost_ttft_p50_ms,cost_ttft_p95_ms,cost_rps" \
  > "$out/ks_results.csv"
run none same --
run user_salt other-user --cost-salted --
run share_unit_512 same -- --prefix-share-min-tokens 512
run ttft_floor_all_${floor}ms same -- --cache-hit-ttft-floor-ms "$floor"
run ttft_floor_hits_${floor}ms same -- --cache-hit-ttft-floor-ms "$floor" --cache-hit-ttft-floor-scope hits
