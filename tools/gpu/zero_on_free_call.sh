#!/usr/bin/env bash
# Zero on free on the H200 (issue #22), in one device call:
#   1. the cost goal (< 1%) on the Llama-3-8B shape: pagoda_gpu_engine_bench --workload zero-on-free,
#      random bf16 weights, N requests each its own tenant, on a KV pool cut to ZERO_KV_BLOCKS so that
#      blocks pass to another tenant every step; zeroing off vs on, alternating, best of ZERO_REPS each
#      ("[zero-cost] engine, ..." line; the figures in $OUT/zero_on_free_8b.json);
#   2. (unless PARTS=bench) cuda_zero_on_free_tests, i.e.
#      - the listed blocks (and only they) are cleared in every layer and sub-pool, bf16 and int4;
#      - the clears are ordered after the model stream's earlier work and before its later work;
#      - through the engine, a block another tenant left holds zeros where the new one has not
#        written (with the control run without zeroing);
#      - the clear on a Llama-3-8B-shaped pool, and the engine's throughput on models/pagoda-tiny
#        with every request its own tenant, zeroing on vs off ("[zero-cost]" lines).
#
# Here:   tools/gpu/zero_on_free_call.sh bundle [BUILD_DIR]   (default build-cuda, configured with
#         -DPAGODA_BUILD_BENCH=ON) packs DEST (default .device/security2; a helper's calls send the
#         session's checkout, so DEST=<that checkout>/.device/security2)
# There:  run(command="bash .device/security2/zero_on_free_call.sh run", carry=[".device/security2"],
#             timeout_s=220)
# Results: $OUT/zero_on_free.txt (everything printed), $OUT/zero_on_free_8b.json.
set -uo pipefail
case "${1:-}" in
bundle)
  set -e
  here=$(cd "$(dirname "$0")/../.." && pwd)
  build=${2:-$here/build-cuda}
  dest=${DEST:-$here/.device/security2}
  ninja -C "$build" -j2 cuda_zero_on_free_tests pagoda_gpu_engine_bench
  rm -rf "$dest" && mkdir -p "$dest"
  stage=$(mktemp -d)
  "$here/scripts/device-bundle.sh" "$stage/bundle" "$build/tests/gpu_backend/cuda_zero_on_free_tests" \
    "$build/bench/gpu/pagoda_gpu_engine_bench"
  strip "$stage"/bundle/bin/* || true
  cp "$here/tools/gpu_backend/llama3_8b_config.json" "$stage/bundle/"
  git -C "$here" rev-parse --short HEAD > "$stage/bundle/commit"
  tar cJf "$dest/bundle.tar.xz" -C "$stage" bundle
  cp "$0" "$dest/zero_on_free_call.sh"
  rm -rf "$stage"
  ls -la "$dest"
  ;;
run)
  dir=$(cd "$(dirname "$0")" && pwd)
  tar xJf "$dir/bundle.tar.xz" -C /tmp
  export PAGODA_SOURCE_DIR=$PWD
  out=${OUT:-/tmp/zero_on_free}
  mkdir -p "$out"
  # 512 requests of 256 + 64 tokens, 128 at a time: 2,560 blocks in use at most, 3,072 in the pool,
  # so every admission takes blocks that another tenant's finished request left.
  requests=${ZERO_REQUESTS:-512}
  {
    echo "commit $(cat /tmp/bundle/commit), $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
    date -u
    timeout 150 /tmp/bundle/run.sh pagoda_gpu_engine_bench --config /tmp/bundle/llama3_8b_config.json \
      --workload zero-on-free --num-requests "$requests" --input-len 256 --output-len 64 --max-num-seqs 128 \
      --max-tokens-per-step 8192 --zero-kv-blocks "${ZERO_KV_BLOCKS:-3072}" --zero-reps "${ZERO_REPS:-3}" \
      --json "$out/zero_on_free_8b.json"
    echo "bench exit $?"
    if [ "${PARTS:-all}" != bench ]; then
      timeout 60 /tmp/bundle/run.sh cuda_zero_on_free_tests
      echo "tests exit $?"
    fi
    date -u
  } 2>&1 | tee "$out/zero_on_free.txt"
  grep -h "zero-cost" "$out/zero_on_free.txt"
  ;;
*)
  echo "usage: $0 bundle [BUILD_DIR] | run" >&2
  exit 2
  ;;
esac
