#!/usr/bin/env python3
"""Makes the small random checkpoints pagoda's reference tests compare against.

Runs on the GPU machine, where transformers is installed (no GPU needed for
these sizes). For each supported architecture it builds a tiny model with
seeded random weights, scaled up so that logits are far from flat, saves it
with save_pretrained in the dtype the case names (one case sharded), reloads
the saved files in float32 (so bf16/f16 weights are upcast exactly as pagoda's
CPU reference does) and records, from a plain full-sequence forward with eager
attention:
  prompt_top5   top-5 next-token logprobs after the prompt,
  greedy_tokens 24 greedy tokens,
  top5          top-5 logprobs at each of those 24 steps,
  top1_margin   logit gap between the best and second-best token at each step
                (tests may forgive a flipped near-tie).

mistral_sliding_bf16 has a sliding window of 8 and a 20-token prompt, so the
prompt and all 24 generated tokens attend through the window (transformers:
key j is visible to query i iff i - 8 < j <= i); the script checks that the
window changes the logits (else the case would not test it). It is kept under
200 KB (vocab 128, MLP 128).

Usage: python3 tools/make_model_fixtures.py --out DIR [--only CASE[,CASE...]]
Writes DIR/<case>/{config.json, *.safetensors[, index], expected.json}.
"""
import argparse
import json
import os
import sys
import traceback

import torch
import transformers
from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM,
                          Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)

STEPS = 24
COMMON = dict(vocab_size=256, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
              max_position_embeddings=512, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2,
              pad_token_id=None)


def rope(theta, **extra):
    """Rope settings in both the transformers 4 and 5 spellings."""
    params = {"rope_type": extra.pop("rope_type", "default"), "rope_theta": theta, **extra}
    return params


CASES = [
    # name, config class, model class, dtype, config kwargs, rope params, prompt length, shard
    ("llama_f32", LlamaConfig, LlamaForCausalLM, torch.float32,
     dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False),
     rope(10000.0), 12, False),
    ("llama3_rope_bf16", LlamaConfig, LlamaForCausalLM, torch.bfloat16,
     dict(num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=False),
     rope(500000.0, rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
          original_max_position_embeddings=32), 40, False),
    ("llama_mqa_f16", LlamaConfig, LlamaForCausalLM, torch.float16,
     dict(num_attention_heads=4, num_key_value_heads=1, tie_word_embeddings=False),
     rope(10000.0), 17, False),
    ("mistral_bf16", MistralConfig, MistralForCausalLM, torch.bfloat16,
     dict(num_attention_heads=4, num_key_value_heads=2, sliding_window=None, tie_word_embeddings=False),
     rope(1000000.0), 15, False),
    ("qwen2_tied_bf16", Qwen2Config, Qwen2ForCausalLM, torch.bfloat16,
     dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True, use_sliding_window=False),
     rope(1000000.0), 13, False),
    ("qwen3_sharded_f32", Qwen3Config, Qwen3ForCausalLM, torch.float32,
     dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32, tie_word_embeddings=False,
          use_sliding_window=False),
     rope(1000000.0), 19, True),
    # Appended last so the seeds (by index) of the cases above stay the same.
    ("mistral_sliding_bf16", MistralConfig, MistralForCausalLM, torch.bfloat16,
     dict(num_attention_heads=4, num_key_value_heads=2, sliding_window=8, tie_word_embeddings=False,
          vocab_size=128, intermediate_size=128),
     rope(1000000.0), 20, False),
]


def make_config(config_cls, kwargs, rope_params):
    kw = dict(COMMON, **kwargs)
    try:  # transformers 5: rope_parameters
        cfg = config_cls(**kw, rope_parameters=dict(rope_params))
        if getattr(cfg, "rope_parameters", None) is None:
            raise TypeError("no rope_parameters")
    except TypeError:  # transformers 4: rope_theta + rope_scaling
        extra = dict(rope_params)
        theta = extra.pop("rope_theta")
        scaling = extra if extra.get("rope_type", "default") != "default" else None
        cfg = config_cls(**kw, rope_theta=theta, rope_scaling=scaling)
    return cfg


