#!/usr/bin/env bash
# pagoda against llama.cpp on the CPU, same weights, same box, same minutes (issue 27).
#
#   bench/cpu/llamacpp_side_by_side.sh [build/pagoda]
#     env: THREADS="2" (a list: "1 2" for thread scaling)  RUNS=3  PREFILL=512  DECODE=128
#          FORMATS="f32 f16 bf16 int8 int4"  (int8 runs against llama.cpp's Q8_0, int4 against Q4_0)
#          CACHE=.cache/llamacpp (llama.cpp source + build, reused)  WEIGHTS=$CACHE/weights (reused)
#          NLC_VERSION=3.22.1 (the node-llama-cpp package whose llama.cpp is built)
#          PAGODA_CPU_BF16_GEMM unset: pagoda's default, which is what a user gets (f16/bf16 prefill on its
#          AVX512-BF16 GEMM where the CPU has it, else the f32-exact widen + sgemm path); 0 for the exact path
#          PAGODA_KV=f16: pagoda's --kv-cache-dtype, f16 by default to match llama.cpp's default KV cache
#          (f16 K and V); "auto" measures pagoda's own default (f32 on the CPU, twice the KV bytes)
#          LLAMA_DECODE_DEPTH=$PREFILL (llama.cpp's decode runs after this many context tokens, as pagoda's
#          does after its prompt; 0 measures it on an empty context in the same llama-bench call as the
#          prefill, which saves one prefill per run but favours llama.cpp by the attention over the prompt)
#
# 1. llama.cpp's source: node-llama-cpp ships it as a git bundle (package/llama/gitRelease.bundle, the
#    commit named in package/llama/llama.cpp.info.json); `npm pack` fetches the package (npm is the
#    only network used) and the bundle is cloned into $CACHE/src.
# 2. llama-bench and llama-quantize are built from it with cmake (Release, CPU only, -march=native as
#    llama.cpp's default GGML_NATIVE, OpenMP, no BLAS), ninja -j2, into $CACHE/build.
# 3. One random Llama (hidden 2048, 16 layers, 32 / 8 heads, intermediate 5632, vocab 32000, ~0.85B
#    parameters) is written by write_side_by_side_weights.py as safetensors (pagoda) and GGUF (llama.cpp's
#    own gguf-py) in f32, f16 and bf16, the same values in every file; Q8_0 and Q4_0 GGUFs are made from
#    the f32 one by llama-quantize (output.weight kept at Q8_0 in both, as pagoda's int4 keeps lm_head
#    at int8). pagoda quantizes the f32 safetensors at load (--quantization int8|int4).
# 4. Per run, per thread count, per format: pagoda then llama.cpp, back to back (A B A B ...), the pair's
#    files read into the page cache first. pagoda: `generate --prompt-ids <PREFILL ids> --max-tokens
#    DECODE --ignore-eos`, its own prefill and decode tok/s. llama.cpp: `llama-bench -p PREFILL -n 0` and
#    `llama-bench -p 0 -n DECODE -d PREFILL` (decode after a PREFILL-token context, as pagoda's), one
#    repetition each, no warm-up run (pagoda gets none either; the depth fill warms llama.cpp's decode as
#    the prefill warms pagoda's). KV cache at equal precision: pagoda gets --kv-cache-dtype f16
#    (PAGODA_KV), llama.cpp keeps its default f16; each engine's own attention. The 1-minute load
#    average is printed beside every figure.
#
# Prints one line per measurement, then the medians as the markdown table of docs/BENCHMARKS.md. Time with
# the build and weights cached: one run of the five formats at 2 threads is ~7 min on a quiet 2-core box
# (estimated; docs/BENCHMARKS.md), so RUNS=3 is ~21 min; split FORMATS over two calls to stay under 15 min
# each. The first call also builds llama.cpp (~40 min at -j2 on a loaded box) and writes ~14 GB of weights.
set -euo pipefail
PAGODA=$(realpath "${1:-build/pagoda}")
THREADS=${THREADS:-2}
RUNS=${RUNS:-3}
PREFILL=${PREFILL:-512}
DECODE=${DECODE:-128}
FORMATS=${FORMATS:-"f32 f16 bf16 int8 int4"}
CACHE=$(realpath -m "${CACHE:-.cache/llamacpp}")
WEIGHTS=$(realpath -m "${WEIGHTS:-$CACHE/weights}")
NLC_VERSION=${NLC_VERSION:-3.22.1}
LLAMA_DECODE_DEPTH=${LLAMA_DECODE_DEPTH:-$PREFILL}
PAGODA_KV=${PAGODA_KV:-f16}
PY=/usr/bin/python3  # Debian's, for python3-numpy / python3-yaml
# pagoda's f16/bf16 prefill path: its default unless PAGODA_CPU_BF16_GEMM is set (docs/CPU_QUANT.md).
here=$(cd "$(dirname "$0")" && pwd)
[[ -x $PAGODA ]] || { echo "no pagoda binary at $PAGODA" >&2; exit 1; }

