#!/usr/bin/env bash
# CPU prefill and decode speed of `pagoda generate` on the issue-27 shape: a
# random ~0.85B-parameter Llama (hidden 2048, 16 layers, 32 heads / 8 KV heads,
# intermediate 5632, vocab 32000), --load-format random (f32 weights), as
# loaded and with --quantization int8 / int4. Prefill of a 512-token prompt in
# one forward, then 128 greedy decode steps; medians of RUNS runs per format.
#
#   bench/cpu/llama_shape_bench.sh [build/pagoda]     (env: THREADS=2 RUNS=3 FORMATS="f32 int8 int4")
#
# Prints one line per run and a median table (markdown) at the end. Formats are
# run round-robin (f32, int8, int4, f32, ...) so a change in the machine's load
# hits all of them alike.
set -euo pipefail
PAGODA=${1:-build/pagoda}
THREADS=${THREADS:-2}
RUNS=${RUNS:-3}
FORMATS=${FORMATS:-"f32 int8 int4"}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat > "$work/config.json" <<'JSON'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048, "num_hidden_layers": 16,
 "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 5632, "vocab_size": 32000,
 "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": false,
 "torch_dtype": "float32", "bos_token_id": 1, "eos_token_id": 2}
JSON
prompt=$(seq 100 611 | paste -sd, -)  # 512 token ids
declare -A prefill decode
for run in $(seq "$RUNS"); do
  for fmt in $FORMATS; do
    quant=()
    [[ $fmt != f32 ]] && quant=(--quantization "$fmt")
    line=$(PAGODA_THREADS=$THREADS "$PAGODA" generate --load-format random --config "$work/config.json" \
             --prompt-ids "$prompt" --max-tokens 128 --ignore-eos "${quant[@]}" 2>&1 >/dev/null |
           grep -o 'prefill [0-9]* tokens in .*')
    p=$(sed -E 's/.*prefill [0-9]+ tokens in [0-9.]+ s \(([0-9.]+) tok\/s\).*/\1/' <<<"$line")
    d=$(sed -E 's/.*decode [0-9]+ tokens in [0-9.]+ s \(([0-9.]+) tok\/s\).*/\1/' <<<"$line")
    echo "run $run $fmt: prefill $p tok/s, decode $d tok/s"
    prefill[$fmt]+="$p "
    decode[$fmt]+="$d "
  done
done
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
echo
echo "| weights | prefill 512 tok/s | decode 128 tok/s |"
echo "|---|---|---|"
for fmt in $FORMATS; do
  echo "| $fmt | $(median <<<"${prefill[$fmt]}") | $(median <<<"${decode[$fmt]}") |"
done
