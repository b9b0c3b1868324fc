#!/usr/bin/env bash
# One device call for session 31 (issue 23, and issue 20's goal where an H200 comes), PARTS in order
# (default "gemv itl"):
#   gemv   the tensor-core fp8 GEMV (fp8_mma_gemv.h): cuda_ops_tests' GEMV cases, cuda_model_tests
#          (CudaModel.*, *Fp8*), GemvSpeed.Fp8MmaGemv (against the weight-only GEMV and cuBLASLt), the bundled
#          model's fp8 perplexity with and without it (in 271d00a's bundle this part measured the reverted
#          integer widening of the weight-only GEMV instead: GemvSpeed.Fp8Unpack, SASS, ncu);
#   small  the engine at batch 4 and 8 (fp8 + fp8 KV, 128 in / 256 out): the tensor-core GEMV (default) vs
#          PAGODA_FP8_MMA_GEMV_ROWS=0 (cuBLASLt), two rounds;
#   suites cuda_model_tests and cuda_ops_tests whole (speed cases excluded);
#   httpsmall  `pagoda serve` + `pagoda bench serve` at concurrency 4 and 8 (fp8 + fp8 KV, 128 in / 256 out):
#          the tensor-core GEMV (default) vs PAGODA_FP8_MMA_GEMV_ROWS=0;
#   itl    batch-1 decode at 128 tokens, fp8 + fp8 KV and bf16 + bf16 KV (the bf16 rows are the control),
#          ITL_BASE_ENV (default PAGODA_FP8_MMA_GEMV_ROWS=0) vs the default, two rounds (decode_path_call.sh);
#   1k     the 1,000 x 1,000 (fp8 + fp8 KV) with every default, engine, once (decode_path_call.sh);
#   http   the same workload through `pagoda serve` + `pagoda bench serve` (HTTP_KINDS, default fp8; bf16
#          = bf16 weights + bf16 KV), then batch-1 ITL over HTTP for each kind;
#   goal   issue 20's MLA decode goal shapes (session30_call.sh's goal part; mla_decode_bench).
# On an H200 PARTS defaults to "goal gemv itl 1k http" with HTTP_KINDS="fp8 bf16" and the engine's bf16
# 1,000 x 1,000 as well (the issues' goals are H200 figures).
# Bundle: tools/gpu/session31_call.sh bundle (-> .device/s31); run (carry .device/s31):
#   [PARTS=...] [TOTAL=560] bash .device/s31/session31_call.sh
set -u
if [ "${1:-}" = bundle ]; then
  here=$(cd "$(dirname "$0")" && pwd); root=$(cd "$here/../.." && pwd); cd "$root" || exit 1
  . tools/gpu/call_bundle.sh
  b=$root/build
  DEST=$root/.device/s31 call_bundle_pack tools/gpu/session31_call.sh "$b/bench/gpu/pagoda_gpu_engine_bench" \
    "$b/bench/kernels/mla_decode_bench" "$b/tests/gpu_backend/cuda_model_tests" "$b/tests/gpu_backend/cuda_ops_tests" \
    "$b/pagoda" || exit 1
  cp tools/gpu/decode_path_call.sh tools/gpu/session30_call.sh .device/s31/
  mkdir -p .device/s31/model && cp tools/gpu_backend/llama3_8b_config.json .device/s31/model/config.json
  cp .cache/npm/llama3/package/models/tokenizer.json .cache/npm/llama3/package/models/tokenizer_config.json \
    .device/s31/model/ && xz -T2 .device/s31/model/tokenizer.json && du -sh .device/s31; exit
fi
. "$(dirname "$0")/call_bundle.sh"
call_bundle_unpack
here=$(cd "$(dirname "$0")" && pwd)
t0=$SECONDS; total=${TOTAL:-560}
left() { echo $((total - (SECONDS - t0))); }
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "== binaries of $(cat "$(dirname "$B")/commit"); $(date -u +%FT%TZ); $gpu"
if [[ $gpu == *H200* ]]; then
  parts=" ${PARTS:-goal gemv itl 1k http} "; kinds=${HTTP_KINDS:-fp8 bf16}
else
  parts=" ${PARTS:-gemv small itl} "; kinds=${HTTP_KINDS:-fp8}
fi
[ -f "$here/model/tokenizer.json" ] || xz -dk "$here/model/tokenizer.json.xz"

if [[ $parts == *" goal "* ]]; then
  OUT=$out/goal PARTS="goal" TOTAL=150 bash "$here/session30_call.sh" 2>&1 | grep -vE "^== (binaries|end)" | tail -24
fi

if [[ $parts == *" gemv "* ]]; then  # (the integer widening's measurement was on 271d00a's binaries)
  call_gtest cuda_ops_tests_gemv 150 cuda_ops_tests --gtest_filter='*Gemv*:*Fp8MmaGemv*:-GemvSpeed.*'
  call_gtest cuda_model_tests 280 cuda_model_tests --gtest_filter='CudaModel.*:*Fp8*'
  timeout 150 "$B" cuda_ops_tests --gtest_filter='GemvSpeed.Fp8MmaGemv' > "$out/mma_speed.log" 2>&1
  echo "GemvSpeed.Fp8MmaGemv rc=$?"; grep "gemv-mma" "$out/mma_speed.log" | sed 's/  */ /g'
  m=models/pagoda-tiny
  for rows in 8 0; do  # the bundled model's perplexity, fp8: its eval steps on the tensor-core GEMV or not
    PAGODA_FP8_MMA_GEMV_ROWS=$rows timeout 120 "$B" pagoda eval perplexity --device cuda --model $m \
      --text-file $m/heldout.txt --quantization fp8 --json > "$out/ppl_$rows.json" 2> "$out/ppl_$rows.err"
    echo "perplexity fp8, tensor-core GEMV rows $rows rc=$?: $(grep -oE '"(perplexity|tokens)":[0-9.]+' "$out/ppl_$rows.json" | tr '\n' ' ')"
  done
