#!/usr/bin/env python3
"""Makes the small random DeepSeek-V2 / V3 checkpoints pagoda's reference tests compare against.

The llama-family twin is tools/make_model_fixtures.py; this script reuses its reference loop
(24 greedy steps, top-5 logprobs, top-1 margins) and writes the same expected.json format. Runs
on the GPU machine, where transformers 5.x is installed (no GPU needed for these sizes).

Each case builds a tiny DeepseekV2ForCausalLM / DeepseekV3ForCausalLM with seeded random weights
(fan-in scaled, so logits are spread out; expert tensors included; V3's e_score_correction_bias
set to small random values so the correction changes which experts win), saves it with
save_pretrained in the case's dtype (transformers writes the routed experts per expert,
mlp.experts.E.{gate,up,down}_proj, as the Hub checkpoints hold them), reloads it in float32 with
eager attention and records the reference. The cases cover: plain q_proj (q_lora_rank null) and
q LoRA, V2 greedy and group-limited softmax routing, V3 sigmoid routing with the correction bias,
groups and norm_topk_prob, dense first layers, shared experts, attention biases, rope_interleave
on and off, yarn rope with DeepSeek's mscale, and one case with the real latent dims (kv_lora_rank
512, qk_rope_head_dim 64) but tiny otherwise.

With a GPU, expected.json also records `bf16_gpu_max_top5_logprob_error`: the largest difference
between transformers in bf16 on the GPU (teacher-forced on the greedy tokens) and the f32 reference
over every recorded top-5 logprob, the bound a bf16 GPU path can be held to.

--mla-baseline also times a plain PyTorch MLA decode in the absorbed form (MQA over a contiguous
bf16 latent of 576 values per token, value = the first 512) at 64 x 4K and 8 x 32K for 16 and 128
heads and prints the latent bytes read per second, a peer figure for a paged MLA decode kernel.

Usage: python3 tools/make_deepseek_fixtures.py --out DIR [--only CASE[,CASE...]] [--mla-baseline]
Writes DIR/<case>/{config.json, model.safetensors, expected.json} and prints, per case, the saved
tensor names of one MoE layer with shapes and dtypes.
"""
import argparse
import json
import os
import sys
import traceback

import torch
import transformers
from transformers import DeepseekV2Config, DeepseekV2ForCausalLM, DeepseekV3Config, DeepseekV3ForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_model_fixtures import reference  # noqa: E402  (same directory)

COMMON = dict(vocab_size=256, hidden_size=64, intermediate_size=128, max_position_embeddings=256,
              rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2, pad_token_id=None,
              tie_word_embeddings=False)


def rope(theta, **extra):
    return {"rope_type": extra.pop("rope_type", "default"), "rope_theta": theta, **extra}


def yarn(theta, factor, original, mscale, mscale_all_dim):
    return rope(theta, rope_type="yarn", factor=factor, original_max_position_embeddings=original,
                beta_fast=32.0, beta_slow=1.0, mscale=mscale, mscale_all_dim=mscale_all_dim)


V2 = (DeepseekV2Config, DeepseekV2ForCausalLM)
V3 = (DeepseekV3Config, DeepseekV3ForCausalLM)

