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
# kept back for export and evaluation, default 50), EXTRA (more train.py flags), VARIANTS (recipes
# trained side by side on the one GPU: '|'-separated train.py flag sets, each added to EXTRA; the
# variant meeting both goals with the lowest perplexity ratio is kept (else the best greedy
# recall), its files come back, and its report's "variants" lists every variant's figures).
# INIT_FROM=DIR at bundle time packs a checkpoint (e.g. models/pagoda-tiny) as init/; run then
# continues it (train.py --init-from: its tokenizer verbatim, its weights, context raised) and
# scores it as the baseline (BASELINE=DIR scores DIR instead).
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
  cp "$root/tools/train/train.py" "$root/tools/train/recall_data.py" \
    "$root/tools/train/short_copy.py" "$root/tools/train/gap_copy.py" "$0" "$root/tools/gpu/train_continue_call.sh" "$dest/"
  tar cJf "$dest/train-data.tar.xz" -C "$data" train.jsonl heldout.jsonl chat.jsonl \
    heldout_sample.txt manifest.json
  if [ -n "${INIT_FROM:-}" ]; then
    # Continued training (stage 2): the checkpoint travels with the bundle as init/.
    mkdir -p "$dest/init"
    for f in config.json generation_config.json model.safetensors tokenizer.json \
      tokenizer_config.json; do
      cp "$INIT_FROM/$f" "$dest/init/"
    done
  fi
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
  baseline=models/pagoda-tiny
  if [ -d "$here/init" ]; then
    # A bundle made with INIT_FROM: continue that checkpoint, and score it as the baseline.
    # BASELINE=DIR scores another model instead (e.g. models/pagoda-tiny when init/ is itself a
    # stage-2 checkpoint: the perplexity goal is against the current bundled model).
    EXTRA="--init-from $here/init ${EXTRA:-}"
    baseline=${BASELINE:-$here/init}
  fi
  guard=$(python3 -c "print(int(${minutes} * 60 + 15))")
  if [ -n "${VARIANTS:-}" ]; then
    # Side by side: each variant writes to its own folder; only the kept one comes back.
    IFS='|' read -r -a variants <<< "$VARIANTS"
    pids=()
    for i in "${!variants[@]}"; do
      rm -rf "/tmp/variant$i" "/tmp/variant$i.log" && mkdir -p "/tmp/variant$i"
      echo "variant $i: ${EXTRA:-} ${variants[$i]}"
      # shellcheck disable=SC2086 # flags split on purpose
      PYTHONUNBUFFERED=1 timeout "$guard" python3 "$here/train.py" --data "$data" \
        --out "/tmp/variant$i" --minutes "$minutes" --reserve-seconds "${RESERVE:-50}" \
        --epochs "${EPOCHS:-8,16}" --baseline-model "$baseline" ${EXTRA:-} \
        ${variants[$i]} > "/tmp/variant$i.log" 2>&1 &
      pids+=($!)
    done
    rc=0
    for i in "${!pids[@]}"; do
      wait "${pids[$i]}" || rc=$?
      echo "=== variant $i (rc so far $rc)"
      grep -E "probe|step [0-9]+/[0-9]+ .*val|short copy rows [0-9]|gap rows G|recall |perplexity heldout_full|baseline:|Error|error" \
        "/tmp/variant$i.log" | grep -v "greedy " | cut -c1-600 | tail -40
    done
    python3 - "$out" "${#variants[@]}" "$VARIANTS" <<'PY'
import json, os, shutil, sys
out, count, flags = sys.argv[1], int(sys.argv[2]), sys.argv[3].split("|")
rows = []
for i in range(count):
    path = f"/tmp/variant{i}/train_report.json"
    if not os.path.exists(path):
        rows.append({"variant": i, "flags": flags[i], "error": "no report"})
        continue
    r = json.load(open(path))
    rc, b = r.get("recall", {}), r.get("baseline", {})
    acc = [rc[k]["token_accuracy"] for k in ("eval_words", "heldout_vocabulary_words") if k in rc]
    rows.append({"variant": i, "flags": flags[i], "status": r.get("status"),
                 "recall_eval_words": rc.get("eval_words", {}).get("token_accuracy"),
                 "recall_heldout_words": rc.get("heldout_vocabulary_words", {}).get("token_accuracy"),
                 "recall_min": min(acc) if acc else -1.0,
                 "recall_goal_met": bool(rc.get("goal_met")),
                 "ppl_ratio": b.get("heldout_full_ratio_new_over_baseline_window_1024"),
                 "ppl_goal_met": bool(b.get("goal_met")),
                 "chosen_run": r.get("training", {}).get("chosen", {})})
ok = [v for v in rows if v.get("recall_goal_met") and v.get("ppl_goal_met")]
pick = (min(ok, key=lambda v: v["ppl_ratio"]) if ok else
        max((v for v in rows if "error" not in v), key=lambda v: v["recall_min"], default=None))
for v in rows:
    print("variant", json.dumps({k: v.get(k) for k in ("variant", "flags", "recall_eval_words",
          "recall_heldout_words", "ppl_ratio", "recall_goal_met", "ppl_goal_met")}))
if pick is None:
    sys.exit("no variant produced a report")
print("kept variant", pick["variant"], "(both goals met)" if ok else "(goals NOT met: best recall)")
src = f"/tmp/variant{pick['variant']}"
report = json.load(open(f"{src}/train_report.json"))
report["variants"] = {"kept": pick["variant"], "rule": "both goals met, lowest perplexity "
                      "ratio; else the best greedy recall", "variants": rows}
for name in os.listdir(src):
    if name != "train_report.json" and not name.endswith(".tmp"):
        (shutil.copytree if os.path.isdir(f"{src}/{name}") else shutil.copy)(
            f"{src}/{name}", f"{out}/{name}")
json.dump(report, open(f"{out}/train_report.json", "w"), indent=1, default=str)
PY
  else
    PYTHONUNBUFFERED=1 timeout "$guard" \
      python3 "$here/train.py" --data "$data" --out "$out" --minutes "$minutes" \
      --reserve-seconds "${RESERVE:-50}" --epochs "${EPOCHS:-8,16}" \
      --baseline-model "$baseline" ${EXTRA:-}
    rc=$?
  fi
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
        print("recall", k, rc[k]["token_accuracy"], "s.e.", rc[k].get("standard_error_over_lists"), rc[k]["by_depth"])
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
