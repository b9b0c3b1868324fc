#!/usr/bin/env python3
"""Writes expected.json for each FP8 fixture (tests/fixtures/fp8/<case>/).

Runs on the GPU machine (torch + transformers). Two references:

  emulated (every case): the bf16 source model (tests/fixtures/models/
    mistral_bf16) in float32 with each quantized Linear's weight replaced by
    the fixture's fp8 weight dequantized by torch (float8_e4m3fn -> f32,
    times its scale laid out per the format), and its input rounded through
    torch's float8_e4m3fn cast with the format's activation scales (dynamic
    per token, per token and group, or the static input_scale). That is the
    arithmetic pagoda's CPU reference claims to do, computed independently.
  transformers_fp8 (block_fp8 only): transformers' own FineGrainedFP8
    loading of the fixture (quant_method fp8) on the GPU, its fp8 GEMM kernel
    included.

Each reference records, like tools/make_model_fixtures.py, the top-5
log-probabilities after the prompt and at each of 24 greedy steps.

Usage: python3 tools/gpu/fp8_reference.py [--fixtures DIR] [--src DIR] [--out DIR]
(--out: where the expected.json files go, DIR/<case>/expected.json; default
the fixture directories themselves).
"""
import argparse
import json
import os
import sys
import traceback

import torch
import transformers
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

STEPS = 24
FP8_MAX = 448.0


@torch.no_grad()
def reference(model, prompt, device="cpu"):
    ids = torch.tensor([prompt], device=device)
    out = {"greedy_tokens": [], "top5": [], "top1_margin": []}
    for step in range(STEPS):
        logits = model(ids).logits[0, -1].double().cpu()
        logprobs = torch.log_softmax(logits, dim=-1)
        top = torch.topk(logprobs, 5)
        top5 = [[int(i), float(v)] for v, i in zip(top.values, top.indices)]
        best2 = torch.topk(logits, 2).values
        if step == 0:
            out["prompt_top5"] = top5
        out["top5"].append(top5)
        out["top1_margin"].append(float(best2[0] - best2[1]))
        nxt = int(top.indices[0])
        out["greedy_tokens"].append(nxt)
        ids = torch.cat([ids, torch.tensor([[nxt]], device=device)], dim=1)
    return out


def fake_fp8(x, scale):
    """x rounded through float8_e4m3fn with the multiplier scale (broadcast), back in x's dtype."""
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = (x / safe).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).to(x.dtype) * safe
    return torch.where(scale > 0, q, x)


def activation_hook(scheme, group, input_scale):
    def hook(module, args):
        x = args[0]
        if scheme == "token":
            s = x.abs().amax(dim=-1, keepdim=True) / FP8_MAX
            return (fake_fp8(x, s),)
        if scheme == "group":
            shape = x.shape
            g = x.reshape(*shape[:-1], shape[-1] // group, group)
            s = g.abs().amax(dim=-1, keepdim=True) / FP8_MAX
            return (fake_fp8(g, s).reshape(shape),)
        if scheme == "static":
            return (fake_fp8(x, torch.tensor(input_scale, dtype=x.dtype)),)
        return None
    return hook


def scheme_of(config):
    q = config["quantization_config"]
    if q["quant_method"] == "compressed-tensors":
        group = next(iter(q["config_groups"].values()))
        a = group.get("input_activations")
        strategy = group["weights"]["strategy"]
        act = None if a is None else ("token" if a["strategy"] == "token" else
                                      "group" if a["strategy"] == "group" else "static")
        return strategy, "weight_scale", act, (a or {}).get("group_size", 0), None
    if q["quant_method"] == "modelopt":
        return "tensor", "weight_scale", "static", 0, None
    block = q["weight_block_size"]
    return "block", "weight_scale_inv", "group", block[1], block


def emulated(case_dir, src_dir, prompt):
    config = json.load(open(os.path.join(case_dir, "config.json")))
    strategy, scale_name, act, group, block = scheme_of(config)
    tensors = load_file(os.path.join(case_dir, "model.safetensors"))
    model = AutoModelForCausalLM.from_pretrained(src_dir, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    replaced = 0
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear):
            continue
        w = tensors.get(name + ".weight")
        if w is None or w.dtype != torch.float8_e4m3fn:
            continue
        wf = w.to(torch.float32)
        s = tensors[name + "." + scale_name].to(torch.float32)
        if strategy == "tensor":
            wf = wf * s.reshape(())
        elif strategy == "channel":
            wf = wf * s.reshape(-1, 1)
        else:
            bn, bk = block
            s2 = s.repeat_interleave(bn, dim=0)[: wf.shape[0]].repeat_interleave(bk, dim=1)[:, : wf.shape[1]]
            wf = wf * s2
        with torch.no_grad():
            module.weight.copy_(wf)
        input_scale = float(tensors[name + ".input_scale"].reshape(())) if act == "static" else None
        if act is not None:
            module.register_forward_pre_hook(activation_hook(act, group, input_scale))
        replaced += 1
    print(f"{os.path.basename(case_dir)}: emulated reference, {replaced} fp8 Linear layers")
    return reference(model, prompt)


def native_fp8(case_dir, prompt):
    """transformers' FineGrainedFP8 on the GPU; float32 activations where it allows, else bfloat16."""
    for dtype in (torch.float32, torch.bfloat16):
        try:
            model = AutoModelForCausalLM.from_pretrained(case_dir, dtype=dtype, attn_implementation="eager",
                                                         device_map="cuda")
            model.eval()
            kinds = sorted({type(m).__name__ for m in model.modules() if "FP8" in type(m).__name__})
            out = reference(model, prompt, device="cuda")
            out["dtype"] = str(dtype).replace("torch.", "")
            out["modules"] = kinds
            print(f"{os.path.basename(case_dir)}: transformers fp8 in {dtype}, modules {kinds}")
            return out
        except Exception:
            print(f"transformers fp8 in {dtype} failed:", file=sys.stderr)
            traceback.print_exc()
    return None


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--fixtures", default="tests/fixtures/fp8")
    parser.add_argument("--src", default="tests/fixtures/models/mistral_bf16")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    print("transformers", transformers.__version__, "torch", torch.__version__)
    prompt = json.load(open(os.path.join(args.src, "expected.json")))["prompt_ids"]
    failed = 0
    for case in sorted(os.listdir(args.fixtures)):
        case_dir = os.path.join(args.fixtures, case)
        if not os.path.isdir(case_dir):
            continue
        if case == "block_fp8_128":  # not made from the bf16 source: its reference is its dequantized twin
            continue
        try:
            expected = {"name": case, "prompt_ids": prompt, "transformers_version": transformers.__version__,
                        "torch_version": torch.__version__,
                        "emulated": emulated(case_dir, args.src, prompt)}
            if case == "block_fp8":
                native = native_fp8(case_dir, prompt)
                if native is not None:
                    expected["transformers_fp8"] = native
            out_dir = os.path.join(args.out, case) if args.out else case_dir
            os.makedirs(out_dir, exist_ok=True)
            with open(os.path.join(out_dir, "expected.json"), "w") as f:
                json.dump(expected, f)
        except Exception:
            failed += 1
            print(f"FAILED {case}", file=sys.stderr)
            traceback.print_exc()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