@torch.no_grad()
def randomise(model, seed):
    """Weights large enough that logits are spread out (std ~1-3), norms not all ones."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if p.dim() == 1 and "norm" in name:
            p.copy_(0.6 + 0.8 * torch.rand(p.shape, generator=g))
        elif p.dim() == 1:  # biases
            p.copy_(0.2 * torch.randn(p.shape, generator=g))
        elif "embed_tokens" in name:
            p.copy_(torch.randn(p.shape, generator=g))
        else:
            p.copy_(torch.randn(p.shape, generator=g) * (1.2 / p.shape[1] ** 0.5))


@torch.no_grad()
def reference(model, prompt):
    ids = torch.tensor([prompt])
    out = {"greedy_tokens": [], "top5": [], "top1_margin": []}
    for step in range(STEPS):
        logits = model(ids).logits[0, -1].double()
        logprobs = torch.log_softmax(logits, dim=-1)
        top = torch.topk(logprobs, 5)
        top5 = [[int(i), float(v)] for v, i in zip(top.values, top.indices)]
        sorted_logits = torch.topk(logits, 2).values
        if step == 0:
            out["prompt_top5"] = top5
        out["top5"].append(top5)
        out["top1_margin"].append(float(sorted_logits[0] - sorted_logits[1]))
        nxt = int(top.indices[0])
        out["greedy_tokens"].append(nxt)
        ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)
    return out


def make_case(case, out_dir, seed):
    name, config_cls, model_cls, dtype, kwargs, rope_params, prompt_len, shard = case
    torch.manual_seed(seed)
    cfg = make_config(config_cls, kwargs, rope_params)
    model = model_cls(cfg).float()
    randomise(model, seed)
    if model.config.tie_word_embeddings:
        model.tie_weights()
    model = model.to(dtype)
    case_dir = os.path.join(out_dir, name)
    os.makedirs(case_dir, exist_ok=True)
    model.save_pretrained(case_dir, max_shard_size="150KB" if shard else "1GB", safe_serialization=True)
    for extra in ("generation_config.json",):
        path = os.path.join(case_dir, extra)
        if os.path.exists(path):
            os.remove(path)
    reloaded = model_cls.from_pretrained(case_dir, dtype=torch.float32, attn_implementation="eager")
    reloaded.eval()
    g = torch.Generator().manual_seed(seed + 1)
    prompt = [int(t) for t in torch.randint(3, cfg.vocab_size, (prompt_len,), generator=g)]
    expected = {"name": name, "architecture": cfg.architectures[0] if cfg.architectures else model_cls.__name__,
                "dtype": str(dtype).replace("torch.", ""), "prompt_ids": prompt,
                "transformers_version": transformers.__version__}
    expected.update(reference(reloaded, prompt))
    window = getattr(cfg, "sliding_window", None)
    if window:
        expected["sliding_window"] = window
        assert prompt_len + STEPS > 2 * window, "the case must cross its sliding window"
        # The window must matter: the same weights with full attention give other logits.
        full = model_cls.from_pretrained(case_dir, dtype=torch.float32, attn_implementation="eager",
                                         sliding_window=None)
        full.eval()
        with torch.no_grad():
            ids = torch.tensor([prompt + expected["greedy_tokens"]])
            diff = (full(ids).logits - reloaded(ids).logits).abs().max().item()
        print(f"{name}: sliding window {window}, max |logit(full) - logit(window)| = {diff:.4f}")
        assert diff > 1e-2, "sliding window has no effect on this case"
    with open(os.path.join(case_dir, "expected.json"), "w") as f:
        json.dump(expected, f)
    files = sorted(os.listdir(case_dir))
    print(f"{name}: {files} min margin {min(expected['top1_margin']):.4f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--only", default="", help="comma-separated case names (default: all)")
    args = parser.parse_args()
    only = [n for n in args.only.split(",") if n]
    unknown = sorted(set(only) - {case[0] for case in CASES})
    if unknown:
        parser.error(f"--only: unknown case(s) {unknown}; cases are {[case[0] for case in CASES]}")
    print("transformers", transformers.__version__, "torch", torch.__version__)
    failed = 0
    for i, case in enumerate(CASES):
        if only and case[0] not in only:
            continue
        try:
            make_case(case, args.out, 1234 + 17 * i)
        except Exception:  # keep going: one broken case must not cost the whole device call
            failed += 1
            print(f"FAILED {case[0]}", file=sys.stderr)
            traceback.print_exc()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
