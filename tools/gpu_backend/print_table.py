#!/usr/bin/env python3
"""Prints the GPU suite's results (gtest XML, [ figure ] lines, benchmark JSON) as one table."""
import json
import pathlib
import re
import sys
import xml.etree.ElementTree as ET

out = pathlib.Path(sys.argv[1])
print((out / "machine.txt").read_text().strip() if (out / "machine.txt").exists() else "")
print()
print("| test binary | tests | failed | skipped |")
print("|---|---|---|---|")
for name in ("cuda_backend_host_tests", "cuda_ops_tests", "cuda_model_tests"):
    xml = out / f"{name}.xml"
    if not xml.exists():
        print(f"| {name} | (no result: crashed or timed out, see {name}.log) | | |")
        continue
    root = ET.parse(xml).getroot()
    failed, skipped = [], 0
    total = 0
    for case in root.iter("testcase"):
        total += 1
        if case.find("failure") is not None:
            failed.append(case.get("classname", "") + "." + case.get("name", ""))
        if case.find("skipped") is not None:
            skipped += 1
    print(f"| {name} | {total} | {len(failed)} | {skipped} |")
    for f in failed:
        print(f"|   FAILED: {f} | | | |")
print()
for name in ("cuda_ops_tests", "cuda_model_tests"):
    log = out / f"{name}.log"
    if log.exists():
        for line in log.read_text(errors="replace").splitlines():
            if "[ figure ]" in line:
                print(line.strip())
print()
def load(name):
    p = out / name
    try:
        return json.loads(p.read_text()) if p.exists() else {}
    except ValueError:
        return {}


bench = load("bench.json")
fallback = load("bench_fallback.json")
if "throughput" not in bench and "throughput" in fallback:
    print("(throughput from the fallback run without backend/cuda/attention attention)")
    bench["throughput"] = fallback["throughput"]
print(bench.get("kv_pool", ""))
if "attention_check" in bench:
    print("attention check:", json.dumps(bench["attention_check"]))
if bench.get("latency"):
    d = bench["latency"]
    print("| batch-1 decode, Llama-3-8B shape | ms/token p50 | mean | floor | % of floor |")
    print("|---|---|---|---|---|")
    for key in ("graphs_on", "graphs_off"):
        r = d.get(key)
        if r:
            print(f"| CUDA graphs {'on' if r['cuda_graphs'] else 'off'} | {r['decode_ms_p50']:.3f} | "
                  f"{r['decode_ms_mean']:.3f} | {r['weight_read_floor_ms']:.3f} | {100 * r['fraction_of_floor']:.0f}% |")
    print()
if bench.get("decode_sweep"):
    print("| static-batch decode (context 1024) | batch | ms/step p50 | tok/s |")
    print("|---|---|---|---|")
    for r in bench["decode_sweep"]:
        how = "CUDA graph + builtin attention" if r["graphs"] else "eager + backend/cuda/attention attention"
        print(f"| {how} | {r['batch']} | {r['ms_per_step_p50']:.2f} | {r['tok_per_s']:.0f} |")
    print("chosen max_graph_batch:", bench.get("chosen_max_graph_batch"))
    print()
if bench.get("throughput"):
    t = bench["throughput"]
    print("| throughput run | value |")
    print("|---|---|")
    for k, v in t.items():
        print(f"| {k} | {v:.1f} |" if isinstance(v, float) else f"| {k} | {v} |")
for name in ("engine_random.json", "engine_prefix.json"):
    for r in load(name).get("runs", []):
        print(f"| {r['label']} | {r['output_tok_per_s']:.0f} output tok/s | {r['total_tok_per_s']:.0f} total tok/s | "
              f"TTFT p50 {r['ttft_ms_p50']:.0f} ms | ITL p50 {r['itl_ms_p50']:.1f} ms | {r['finished']}/{r['requests']} |")
for name in ("tests.txt",):
    p = out / name
    if p.exists():
        print()
        print(p.read_text().strip())
for name in ("bench.log", "bench_fallback.log"):
    p = out / name
    if p.exists():
        tail = p.read_text(errors="replace").strip().splitlines()[-4:]
        print(f"--- {name} (tail)")
        print("\n".join(tail))