CASES = [
    # name, (config class, model class), dtype, config kwargs, rope parameters, prompt length
    ("deepseek_v2_lite_bf16", V2, torch.bfloat16,
     dict(num_hidden_layers=3, num_attention_heads=4, q_lora_rank=None, kv_lora_rank=32,
          qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, first_k_dense_replace=1,
          n_routed_experts=8, n_shared_experts=2, num_experts_per_tok=2, moe_intermediate_size=32,
          topk_method="greedy", norm_topk_prob=False, routed_scaling_factor=1.0),
     rope(10000.0), 19),
    ("deepseek_v2_group_yarn_f32", V2, torch.float32,
     dict(num_hidden_layers=2, num_attention_heads=4, q_lora_rank=24, kv_lora_rank=32,
          qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12, first_k_dense_replace=0,
          n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=3, moe_intermediate_size=24,
          topk_method="group_limited_greedy", n_group=4, topk_group=2, norm_topk_prob=False,
          routed_scaling_factor=2.0, attention_bias=True),
     yarn(10000.0, 4.0, 64, 0.707, 0.707), 21),
    ("deepseek_v3_bf16", V3, torch.bfloat16,
     dict(num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=32,
          qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, first_k_dense_replace=1,
          n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=3, moe_intermediate_size=32,
          n_group=4, topk_group=2, norm_topk_prob=True, routed_scaling_factor=2.5, rope_interleave=True),
     yarn(10000.0, 4.0, 64, 1.0, 0.8), 23),
    ("deepseek_v3_latent512_bf16", V3, torch.bfloat16,
     dict(num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2, q_lora_rank=None, kv_lora_rank=512,
          qk_nope_head_dim=16, qk_rope_head_dim=64, v_head_dim=16, first_k_dense_replace=1,
          n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, moe_intermediate_size=32,
          n_group=1, topk_group=1, norm_topk_prob=False, routed_scaling_factor=1.0, rope_interleave=False),
     rope(10000.0), 17),
]


