#!/usr/bin/env python3
"""Per-kernel breakdown of one profiled decode step from ncu's raw CSV.

Input: `ncu --csv --page raw --print-kernel-base function --metrics
gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,launch__grid_size ...` of one graph replay
(PAGODA_CUDA_PROFILE_REPLAY with --profile-from-start off). Output: a markdown table, one line per kernel
name and grid size (a GEMV's grid names its projection): launches in the step, summed us, share of the summed kernel time, DRAM GB/s (read + write bytes
over the kernel's own duration). ncu times each kernel alone (serialized, caches flushed), so the sum
excludes the launch gaps of the real graph replay; compare it with the measured step time.
Then one line per kind (GEMM/GEMV, attention, KV write/dequantize, quantize, norms/rope/activation, rest):
summed us, share, DRAM GB/s, and with GEMM_GFLOP (the step's linear-layer FLOPs, e.g. 2 x rows x 6.98 G
for the Llama-3-8B shape plus lm_head) the GEMMs' achieved TFLOP/s.
Several profiler windows in one CSV (e.g. PAGODA_CUDA_PROFILE_EAGER_STEP and PAGODA_CUDA_PROFILE_REPLAY in
one run): WINDOW=K in the environment keeps the K-th step only (0-based; each step starts with its one
embedding gather, so a step is the kernels from one embedding_gather launch to the next).
Usage: [WINDOW=K] ncu_step_breakdown.py RAW.csv [STEP_MS [GEMM_GFLOP]]
"""
import os
import csv
import re
import sys

KINDS = [  # first match wins; names are ncu's function base names
    ("GEMM/GEMV", re.compile(r"gemm|gemv|xmma|nvjet|cutlass|cublas|sm90_", re.I)),
    ("attention", re.compile(r"attn|attention|flash|merge_splits|softmax|decode_|prefill", re.I)),
    ("KV write/dequantize", re.compile(r"kv_", re.I)),
    ("quantize (fp8 activations)", re.compile(r"quantize|fp8_apply", re.I)),
    ("norms/rope/activation/residual", re.compile(r"norm|rope|silu|residual|add_bias", re.I)),
]


def kind_of(name):
    for kind, pattern in KINDS:
        if pattern.search(name):
            return kind
    return "rest (embedding, argmax, sampling, copies)"


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def main():
    path = sys.argv[1]
    step_ms = float(sys.argv[2]) if len(sys.argv) > 2 and float(sys.argv[2]) > 0 else None
    gemm_gflop = float(sys.argv[3]) if len(sys.argv) > 3 else None
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]  # ncu's own messages are not quoted
    rows = list(csv.reader(lines))
    if len(rows) < 3:
        print(f"no kernels in {path}")
        return
    header = rows[0]
    units = rows[1]
    col = {name: i for i, name in enumerate(header)}
    name_col = col.get("Kernel Name")
    t_col = col.get("gpu__time_duration.sum")
    r_col = col.get("dram__bytes_read.sum")
    w_col = col.get("dram__bytes_write.sum")
    g_col = col.get("launch__grid_size")
    scale_t = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "second": 1e6}.get(units[t_col], 1e-3)
    byte_scale = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "KB": 1e3, "MB": 1e6, "GB": 1e9}

    body = [row for row in rows[2:] if len(row) > max(name_col, t_col)]
    window = os.environ.get("WINDOW")
    if window is not None:
        starts = [i for i, row in enumerate(body) if row[name_col].startswith("embedding_gather")]
        bounds = [0] + starts[1:] + [len(body)] if starts else [0, len(body)]
        k = int(window)
        print(f"windows (steps) in the CSV: {len(bounds) - 1}, kernels each: "
              + ", ".join(str(bounds[i + 1] - bounds[i]) for i in range(len(bounds) - 1)) + f"; this: {k}")
        if k >= len(bounds) - 1:
            print(f"no window {k} in {path}")
            return
        body = body[bounds[k]:bounds[k + 1]]
    groups = {}
    order = []
    for row in body:
        if len(row) <= max(name_col, t_col):
            continue
        name = row[name_col][:60]
        if g_col is not None and row[g_col]:
            name += f" [grid {row[g_col]}]"
        us = number(row[t_col])
        if us is None:
            continue
        us *= scale_t
        nbytes = 0.0
        for c in (r_col, w_col):
            if c is not None:
                v = number(row[c])
                if v is not None:
                    nbytes += v * byte_scale.get(units[c], 1)
        if name not in groups:
            groups[name] = [0, 0.0, 0.0]
            order.append(name)
        g = groups[name]
        g[0] += 1
        g[1] += us
        g[2] += nbytes
    total = sum(g[1] for g in groups.values())
    launches = sum(g[0] for g in groups.values())
    print(f"kernels in the step: {launches}; summed kernel time {total:.1f} us"
          + (f"; measured step {step_ms * 1000:.0f} us: gaps + overlap {step_ms * 1000 - total:.0f} us" if step_ms else ""))
    print("| kernel | launches | us per step | % of kernel time | us per launch | DRAM GB/s |")
    print("|---|---|---|---|---|---|")
    for name in sorted(order, key=lambda n: -groups[n][1]):
        n, us, nbytes = groups[name]
        gbs = nbytes / (us * 1e-6) / 1e9 if us > 0 else 0.0
        print(f"| {name} | {n} | {us:.1f} | {100 * us / total:.1f}% | {us / n:.2f} | {gbs:,.0f} |")
    kinds = {}
    for name in order:
        k = kinds.setdefault(kind_of(name), [0, 0.0, 0.0])
        for i in range(3):
            k[i] += groups[name][i]
    print()
    print("| kind | launches | us per step | % of kernel time | DRAM GB/s | note |")
    print("|---|---|---|---|---|---|")
    for kind in sorted(kinds, key=lambda k: -kinds[k][1]):
        n, us, nbytes = kinds[kind]
        gbs = nbytes / (us * 1e-6) / 1e9 if us > 0 else 0.0
        note = ""
        if kind == "GEMM/GEMV" and gemm_gflop and us > 0:
            note = f"{gemm_gflop:.0f} GFLOP: {gemm_gflop / (us * 1e-6) / 1e3:.0f} TFLOP/s"
        if kind == "attention":
            note = f"{nbytes / 1e9:.2f} GB moved: {100 * gbs / 4800:.0f}% of 4.8 TB/s"
        print(f"| {kind} | {n} | {us:.1f} | {100 * us / total:.1f}% | {gbs:,.0f} | {note} |")


if __name__ == "__main__":
    main()
