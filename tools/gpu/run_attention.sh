#!/usr/bin/env bash
# Everything the attention kernels need from one GPU-machine call, run from the
# repository root there (binaries compiled here, bundled with
# scripts/device-bundle.sh into BUNDLE, carried with the call):
#   tools/gpu/run_attention.sh [BUNDLE]      (default .device/attn)
# Writes under $OUT: gpu_tests.log (plan + kernel tests), attention_bench.log and
# .json, torch_baselines.log and .json (PyTorch SDPA side by side, same call),
# sass_summary.txt (instruction counts per kernel: HGMMA? HMMA, LDGSTS, spills),
# gpu_state.txt (nvidia-smi before and after). Prints a short summary last.
set -uo pipefail
bundle=${1:-.device/attn}
out=${OUT:-/tmp/attn-out}
mkdir -p "$out"

{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw,memory.used --format=csv; } >"$out/gpu_state.txt" 2>&1

"$bundle/run.sh" attention_plan_tests >"$out/gpu_tests.log" 2>&1
plan_rc=$?
"$bundle/run.sh" paged_attention_gpu_tests >>"$out/gpu_tests.log" 2>&1
gpu_rc=$?
grep -E "rel L2|FAILED|PASSED|Failure|error" "$out/gpu_tests.log" | head -60

"$bundle/run.sh" attention_bench --json "$out/attention_bench.json" >"$out/attention_bench.log" 2>&1
bench_rc=$?

PYTHONUNBUFFERED=1 python3 bench/kernels/torch_baselines.py >"$out/torch_baselines.log" 2>&1
torch_rc=$?

# SASS per kernel: are the tensor-core, async-copy and 16-byte shared loads there; any local memory?
if command -v cuobjdump >/dev/null; then
  cuobjdump --dump-sass "$bundle/bin/attention_bench" | awk '
    /Function :/ { name = $3 }
    name != "" {
      for (op in ops) ;
      if ($0 ~ /HGMMA/) c[name, "HGMMA"]++
      if ($0 ~ /HMMA/) c[name, "HMMA"]++
      if ($0 ~ /LDGSTS/) c[name, "LDGSTS"]++
      if ($0 ~ /LDSM/) c[name, "LDSM"]++
      if ($0 ~ /LDS\.128/) c[name, "LDS.128"]++
      if ($0 ~ /LDG\.E\.128/) c[name, "LDG.128"]++
      if ($0 ~ /SHFL/) c[name, "SHFL"]++
      if ($0 ~ /MUFU\.EX2/) c[name, "MUFU.EX2"]++
      if ($0 ~ /(LDL|STL)/) c[name, "LDL/STL"]++
      names[name] = 1
    }
    END {
      split("HGMMA HMMA LDGSTS LDSM LDS.128 LDG.128 SHFL MUFU.EX2 LDL/STL", k, " ")
      for (n in names) { line = n; for (i = 1; i <= 9; i++) line = line " " k[i] "=" (c[n, k[i]] + 0); print line }
    }' | grep -E "attention|merge" >"$out/sass_summary.txt"
else
  echo "cuobjdump not found" >"$out/sass_summary.txt"
fi
nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv >>"$out/gpu_state.txt" 2>&1

echo "== sass"; sed 's/_ZN6pagoda7kernels4cuda[^ ]*_cu_[0-9a-f]*//' "$out/sass_summary.txt" | cut -c1-220
echo "== torch"; grep -E "copy|decode|prefill|gemm" "$out/torch_baselines.log" | grep -v expanded
echo "== pagoda"; sed -n '/^figure/,$p' "$out/attention_bench.log"; grep -E "rel L2 vs naive|failed|error" "$out/attention_bench.log" | cut -c1-160
echo "rc: plan_tests=$plan_rc gpu_tests=$gpu_rc bench=$bench_rc torch=$torch_rc"
