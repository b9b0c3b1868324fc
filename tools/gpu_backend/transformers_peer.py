#!/usr/bin/env python3
"""The peer figure for the engine benchmark: transformers' continuous batching
(`generate_batch`, paged attention) on the same model shape with random bf16
weights, on the GPU machine, in the same device call as pagoda's run.

  python3 tools/gpu_backend/transformers_peer.py --config tools/gpu_backend/llama3_8b_config.json \
      --num-requests 256 --input-len 512 --output-len 256 --json OUT.json

Prompts are random token ids (seeded); decoding is greedy. Output tokens per
second counts the tokens actually generated (a random model may stop early at
an end-of-sequence id, so eos is disabled where the config allows it).
"""
import argparse
import json
import time

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.generation import GenerationConfig


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--config", required=True)
    p.add_argument("--num-requests", type=int, default=256)
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--attn", default="sdpa_paged")
    p.add_argument("--json", default="")
    a = p.parse_args()

    with open(a.config) as f:
        fields = json.load(f)
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    t0 = time.time()
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16, attn_implementation=a.attn)
    model.eval()
    build_s = time.time() - t0

    g = torch.Generator().manual_seed(3)
    inputs = torch.randint(0, config.vocab_size, (a.num_requests, a.input_len), generator=g).tolist()
    gen = GenerationConfig(max_new_tokens=a.output_len, do_sample=False, eos_token_id=-1, pad_token_id=0)

    torch.cuda.synchronize()
    t0 = time.time()
    try:
        with torch.no_grad():
            results = model.generate_batch(inputs=inputs, generation_config=gen, progress_bar=False)
    except Exception as e:  # an older API may refuse eos -1: fall back to the config's eos
        print(f"generate_batch with eos disabled failed ({e!r}); retrying with the config's eos")
        gen = GenerationConfig(max_new_tokens=a.output_len, do_sample=False, pad_token_id=0)
        t0 = time.time()
        with torch.no_grad():
            results = model.generate_batch(inputs=inputs, generation_config=gen, progress_bar=False)
    torch.cuda.synchronize()
    seconds = time.time() - t0
    generated = sum(len(r.generated_tokens) for r in results.values())
    figures = {
        "transformers": transformers.__version__, "torch": torch.__version__, "attn": a.attn,
        "requests": a.num_requests, "input_len": a.input_len, "output_len": a.output_len,
        "model_build_s": round(build_s, 1), "seconds": round(seconds, 2), "generated_tokens": generated,
        "output_tok_per_s": round(generated / seconds, 1),
        "total_tok_per_s": round((generated + a.num_requests * a.input_len) / seconds, 1),
    }
    print(json.dumps(figures))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(figures, f, indent=2)


if __name__ == "__main__":
    main()
