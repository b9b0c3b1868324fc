#!/usr/bin/env bash
# Tensor parallelism across GPUs over NCCL (issue #26, docs/TENSOR_PARALLEL.md), for the multi-GPU kinds
# (nvidia-h200-x2 / -x4; on one H200 only the first part means anything). NCCL_NVLS_ENABLE=0 throughout
# (NVLink multicast off, as the device notes require; the communicators set it too). Parts (PARTS, comma
# separated, default all; each bench part is one device call of up to 600 s):
#   nccl      nccl_communicator_gpu_test at one rank per visible GPU (nranks = 2 / 4): every collective
#             against the host, bad device lists.
#   correct   `pagoda generate --device cuda --tensor-parallel-size N` (N = 2, and 4 when 4 GPUs) on
#             models/pagoda-tiny against TP=1: 32 greedy tokens, the start-up line naming NCCL.
#   70b       the Llama-3-70B shape (random bf16 weights, fp8 KV) served at TP=2 and TP=4 (when 4 GPUs):
#             `pagoda bench serve`, REQUESTS (default 1000) requests of 1,000 prompt / 1,000 output tokens at
#             CONCURRENCY (default 256): output tok/s, TTFT and inter-token latency percentiles.
#   8b        the Llama-3-8B shape the same way at TP=1, 2 and 4 (what the GPUs allow): scaling efficiency
#             = tok/s at TP=N / (N x tok/s at TP=1).
# Every bench row goes to $OUT/tp_bench.csv (bench serve's columns, label "<shape> TP=<n>"), and
# $OUT/tp_figures.md is the table for docs/BENCHMARKS.md (date, commit, machine and command included).
#
# Here:   tools/gpu/tp_nccl_call.sh bundle [BUILD_DIR]   (default build-cuda, -DPAGODA_CUDA=ON with NCCL)
#         packs DEST (default /work/main/.device/tp: a device call sends the session's checkout)
# There:  run(command="PARTS=nccl,correct bash .device/tp/tp_nccl_call.sh run", carry=[".device/tp"],
#             kind="nvidia-h200-x4", timeout_s=300), then PARTS=70b and PARTS=8b in calls of their own
#             (timeout_s up to 600; REQUESTS=256 if a 1,000-request run does not fit), from the
#             repository root (models/pagoda-tiny comes from the checkout).
# Results: $OUT/tp_nccl.txt (everything printed), $OUT/tp_bench.csv, $OUT/tp_figures.md, $OUT/logs/.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
case "${1:-}" in
bundle)
  set -e
  here=$(cd "$(dirname "$0")/../.." && pwd)
  build=${2:-$here/build-cuda}
  dest=${DEST:-/work/main/.device/tp}
  ninja -C "$build" -j2 nccl_communicator_gpu_test pagoda_cli
  rm -rf "$dest" && mkdir -p "$dest"
  stage=$(mktemp -d)
  "$here/scripts/device-bundle.sh" "$stage/bundle" "$build/tests/parallel/nccl_communicator_gpu_test" "$build/pagoda"
  strip "$stage"/bundle/bin/* || true
  for shape in 70b 8b; do
    mkdir -p "$stage/bundle/llama3-$shape-random"
    cp "$here/.cache/npm/llama3/package/models/tokenizer.json" \
       "$here/.cache/npm/llama3/package/models/tokenizer_config.json" "$stage/bundle/llama3-$shape-random/"
  done
  cp "$here/tools/gpu/llama3_70b_config.json" "$stage/bundle/llama3-70b-random/config.json"
  cp "$here/tools/gpu_backend/llama3_8b_config.json" "$stage/bundle/llama3-8b-random/config.json"
  git -C "$here" rev-parse --short HEAD > "$stage/bundle/commit"
  tar cJf "$dest/bundle.tar.xz" -C "$stage" bundle
  cp "$0" "$dest/tp_nccl_call.sh"
  rm -rf "$stage"
  ls -la "$dest"
  du -sh "$dest"
  ;;
run)
  dir=$(cd "$(dirname "$0")" && pwd)
  root=$(pwd)
  rm -rf /tmp/bundle && tar xJf "$dir/bundle.tar.xz" -C /tmp
  bundle=/tmp/bundle
  out=${OUT:-/tmp/tp_nccl}
  logs=$out/logs
  mkdir -p "$logs"
  parts=",${PARTS:-all},"
  want() { [[ $parts == *",all,"* || $parts == *",$1,"* ]]; }
  gpus=$(nvidia-smi -L | wc -l)
  sizes=(2)
  [ "$gpus" -ge 4 ] && sizes=(2 4)
  requests=${REQUESTS:-1000}
  concurrency=${CONCURRENCY:-256}
  machine="$gpus x $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
  pids=()
  stop_all() {
    for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    pids=()
  }
  trap stop_all EXIT
  port_of() {  # port_of LOG PID: the port of the server's "listening on http://HOST:PORT" line
    local p
    for _ in $(seq 3000); do
      p=$(grep -o 'listening on http://[^ ]*' "$logs/$1" 2>/dev/null | head -1 | sed 's/.*://; s/[^0-9]//g')
      [ -n "$p" ] && { echo "$p"; return 0; }
      kill -0 "$2" 2>/dev/null || { echo "server of $1 exited" >&2; tail -5 "$logs/$1" >&2; return 1; }
      sleep 0.2
    done
    return 1
  }
  # bench SHAPE TP: serve the shape at TP ranks on a free port, load it, stop it.
  bench() {
    local shape=$1 tp=$2 log="serve_$1_tp$2.log" port
    "$bundle/run.sh" pagoda serve --model "$bundle/llama3-$shape-random" --load-format random --device cuda \
      --kv-cache-dtype fp8 --tensor-parallel-size "$tp" --max-num-seqs "$concurrency" \
      --host 127.0.0.1 --port 0 > "$logs/$log" 2>&1 &
    pids+=($!)
    if port=$(port_of "$log" $!); then
      grep -E "tensor parallel|weights|KV" "$logs/$log" | head -4
      "$bundle/run.sh" pagoda bench serve --url "http://127.0.0.1:$port" --concurrency "$concurrency" \
        --requests "$requests" --prompt-tokens 1000 --output-tokens 1000 --warmup 8 --token-high 128000 \
        --label "$shape TP=$tp" --csv "$out/tp_bench.csv" --no-progress
    fi
    stop_all
  }
  {
    echo "commit $(cat $bundle/commit), $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
    echo "GPUs: $gpus; NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE; parts ${PARTS:-all}"
    date -u
    if want nccl; then
      NCCL_DEBUG=WARN timeout 90 "$bundle/run.sh" nccl_communicator_gpu_test
      echo "nccl_communicator_gpu_test exit $?"
    fi
    if want correct; then
      gen=(pagoda generate --model "$root/models/pagoda-tiny" --prompt "In the beginning God created the heaven and the earth."
           --max-tokens 32 --ignore-eos --device cuda --kv-cache-memory 64MiB)
      timeout 60 "$bundle/run.sh" "${gen[@]}" > "$logs/gen_tp1.txt" 2> "$logs/gen_tp1.err"
      for tp in "${sizes[@]}"; do
        timeout 90 "$bundle/run.sh" "${gen[@]}" --tensor-parallel-size "$tp" > "$logs/gen_tp$tp.txt" 2> "$logs/gen_tp$tp.err"
        grep "tensor parallel" "$logs/gen_tp$tp.err"
        if cmp -s "$logs/gen_tp1.txt" "$logs/gen_tp$tp.txt"; then echo "generate TP=$tp over NCCL: the same text as TP=1"
        else echo "generate TP=$tp over NCCL DIFFERS from TP=1:"; cat "$logs/gen_tp1.txt" "$logs/gen_tp$tp.txt"; fi
      done
    fi
    if want 70b; then for tp in "${sizes[@]}"; do bench 70b "$tp"; done; fi
    if want 8b; then for tp in 1 "${sizes[@]}"; do bench 8b "$tp"; done; fi
    if [ -f "$out/tp_bench.csv" ]; then
      python3 - "$out/tp_bench.csv" "$out/tp_figures.md" "$(cat $bundle/commit)" "$machine" "$requests" "$concurrency" <<'PY'
import csv, sys, datetime
rows = list(csv.DictReader(open(sys.argv[1])))
commit, machine, requests, concurrency = sys.argv[3:7]
base = {r["label"].split(" TP=")[0]: float(r["output_tok_s"]) for r in rows if r["label"].endswith("TP=1")}
cols = [c for c in ("ttft_p50_s", "ttft_p99_s", "itl_p50_s", "itl_p99_s", "latency_mean_s") if rows and c in rows[0]]
out = [f"{datetime.date.today()}, commit {commit}, {machine}, NCCL_NVLS_ENABLE=0, random bf16 weights, fp8 KV: "
       f"`pagoda serve --load-format random --tensor-parallel-size N --kv-cache-dtype fp8 --max-num-seqs {concurrency}` + "
       f"`pagoda bench serve --concurrency {concurrency} --requests {requests} --prompt-tokens 1000 --output-tokens 1000` "
       "(tools/gpu/tp_nccl_call.sh)", "",
       "| run | failed | output tok/s | scaling vs N x TP=1 | " + " | ".join(cols) + " |",
       "|---|---|---|---|" + "---|" * len(cols)]
for r in rows:
    shape, tp = r["label"].split(" TP=")
    tok = float(r["output_tok_s"])
    scale = f"{tok / (int(tp) * base[shape]):.2f}" if shape in base else "-"
    out.append(f"| {r['label']} | {r['failed']} | {tok:.0f} | {scale} | " + " | ".join(r[c] for c in cols) + " |")
open(sys.argv[2], "w").write("\n".join(out) + "\n")
print("\n".join(out))
PY
    fi
    date -u
  } 2>&1 | tee -a "$out/tp_nccl.txt"
  ;;
*)
  echo "usage: $0 bundle [BUILD_DIR] | run" >&2
  exit 2
  ;;
esac
