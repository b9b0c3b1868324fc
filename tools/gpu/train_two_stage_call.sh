#!/usr/bin/env bash
# The bundled model's best recall recipe (issue #21, docs/MODEL.md "Seventeenth and eighteenth
# attempts": greedy recall 0.502 / 0.619, ppl ratio 1.078, one run) in ONE device call, two stages
# back to back, each one variant with the GPU to itself:
#   A. from scratch with the stage-1 tokenizer (--init-tokenizer-only), 4 KV heads: text rows, 64 short
#      tiled rows and 64 gap rows a step, half the gap pairs drawn below the curriculum's band
#      (--gap-below-share 0.5), time-bound (MINUTES_A; ~1,550 steps alone on an H200): forms the copy;
#   B. continue A's model at lr 1e-3, 8 text rows a step, 32 short rows, 256 gap rows weighted 2, 90%
#      of them word lists, with a fifth of the copies' inner tokens read as wrong tokens
#      (--gap-corrupt-share 0.2: recovery after a wrong token, what lifts greedy recall).
# Packed here with
#   DATA=/work/main/.cache/train-data DEST=/work/main/.device/train2s tools/gpu/train_call.sh bundle
#   cp tools/gpu/train_two_stage_call.sh /work/main/.device/train2s/run.sh
# then (carry .device/train2s, timeout_s 600, ~450 s): bash .device/train2s/run.sh
# Stage B's model, report and logs come back as $OUT/model.safetensors (in 15 MB parts:
# `cat model.safetensors.part-* > model.safetensors`) and $OUT/results.tar.xz (stage A's under
# $OUT/stage_a/). MINUTES_A / MINUTES_B bound each stage's train.py (default 4.6 / 4.3), RESERVE the
# seconds each keeps for export and evaluation (60). VARIANTS_A / VARIANTS_B replace a stage's recipe
# ('|'-separated flag sets trained side by side, the best kept as in train_call.sh; side by side each
# gets a fraction of the steps); EXTRA_A / EXTRA_B append flags to every variant of a stage (e.g.
# EXTRA_A="--gap-corrupt-share 0.2 --gap-corrupt-from words"); EPOCHS_A / EPOCHS_B the epoch caps
# (40 / 12).
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
final=${OUT:-/tmp/train_two_stage_out}
common="--recall-fraction 0.25 --recall-kinds list=1,passage=1 --short-copy-lengths 128,256,512,2048 --gap-gaps 0,16,64,256,1024,1750 --gap-below-share 0.5"
OUT=$final/stage_a CALL_NAME=stage_a MINUTES=${MINUTES_A:-4.6} RESERVE=${RESERVE:-60} EPOCHS=${EPOCHS_A:-40} BASELINE=models/pagoda-tiny \
  VARIANTS=${VARIANTS_A:-"--init-tokenizer-only --kv-heads 4 --lr 2e-3 --warmup 100 $common --gap-list-share 0.5 --short-copy-rows 64 --gap-rows 64 --seed 2"} \
  EXTRA="--init-from $root/models/pagoda-tiny ${EXTRA_A:-}" \
  bash "$here/train_continue_call.sh" || exit $?
init=/tmp/stage_a_model
rm -rf "$init" && mkdir -p "$init" && cp /tmp/stage_a/model/*.json "$init/" && cat "$final"/stage_a/model.safetensors* > "$init/model.safetensors" || exit 1
echo "== stage A kept: $(sha256sum "$init/model.safetensors")"
OUT=$final CALL_NAME=stage_b MINUTES=${MINUTES_B:-4.3} RESERVE=${RESERVE:-60} EPOCHS=${EPOCHS_B:-12} BASELINE=models/pagoda-tiny \
  VARIANTS=${VARIANTS_B:-"--lr 1e-3 --warmup 30 --batch-size 8 $common --gap-list-share 0.9 --short-copy-rows 32 --gap-rows 256 --gap-weight 2 --gap-corrupt-share 0.2"} \
  EXTRA="--init-from $init ${EXTRA_B:-}" \
  bash "$here/train_continue_call.sh"
