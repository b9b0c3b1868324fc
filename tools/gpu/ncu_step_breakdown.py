#!/usr/bin/env python3
"""Per-kernel breakdown of one profiled decode step from ncu's raw CSV.

Input: `ncu --csv --page raw --print-kernel-base function --metrics
gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,launch__grid_size ...` of one graph replay
(PAGODA_CUDA_PROFILE_REPLAY with --profile-from-start off). Output: a markdown table, one line per kernel
name and grid size (a GEMV's grid names its projection): launches in the step, summed us, share of the summed kernel time, DRAM GB/s (read + write bytes
over the kernel's own duration). ncu times each kernel alone (serialized, caches flushed), so the sum
excludes the launch gaps of the real graph replay; compare it with the measured step time.
Usage: ncu_step_breakdown.py RAW.csv [STEP_MS]
"""
import csv
import sys


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def main():
    path = sys.argv[1]
    step_ms = float(sys.argv[2]) if len(sys.argv) > 2 else None
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

    groups = {}
    order = []
    for row in rows[2:]:
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


if __name__ == "__main__":
    main()
