#!/usr/bin/env bash
# The bundled model's best recall recipe since session 24 (issue #21, docs/MODEL.md "Twenty-eighth
# attempt": pagoda eval recall 0.733, ppl ratio 1.12-1.14 at 5.8 minutes) in ONE device call, one
# stage from scratch with the stage-1 tokenizer:
#   - 4 heads of 64 dims, no GQA, RoPE base 10^6: the shape and base at which a query can tell its
#     matching key from a random one at every distance up to 2,048 (tools/train/rope_base_bound.py);
#     the old head_dim 32 / base 10,000 fails from 474 tokens on;
#   - 4 text rows a step (--batch-size 4) against 64 short tiled copy rows and 64 gap rows, so the copy
#     gets thousands of steps while the 2M-token text is read ~20 times, not 60 (16 rows a step
#     overfit the text: held-out perplexity 35 -> 246 over 60 epochs).
# Packed here with
#   INIT_FROM=models/pagoda-tiny DATA=/work/main/.cache/train-data DEST=/work/main/.device/recall \
#     tools/gpu/train_call.sh bundle
#   cp tools/gpu/train_recall_call.sh /work/main/.device/recall/run.sh
# then (carry .device/recall, timeout_s 600, ~9.5 minutes): bash .device/recall/run.sh
# MINUTES (9.3) bounds train.py, RESERVE (60) the seconds kept for export and evaluation, EPOCHS (60)
# the text-epoch cap, SEED (2) the training seed, TEXT_ROWS (4) the text rows a step; EXTRA appends
# flags. What comes back is train_continue_call.sh's: $OUT/model.safetensors (in 15 MB parts) and
# $OUT/results.tar.xz.
here=$(cd "$(dirname "$0")" && pwd)
common="--recall-fraction 0.25 --recall-kinds list=1,passage=1 --short-copy-lengths 128,256,512,2048 --gap-gaps 0,16,64,256,1024,1750 --gap-below-share 0.5"
CALL_NAME=${CALL_NAME:-recall} MINUTES=${MINUTES:-9.3} RESERVE=${RESERVE:-60} EPOCHS=${EPOCHS:-60} \
  BASELINE=models/pagoda-tiny \
  VARIANTS="--init-tokenizer-only --heads 4 --kv-heads 4 --rope-theta 1000000 --batch-size ${TEXT_ROWS:-4} --lr 2e-3 --warmup 100 $common --gap-list-share 0.5 --short-copy-rows 64 --gap-rows 64 --seed ${SEED:-2} ${EXTRA:-}" \
  exec bash "$here/train_continue_call.sh"