# 1. source
if [[ ! -f $CACHE/src/CMakeLists.txt ]]; then
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack --silent "node-llama-cpp@$NLC_VERSION" >/dev/null)
  tar xzf "$tmp"/node-llama-cpp-*.tgz -C "$tmp" package/llama/llama.cpp.info.json package/llama/gitRelease.bundle || {
    echo "node-llama-cpp@$NLC_VERSION has no package/llama/gitRelease.bundle: no llama.cpp source to build" >&2
    exit 1
  }
  mkdir -p "$CACHE"
  cp "$tmp/package/llama/llama.cpp.info.json" "$CACHE/"
  git clone -q "$tmp/package/llama/gitRelease.bundle" "$CACHE/src"
  rm -rf "$tmp"
fi
# 2. build
bench_bin=$CACHE/build/bin/llama-bench
quant_bin=$CACHE/build/bin/llama-quantize
if [[ ! -x $bench_bin || ! -x $quant_bin ]]; then
  cmake -S "$CACHE/src" -B "$CACHE/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DGGML_NATIVE=ON -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF >/dev/null
  ninja -C "$CACHE/build" -j2 llama-bench llama-quantize >/dev/null
fi
if grep -qw avx512_bf16 /proc/cpuinfo; then bf16_cpu=yes; else bf16_cpu=no; fi
echo "pagoda f16/bf16 prefill: PAGODA_CPU_BF16_GEMM=${PAGODA_CPU_BF16_GEMM-unset (default)}, CPU avx512_bf16: $bf16_cpu"
echo "KV cache: pagoda --kv-cache-dtype $PAGODA_KV, llama.cpp its default (f16 K / f16 V)"
echo "llama.cpp: $(cat "$CACHE/llama.cpp.info.json" 2>/dev/null | tr -d '\n ' || true) commit $(git -C "$CACHE/src" rev-parse --short HEAD), node-llama-cpp $NLC_VERSION"
# 3. weights
if [[ ! -f $WEIGHTS/gguf/model-bf16.gguf ]]; then
  "$PY" "$here/write_side_by_side_weights.py" "$WEIGHTS" --gguf-py "$CACHE/src/gguf-py"
fi
for q in Q8_0 Q4_0; do
  out=$WEIGHTS/gguf/model-${q,,}.gguf
  if [[ ! -f $out ]]; then
    "$quant_bin" --output-tensor-type q8_0 "$WEIGHTS/gguf/model-f32.gguf" "$out.partial" "$q" 2 >/dev/null 2>&1
    mv "$out.partial" "$out"
  fi
done

