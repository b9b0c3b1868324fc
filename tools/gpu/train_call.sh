#!/usr/bin/env bash
# Retrains the bundled model (models/pagoda-tiny) with a 2,048-token context and in-context recall
# training (issue #21), in ONE device call. Packed here with
#   tools/gpu/train_call.sh bundle     # -> /work/main/.device/train2k (DEST=...): the training
#                                      #    scripts, the extracted text (tools/train/extract_text.py,
#                                      #    xz-compressed) and the commit
# then in one device call (carry .device/train2k), from the checkout's root:
#   .device/train2k/train_call.sh run
# Knobs (environment): MINUTES (train.py --minutes, the whole run's wall-time budget; default 3.0,
# for a call of timeout_s 200; 7 for a 10-minute call), EPOCHS (default 8,16), RESERVE (seconds
# kept back for export and evaluation, default 50), EXTRA (more train.py flags).
# Brings back under $OUT the 8 files train.py writes: model/{config.json, generation_config.json,
# model.safetensors, tokenizer.json, tokenizer_config.json}, train_report.json, loss.csv,
# loss_curve.png; the log is the call's output, which ends with the figures that decide the swap.
# The previous models/pagoda-tiny (in the checkout) is scored alongside as the baseline.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
case "${1:-}" in
bundle)
  set -e
  dest=${DEST:-/work/main/.device/train2k}
  data=${DATA:-$root/.cache/train-data}
  [ -f "$data/train.jsonl" ] || python3 "$root/tools/train/extract_text.py" --out "$data"
  rm -rf "$dest" && mkdir -p "$dest"
  cp "$root/tools/train/train.py" "$root/tools/train/recall_data.py" "$0" "$dest/"
  tar cJf "$dest/train-data.tar.xz" -C "$data" train.jsonl heldout.jsonl chat.jsonl \
    heldout_sample.txt manifest.json
  git -C "$root" rev-parse --short HEAD > "$dest/commit"
  du -sh "$dest"
  ;;
run)
  out=${OUT:-/tmp/train_call}
  mkdir -p "$out"
  cd "$root"
  echo "commit $(cat "$here/commit")  $(date -u +%FT%TZ)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  data=$(mktemp -d)
  tar xJf "$here/train-data.tar.xz" -C "$data" || exit 1
  minutes=${MINUTES:-3.0}
  # train.py stops training at its own deadline; the timeout is only a guard against a hang.
  PYTHONUNBUFFERED=1 timeout "$(python3 -c "print(int(${minutes} * 60 + 15))")" \
    python3 "$here/train.py" --data "$data" --out "$out" --minutes "$minutes" \
    --reserve-seconds "${RESERVE:-50}" --epochs "${EPOCHS:-8,16}" \
    --baseline-model models/pagoda-tiny ${EXTRA:-}
  rc=$?
  echo "train.py rc=$rc"
  python3 - "$out/train_report.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print("status:", r.get("status"), "| elapsed_s:", r.get("elapsed_s"), "| errors:",
      [e.get("stage") + ": " + e.get("error", "")[:200] for e in r.get("errors", [])])
t = r.get("training", {})
for run in t.get("runs", []):
    print("run", run["run"], "steps", run["steps"], "best step", run["best_step"], "val ppl(bf16)",
          run["best_val_perplexity_bf16"], "recall(tf)", run.get("best_recall_teacher_forced"),
          "probe", run.get("probe"))
print("chosen:", t.get("chosen_run"))
for k, v in r.get("perplexity", {}).items():
    if isinstance(v, dict):
        print("ppl", k, v.get("perplexity"), "tokens", v.get("tokens"))
rc = r.get("recall", {})
for k in ("eval_words", "heldout_vocabulary_words"):
    if k in rc:
        print("recall", k, rc[k]["token_accuracy"], rc[k]["by_depth"])
print("recall goal met:", rc.get("goal_met"))
b = r.get("baseline", {})
print("baseline:", {k: v for k, v in b.items() if k != "model"})
print("files:", r.get("files"))
PY
  exit $rc
  ;;
*)
  echo "usage: $0 bundle|run" >&2
  exit 2
  ;;
esac
