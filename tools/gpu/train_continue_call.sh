#!/usr/bin/env bash
# Stage 2 of the bundled model (issue #21): continue models/pagoda-tiny (stage 1, the 1,024-context
# recipe of docs/MODEL.md) at a 2,048 context with recall rows and short copy rows (train.py
# --short-copy-rows: tiled random-token rows of 128 tokens in a second forward, growing to 2,048 as
# their copy accuracy passes 0.5), three variants side by side on the one GPU, in ONE device call.
# Packed here with
#   INIT_FROM=models/pagoda-tiny DEST=/work/main/.device/train6 tools/gpu/train_call.sh bundle
#   cp tools/gpu/train_continue_call.sh /work/main/.device/train6/run.sh
# then (carry .device/train6, timeout_s 480):
#   MINUTES=7.0 RESERVE=130 EPOCHS=16 VARIANTS='...' .device/train6/run.sh
# (defaults below: continue at lr 1e-3; continue at lr 4e-4 with 8 text rows a step, so the text is
# seen half as often; from scratch with the same tokenizer and mix, stage 1's lr). It runs
# train_call.sh run (which keeps the variant meeting both goals with the lowest perplexity ratio,
# else the best greedy recall), then makes the kept model's tokenizer fixture (transformers; the
# tokenizer is the stage-1 one, so it should equal tests/fixtures/tokenizer/pagoda-tiny.json), and
# packs what comes back into two files, since a call returns at most 8: $OUT/model.safetensors (in
# parts when over 16 MiB, below) and
# $OUT/results.tar.xz (model/*.json, train_report.json with greedy, greedy_long, perplexity and
# recall, loss.csv, loss_curve.png, tokenizer/, every variant's log and report).
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../.." || exit 2
export MINUTES=${MINUTES:-7.0} RESERVE=${RESERVE:-130} EPOCHS=${EPOCHS:-16}
short="--short-copy-rows 256 --short-copy-lengths 128,256,512,2048 --recall-fraction 0.375 --recall-kinds list=1,passage=1"
export VARIANTS=${VARIANTS:-"--lr 1e-3 --warmup 30 $short|--lr 4e-4 --warmup 30 --batch-size 8 $short|--init-tokenizer-only --lr 2e-3 --warmup 100 $short"}
# CALL_NAME names the scratch folders (train_gap_call.sh sets its own defaults, then runs this).
final=${OUT:-/tmp/${CALL_NAME:-train_continue}_out}
work=/tmp/${CALL_NAME:-train_continue}
rm -rf "$work" && mkdir -p "$work" "$final"
OUT=$work "$here/train_call.sh" run
rc=$?
mkdir -p /tmp/npm-empty "$work/tokenizer" "$work/variants"
if [ -f "$work/model/tokenizer.json" ]; then
  timeout 60 python3 tools/make_tokenizer_fixtures.py --npm-dir /tmp/npm-empty \
    --corpus tests/fixtures/tokenizer/corpus.jsonl --out "$work/tokenizer" --no-timing \
    --model "pagoda-tiny=$work/model" 2>&1 | tail -3
  cmp "$work/model/tokenizer.json" "$here/init/tokenizer.json" && echo "tokenizer.json: unchanged"
  for f in "$work"/tokenizer/*.json; do
    cmp -s "$f" "tests/fixtures/tokenizer/$(basename "$f")" && echo "fixture $(basename "$f"): unchanged" \
      || echo "fixture $(basename "$f"): DIFFERS from tests/fixtures/tokenizer"
  done
fi
for i in 0 1 2 3; do
  [ -f "/tmp/variant$i.log" ] && cp "/tmp/variant$i.log" "$work/variants/"
  [ -f "/tmp/variant$i/train_report.json" ] && cp "/tmp/variant$i/train_report.json" \
    "$work/variants/variant${i}_report.json"
done
python3 - "$work/train_report.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
g = r.get("greedy_long", {})
print("greedy_long:", g.get("depth"), g.get("words"), "->", repr(g.get("output_text")))
for p in r.get("greedy", {}).get("prompts", []):
    print("greedy", p["name"], repr(p["output_text"][:160]), "generate_agrees", p.get("generate_agrees"))
print("init_from:", r.get("init_from", {}).get("sha256", {}).get("model.safetensors"))
for v in r.get("variants", {}).get("variants", []):
    run = v.get("chosen_run") or {}
    g = run.get("gap_rows") or {}
    print("variant", v.get("variant"), "gap advances", [(a["step"], a["from_gap"]) for a in g.get("advances", [])],
          "final gap", g.get("final_gap"), "steps", run.get("steps"), "kept step", run.get("best_step"),
          "recall", v.get("recall_eval_words"), v.get("recall_heldout_words"), "ppl ratio", v.get("ppl_ratio"))
PY
[ -f "$work/model/model.safetensors" ] && mv "$work/model/model.safetensors" "$final/"
# A call brings back files of at most 16 MiB: a larger model (4 KV heads: 16.02 MiB) comes back in
# parts, joined here with `cat model.safetensors.part-* > model.safetensors` (sha256 in the log).
if [ -f "$final/model.safetensors" ] && [ "$(stat -c %s "$final/model.safetensors")" -gt 16000000 ]; then
  echo "model.safetensors $(sha256sum < "$final/model.safetensors" | cut -c1-64): split into 15 MB parts"
  split -b 15000000 "$final/model.safetensors" "$final/model.safetensors.part-" && rm "$final/model.safetensors"
fi
tar cJf "$final/results.tar.xz" -C "$work" --exclude='*.tmp' .
ls -la "$final"
exit $rc