# 4. runs
prompt=$(seq 100 $((99 + PREFILL)) | paste -sd, -)
load() { awk '{print $1}' /proc/loadavg; }
declare -A res
keys=()
llama_label() { case $1 in int8) echo Q8_0 ;; int4) echo Q4_0 ;; *) echo "$1" ;; esac; }
for run in $(seq "$RUNS"); do
  for t in $THREADS; do
    for fmt in $FORMATS; do
      case $fmt in
        int8 | int4) st=f32; pq=(--quantization "$fmt"); gg=$(llama_label "$fmt"); gg=${gg,,} ;;
        f32 | f16 | bf16) st=$fmt; pq=(); gg=$fmt ;;
        *) echo "unknown format $fmt (f32 f16 bf16 int8 int4)" >&2; exit 1 ;;
      esac
      gguf=$WEIGHTS/gguf/model-$gg.gguf
      cat "$WEIGHTS/$st/model.safetensors" "$gguf" >/dev/null  # page cache
      [[ $run == 1 ]] && keys+=("$fmt $t")
      # A: pagoda
      l=$(load)
      line=$(PAGODA_THREADS=$t "$PAGODA" generate --model "$WEIGHTS/$st" "${pq[@]}" --kv-cache-dtype "$PAGODA_KV" \
               --prompt-ids "$prompt" \
               --max-tokens "$DECODE" --ignore-eos 2>&1 >/dev/null | grep -o 'prefill [0-9]* tokens in .*')
      p=$(sed -E 's/.*prefill [0-9]+ tokens in [0-9.]+ s \(([0-9.]+) tok\/s\).*/\1/' <<<"$line")
      d=$(sed -nE 's/.*decode [0-9]+ tokens in [0-9.]+ s \(([0-9.]+) tok\/s\).*/\1/p' <<<"$line")
      echo "run $run threads $t pagoda $fmt: prefill $p tok/s, decode $d tok/s (load $l -> $(load))"
      res["$fmt $t pagoda prefill"]+="$p "
      res["$fmt $t pagoda decode"]+="$d "
      res["$fmt $t pagoda load"]+="$l "
      # B: llama.cpp
      l=$(load)
      if [[ $LLAMA_DECODE_DEPTH == 0 ]]; then
        both=$("$bench_bin" -m "$gguf" -t "$t" -p "$PREFILL" -n "$DECODE" -r 1 --no-warmup -o jsonl 2>/dev/null |
               sed -nE 's/.*"avg_ts": *([0-9.e+-]+).*/\1/p')
        lp=$(sed -n 1p <<<"$both")
        ld=$(sed -n 2p <<<"$both")
      else
        lp=$("$bench_bin" -m "$gguf" -t "$t" -p "$PREFILL" -n 0 -r 1 --no-warmup -o jsonl 2>/dev/null |
             sed -nE 's/.*"avg_ts": *([0-9.e+-]+).*/\1/p')
        ld=$("$bench_bin" -m "$gguf" -t "$t" -p 0 -n "$DECODE" -d "$LLAMA_DECODE_DEPTH" -r 1 --no-warmup -o jsonl \
               2>/dev/null | sed -nE 's/.*"avg_ts": *([0-9.e+-]+).*/\1/p')
      fi
      lp=$(printf '%.1f' "$lp")
      ld=$(printf '%.1f' "$ld")
      echo "run $run threads $t llama.cpp $(llama_label "$fmt"): prefill $lp tok/s, decode $ld tok/s (load $l -> $(load))"
      res["$fmt $t llama prefill"]+="$lp "
      res["$fmt $t llama decode"]+="$ld "
      res["$fmt $t llama load"]+="$l "
    done
  done
done
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
echo
echo "| weights (pagoda / llama.cpp) | threads | phase | pagoda tok/s | llama.cpp tok/s | ratio | pagoda runs | llama.cpp runs | load avg (pagoda / llama.cpp) |"
echo "|---|---|---|---|---|---|---|---|---|"
for k in "${keys[@]}"; do
  fmt=${k% *}
  t=${k#* }
  for phase in prefill decode; do
    a=$(median <<<"${res["$k pagoda $phase"]}")
    b=$(median <<<"${res["$k llama $phase"]}")
    ratio=$(awk -v a="$a" -v b="$b" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }')
    n=$PREFILL
    [[ $phase == decode ]] && n=$DECODE
    echo "| $fmt / $(llama_label "$fmt") | $t | $phase $n | $a | $b | $ratio | ${res["$k pagoda $phase"]% } | ${res["$k llama $phase"]% } | ${res["$k pagoda load"]% } / ${res["$k llama load"]% } |"
  done
done
