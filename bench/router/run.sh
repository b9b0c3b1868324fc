#!/usr/bin/env bash
# Router benchmark on this machine (CPU): 3 `pagoda serve` replicas of the
# bundled model behind `pagoda route`, a multi-turn chat workload
# (multi_turn.py) under each policy, then kv-aware again with one replica
# killed mid-run. Every run starts fresh replicas, so every policy starts
# from cold caches. Appends to results.csv here; logs and each run's router
# /metrics go to $LOGS (default /tmp/pagoda-router-bench).
#
#   bench/router/run.sh [build-dir] [extra multi_turn.py flags...]
#   SERVE_FLAGS="--kv-cache-memory 48MiB" TAG=small-kv bench/router/run.sh build   (a KV cache that
#     holds about a third of the workload per replica)
#   SKIP_KILL=1 ...   leaves out the run with a replica killed
# Before each run stops, every replica's /metrics goes to $LOGS too (evictions, cache usage).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="${1:-$root/build}"
shift || true
pagoda="$build/pagoda"
model="$root/models/pagoda-tiny"
out="$root/bench/router"
logs="${LOGS:-/tmp/pagoda-router-bench}"
mkdir -p "$logs"
# Three replicas share the machine's cores: one compute thread each.
export PAGODA_THREADS=1 OPENBLAS_NUM_THREADS=1
ports=(18701 18702 18703)
router_port=18700
pids=()

wait_health() {  # wait_health PORT
  for _ in $(seq 200); do
    curl -sf "http://127.0.0.1:$1/health" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "nothing healthy on port $1; see $logs" >&2
  exit 1
}

start_all() {  # start_all POLICY
  pids=()
  for p in "${ports[@]}"; do
    # shellcheck disable=SC2086
    "$pagoda" serve --model "$model" --port "$p" --max-queued 64 ${SERVE_FLAGS:-} > "$logs/serve_$p.log" 2>&1 &
    pids+=($!)
  done
  for p in "${ports[@]}"; do wait_health "$p"; done
  local backends=()
  for p in "${ports[@]}"; do backends+=(--backend "http://127.0.0.1:$p"); done
  "$pagoda" route --model "$model" --policy "$1" --port "$router_port" "${backends[@]}" \
    > "$logs/route_$1.log" 2>&1 &
  pids+=($!)
  wait_health "$router_port"
  sleep 0.5  # the router's first KV event reads
}

save_replica_metrics() {  # save_replica_metrics RUN
  for p in "${ports[@]}"; do curl -s "http://127.0.0.1:$p/metrics" > "$logs/replica_${p}_$1.txt" || true; done
}

stop_all() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap stop_all EXIT

for policy in round-robin least-loaded kv-aware; do
  start_all "$policy"
  python3 "$out/multi_turn.py" --url "http://127.0.0.1:$router_port" --label "${TAG:+$TAG }$policy" --csv "$out/results.csv" "$@"
  curl -s "http://127.0.0.1:$router_port/metrics" > "$logs/metrics_$policy.txt"
  save_replica_metrics "$policy"
  stop_all
done

if [[ -n "${SKIP_KILL:-}" ]]; then
  echo "appended to $out/results.csv; logs in $logs"
  exit 0
fi
start_all kv-aware
python3 "$out/multi_turn.py" --url "http://127.0.0.1:$router_port" --label "${TAG:+$TAG }kv-aware, replica 2 killed" \
  --kill-pid "${pids[1]}" --csv "$out/results.csv" "$@"
curl -s "http://127.0.0.1:$router_port/metrics" > "$logs/metrics_kill.txt"
grep -E '^pagoda_router_(retries_total|backend_healthy)' "$logs/metrics_kill.txt" || true
stop_all
echo "appended to $out/results.csv; logs in $logs"