@torch.no_grad()
def randomise(model, seed):
    """Spread-out logits: matrices (and 3D expert stacks) scaled by their fan-in (last dim)."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if p.dim() == 1 and "norm" in name:
            p.copy_(0.6 + 0.8 * torch.rand(p.shape, generator=g))
        elif p.dim() == 1:  # biases
            p.copy_(0.2 * torch.randn(p.shape, generator=g))
        elif "embed_tokens" in name:
            p.copy_(torch.randn(p.shape, generator=g))
        else:
            p.copy_(torch.randn(p.shape, generator=g) * (1.2 / p.shape[-1] ** 0.5))
    for name, b in model.named_buffers():
        if name.endswith("e_score_correction_bias"):
            b.copy_(0.1 * torch.randn(b.shape, generator=g))


def load_reference(model_cls, case_dir):
    kwargs = dict(dtype=torch.float32, attn_implementation="eager")
    try:
        return model_cls.from_pretrained(case_dir, experts_implementation="eager", **kwargs)
    except (TypeError, ValueError) as e:
        print(f"  (experts_implementation=eager not taken: {e}); default experts implementation")
        return model_cls.from_pretrained(case_dir, **kwargs)


def describe_saved(case_dir, layer):
    from safetensors import safe_open
    path = os.path.join(case_dir, "model.safetensors")
    with safe_open(path, "pt") as f:
        keys = sorted(f.keys())
        prefix = f"model.layers.{layer}."
        for k in keys:
            if k.startswith(prefix) and (".experts." not in k or ".experts.0." in k or ".experts.1." in k):
                t = f.get_slice(k)
                print(f"    {k} {t.get_shape()} {t.get_dtype()}")
        print(f"    ({len(keys)} tensors, {sum(1 for k in keys if '.experts.' in k)} expert tensors)")


@torch.no_grad()
def bf16_gpu_error(model_cls, case_dir, prompt, expected):
    """Max |logprob(bf16 on the GPU) - logprob(f32 reference)| over the recorded top-5s."""
    if not torch.cuda.is_available():
        return None
    model = model_cls.from_pretrained(case_dir, dtype=torch.bfloat16, attn_implementation="eager").cuda().eval()
    greedy = expected["greedy_tokens"]
    ids = torch.tensor([prompt + greedy[:-1]], device="cuda")
    logprobs = torch.log_softmax(model(ids).logits[0].double(), dim=-1).cpu()
    error = 0.0
    for step, top5 in enumerate(expected["top5"]):
        row = logprobs[len(prompt) - 1 + step]
        for token, value in top5:
            error = max(error, abs(float(row[token]) - value))
    return error


@torch.no_grad()
def mla_decode_baseline():
    """Absorbed MLA decode in plain PyTorch (bf16 matmuls + f32 softmax) over a contiguous latent."""
    if not torch.cuda.is_available():
        print("mla baseline: no GPU")
        return
    for heads in (16, 128):
        for batch, length in ((64, 4096), (8, 32768)):
            latent = torch.randn(batch, length, 576, device="cuda", dtype=torch.bfloat16)
            q = torch.randn(batch, heads, 576, device="cuda", dtype=torch.bfloat16)

            def step():
                scores = torch.matmul(q, latent.transpose(1, 2)).float() * 0.0417
                probs = torch.softmax(scores, dim=-1).to(torch.bfloat16)
                return torch.matmul(probs, latent[..., :512])

            for _ in range(3):
                step()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            runs = 20
            for _ in range(runs):
                step()
            end.record()
            torch.cuda.synchronize()
            seconds = start.elapsed_time(end) / 1e3 / runs
            gbps = batch * length * 576 * 2 / seconds / 1e9
            print(f"mla baseline pytorch heads={heads} B={batch} L={length}: {seconds * 1e6:.1f} us, "
                  f"{gbps:.0f} GB/s of latent (read once)")
            del latent, q


def make_case(case, out_dir, seed):
    name, (config_cls, model_cls), dtype, kwargs, rope_params, prompt_len = case
    torch.manual_seed(seed)
    cfg = config_cls(**dict(COMMON, **kwargs), rope_parameters=dict(rope_params))
    model = model_cls(cfg).float()
    randomise(model, seed)
    model = model.to(dtype)
    case_dir = os.path.join(out_dir, name)
    os.makedirs(case_dir, exist_ok=True)
    model.save_pretrained(case_dir, safe_serialization=True)
    path = os.path.join(case_dir, "generation_config.json")
    if os.path.exists(path):
        os.remove(path)
    print(f"{name}: saved {sorted(os.listdir(case_dir))}")
    describe_saved(case_dir, cfg.first_k_dense_replace)
    reloaded = load_reference(model_cls, case_dir)
    reloaded.eval()
    g = torch.Generator().manual_seed(seed + 1)
    prompt = [int(t) for t in torch.randint(3, cfg.vocab_size, (prompt_len,), generator=g)]
    expected = {"name": name, "architecture": model_cls.__name__, "dtype": str(dtype).replace("torch.", ""),
                "prompt_ids": prompt, "transformers_version": transformers.__version__}
    expected.update(reference(reloaded, prompt))
    # The saved model must give what the in-memory one gives (the reverse conversion round-trips).
    with torch.no_grad():
        ids = torch.tensor([prompt])
        diff = (model.float()(ids).logits - reloaded(ids).logits).abs().max().item()
    print(f"  in-memory vs reloaded max |logit diff| {diff:.3e}")
    bf16_error = bf16_gpu_error(model_cls, case_dir, prompt, expected)
    if bf16_error is not None:
        expected["bf16_gpu_max_top5_logprob_error"] = bf16_error
        print(f"  transformers bf16 on the GPU vs f32: max top-5 logprob error {bf16_error:.4f}")
    with open(os.path.join(case_dir, "expected.json"), "w") as f:
        json.dump(expected, f)
    print(f"  greedy {expected['greedy_tokens']} min margin {min(expected['top1_margin']):.4f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--only", default="", help="comma-separated case names (default: all)")
    parser.add_argument("--mla-baseline", action="store_true", help="also time a PyTorch MLA decode on the GPU")
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
            make_case(case, args.out, 4321 + 17 * i)
        except Exception:  # keep going: one broken case must not cost the whole device call
            failed += 1
            print(f"FAILED {case[0]}", file=sys.stderr)
            traceback.print_exc()
    if args.mla_baseline:
        try:
            mla_decode_baseline()
        except Exception:
            failed += 1
            traceback.print_exc()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