fi
if [[ $parts == *" suites "* ]]; then  # the whole model and ops suites (speed cases excluded)
  call_gtest cuda_model_tests_all 330 cuda_model_tests
  call_gtest cuda_ops_tests_all 200 cuda_ops_tests --gtest_filter='-GemvSpeed.*:*Speed*'
fi
if [[ $parts == *" small "* ]]; then  # batch 3-8: the tensor-core GEMV (default) vs cuBLASLt (rows 0)
  for round in 1 2; do
    for n in 4 8; do
      for rows in 0 default; do
        env_rows=(); [ "$rows" = 0 ] && env_rows=(PAGODA_FP8_MMA_GEMV_ROWS=0)
        env "${env_rows[@]}" timeout 60 "$B" pagoda_gpu_engine_bench --config tools/gpu_backend/llama3_8b_config.json \
          --sampling greedy --workload random --num-requests "$n" --max-num-seqs "$n" --input-len 128 --output-len 256 \
          --quantization fp8 --kv-cache-dtype fp8 > "$out/small.log" 2>&1
        echo "r$round batch $n mma rows $rows rc=$?: $(grep -oE '[0-9]+ output tok/s' "$out/small.log" | head -1) | $(grep -oE 'decode-only steps: [0-9]+, [0-9.]+ ms each' "$out/small.log" | head -1)"
      done
    done
  done
fi
if [[ $parts == *" itl "* ]]; then
  OUT=$out/itl PARTS="itl" ITL_CONTEXTS=128 BASE_ENV="${ITL_BASE_ENV:-PAGODA_FP8_MMA_GEMV_ROWS=0}" BUDGET=$(( $(left) > 150 ? 150 : $(left) )) \
    bash "$here/decode_path_call.sh" run 2>&1 | grep -E "round|base|error|skipped|done"
fi
if [[ $parts == *" 1k "* ]]; then
  OUT=$out/k1 PARTS="1k" BUDGET=130 bash "$here/decode_path_call.sh" run 2>&1 | grep -E "^1k|error|skipped"
  if [[ $gpu == *H200* ]] && [ "$(left)" -gt 155 ]; then
    timeout 150 "$B" pagoda_gpu_engine_bench --config tools/gpu_backend/llama3_8b_config.json --sampling greedy \
      --workload random --num-requests 1000 --max-num-seqs 512 --max-tokens-per-step 16384 --input-len 1000 \
      --output-len 1000 --kv-cache-dtype bf16 > "$out/k1_bf16.log" 2>&1
    echo "1k bf16 + bf16 KV rc=$?: $(grep -oE '[0-9]+ output tok/s' "$out/k1_bf16.log" | head -1)"
  fi
fi
if [[ $parts == *" httpsmall "* ]]; then  # concurrency 4 / 8 through HTTP: tensor-core GEMV (default) vs rows 0
  for c in 4 8; do
    for rows in 0 default; do
      if [ "$rows" = 0 ]; then export PAGODA_FP8_MMA_GEMV_ROWS=0; else unset PAGODA_FP8_MMA_GEMV_ROWS; fi
      call_serve "c${c}_$rows" "$here/model" --quantization fp8 --kv-cache-dtype fp8 --max-num-seqs 64
      unset PAGODA_FP8_MMA_GEMV_ROWS
      timeout 60 "$B" pagoda bench serve --url "http://127.0.0.1:$port" --concurrency "$c" --requests $((3 * c)) \
        --prompt-tokens 128 --output-tokens 256 --warmup 1 --label "c${c}_mma_rows_$rows" --csv "$out/http_small.csv" \
        --no-progress > /dev/null 2>&1
      kill "$pid"; wait "$pid" 2>/dev/null
    done
  done
  cut -d, -f1,2,4,9,16,17 "$out/http_small.csv"
fi
if [[ $parts == *" http "* ]]; then
  for kind in $kinds; do
    [ "$(left)" -lt 150 ] && { echo "== http $kind skipped (time)"; continue; }
    args=(--kv-cache-dtype "$kind"); [ "$kind" = fp8 ] && args+=(--quantization fp8)
    call_serve "1k_$kind" "$here/model" "${args[@]}" --max-num-seqs 512 --max-tokens-per-step 16384 \
      --max-model-len 2048
    timeout 150 "$B" pagoda bench serve --url "http://127.0.0.1:$port" --concurrency 1000 --requests 1000 \
      --prompt-tokens 1000 --output-tokens 1000 --token-high 120000 --warmup 1 --label "1k_$kind" \
      --csv "$out/http.csv" --no-progress 2>&1 | tail -12
    kill "$pid"; wait "$pid" 2>/dev/null
    grep -iE "error|preempt" "$out/serve_1k_$kind.log" | tail -3
    [ "$(left)" -lt 60 ] && continue
    call_serve "itl_$kind" "$here/model" "${args[@]}" --max-num-seqs 64
    timeout 60 "$B" pagoda bench serve --url "http://127.0.0.1:$port" --concurrency 1 --requests 6 \
      --prompt-tokens 128 --output-tokens 256 --warmup 1 --label "itl_$kind" --csv "$out/http.csv" \
      --no-progress 2>&1 | grep -iE "ITL|tok/s" | head -3
    kill "$pid"; wait "$pid" 2>/dev/null
  done
  [ -f "$out/http.csv" ] && cat "$out/http.csv"
fi
cd "$out" && tar czf logs.tar.gz ./*.log 2>/dev/null && rm -f ./*.log
echo "== end at $((SECONDS - t0)) s"
