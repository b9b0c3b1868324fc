#!/usr/bin/env bash
# CPU prefill and decode speed of `pagoda generate` on the issue-27 shape: a
# random ~0.85B-parameter Llama (hidden 2048, 16 layers, 32 heads / 8 KV heads,
# intermediate 5632, vocab 32000), --load-format random (f32 weights), as
# loaded and with --quantization int8 / int4, and bf16 / f16 checkpoints of the
# same shape (random, written once into CKPT_DIR by write_random_checkpoint.py,
# 1.7 GB each). Prefill of a 512-token prompt in one forward, then DECODE greedy
# decode steps (128; 1 measures prefill only); medians of RUNS runs per format.
#
#   bench/cpu/llama_shape_bench.sh [build/pagoda]
#     env: THREADS=2 RUNS=3 FORMATS="f32 int8 int4" DECODE=128 CKPT_DIR=/tmp/pagoda-llama-shape
#          BASELINE=other/pagoda (optional: each run also runs this binary right after, an A/B
#          back to back under the same load; its rows are labelled "base")
#
# Prints one line per run and a median table (markdown) at the end. Formats are
# run round-robin (f32, int8, int4, f32, ...) so a change in the machine's load
# hits all of them alike.
set -euo pipefail
PAGODA=${1:-build/pagoda}
THREADS=${THREADS:-2}
RUNS=${RUNS:-3}
FORMATS=${FORMATS:-"f32 int8 int4"}
DECODE=${DECODE:-128}
CKPT_DIR=${CKPT_DIR:-/tmp/pagoda-llama-shape}
BASELINE=${BASELINE:-}
here=$(dirname "$0")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat > "$work/config.json" <<'JSON'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048, "num_hidden_layers": 16,
 "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 5632, "vocab_size": 32000,
 "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": false,
 "torch_dtype": "float32", "bos_token_id": 1, "eos_token_id": 2}
JSON
prompt=$(seq 100 611 | paste -sd, -)  # 512 token ids
for fmt in $FORMATS; do
  if [[ $fmt == bf16 || $fmt == f16 ]] && [[ ! -f $CKPT_DIR/$fmt/model.safetensors ]]; then
    python3 "$here/write_random_checkpoint.py" "$CKPT_DIR/$fmt" --dtype "$fmt"
  fi
done
declare -A prefill decode
labels=()
for fmt in $FORMATS; do
  labels+=("$fmt")
  [[ -n $BASELINE ]] && labels+=("$fmt base")
done
for run in $(seq "$RUNS"); do
  for fmt in $FORMATS; do
    model=(--load-format random --config "$work/config.json")
    [[ $fmt == int8 || $fmt == int4 ]] && model+=(--quantization "$fmt")
    [[ $fmt == bf16 || $fmt == f16 ]] && model=(--model "$CKPT_DIR/$fmt")
    binaries=("$PAGODA")
    [[ -n $BASELINE ]] && binaries+=("$BASELINE")
    for bin in "${binaries[@]}"; do
      label=$fmt
      [[ $bin != "$PAGODA" ]] && label="$fmt base"
      line=$(PAGODA_THREADS=$THREADS "$bin" generate "${model[@]}" \
               --prompt-ids "$prompt" --max-tokens "$DECODE" --ignore-eos 2>&1 >/dev/null |
             grep -o 'prefill [0-9]* tokens in .*')
      p=$(sed -E 's/.*prefill [0-9]+ tokens in [0-9.]+ s \(([0-9.]+) tok\/s\).*/\1/' <<<"$line")
      d=$(sed -nE 's/.*decode [0-9]+ tokens in [0-9.]+ s \(([0-9.]+) tok\/s\).*/\1/p' <<<"$line")
      echo "run $run $label: prefill $p tok/s, decode ${d:--} tok/s (load $(awk '{print $1}' /proc/loadavg))"
      prefill[$label]+="$p "
      decode[$label]+="${d:-0} "
    done
  done
done
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
echo
echo "| weights | prefill 512 tok/s | decode $DECODE tok/s |"
echo "|---|---|---|"
for label in "${labels[@]}"; do
  echo "| $label | $(median <<<"${prefill[$label]}") | $(median <<<"${decode[$label]}") |"
done
