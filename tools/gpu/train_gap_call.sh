#!/usr/bin/env bash
# Stage 2 of the bundled model, the sixth attempt (issue #21, docs/MODEL.md "Sixth attempt"): a gap
# curriculum (train.py --gap-rows, tools/train/gap_copy.py: segments copied across training text,
# the gap growing 0 -> 16 -> 64 -> 256 -> 1,024 -> 1,750 as training copy accuracy passes 0.5,
# random-token segments first, then word lists in the recall format), beside the text rows and a
# small share of short tiled copy rows, three variants side by side on the one GPU, in ONE call.
# Packed here with
#   INIT_FROM=<the fifth attempt's kept model> DATA=/work/main/.cache/train-data \
#     DEST=/work/main/.device/train7 tools/gpu/train_call.sh bundle
#   cp tools/gpu/train_gap_call.sh /work/main/.device/train7/run.sh
# (the bundle carries train_continue_call.sh, which this runs with the defaults below)
# then, from the checkout's root (carry .device/train7, timeout_s 330):
#   bash .device/train7/run.sh
# Defaults: MINUTES=4.6 (each train.py's whole budget), RESERVE=75 (export and evaluation, three
# variants at once), EPOCHS=16 (not reached: the wall time binds), BASELINE=models/pagoda-tiny (the
# perplexity goal is against the current bundled model, not the init), and VARIANTS (8 text rows a
# step, 2 of them recall rows): (0) continue init/ at lr 1e-3 with 128 short tiled rows of 128
# tokens and 64 gap rows a step; (1) continue init/ at lr 1.5e-3 with 64 short rows and 128 gap
# rows, the gap loss weighted 2, 75% list segments at the last gap; (2) as 0 from
# models/pagoda-tiny (stage 1). It runs
# train_call.sh run (keeps the variant meeting both goals with the lowest perplexity ratio, else
# the best greedy recall), makes the kept model's tokenizer fixture, and packs what comes back into
# $OUT/model.safetensors and $OUT/results.tar.xz (model/*.json, train_report.json, loss.csv,
# loss_curve.png, tokenizer/, every variant's log and report).
here=$(cd "$(dirname "$0")" && pwd)
export MINUTES=${MINUTES:-4.6} RESERVE=${RESERVE:-75} EPOCHS=${EPOCHS:-16}
export BASELINE=${BASELINE:-models/pagoda-tiny} CALL_NAME=${CALL_NAME:-train_gap}
mix="--warmup 30 --batch-size 8 --recall-fraction 0.25 --recall-kinds list=1,passage=1 --short-copy-lengths 128,256,512,2048 --gap-gaps 0,16,64,256,1024,1750"
export VARIANTS=${VARIANTS:-"--lr 1e-3 $mix --short-copy-rows 128 --gap-rows 64 --gap-list-share 0.5|--lr 1.5e-3 $mix --short-copy-rows 64 --gap-rows 128 --gap-weight 2 --gap-list-share 0.75|--init-from models/pagoda-tiny --lr 1e-3 $mix --short-copy-rows 128 --gap-rows 64 --gap-list-share 0.5"}
exec bash "$here/train_continue_call.sh"
