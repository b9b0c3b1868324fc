#!/usr/bin/env python3
"""Writes a random bf16 or f16 Llama checkpoint (config.json + model.safetensors) for CPU speed runs.

`pagoda generate --load-format random` makes f32 weights; this gives the bf16/f16 rows of
bench/cpu/llama_shape_bench.sh a checkpoint of the same shape that pagoda loads as it would a real
one (mmapped, kept in its file dtype). Standard library only (no numpy): each element is a random
mantissa with a fixed small exponent and a random sign, magnitudes about 0.008 to 0.12 (the values
do not matter for speed, only that they are finite and do not blow up over the layers).

    bench/cpu/write_random_checkpoint.py OUT_DIR [--dtype bf16|f16] [--hidden 2048 --layers 16 ...]
"""
import argparse
import json
import os
import struct


def random_halves(count: int, dtype: str) -> bytes:
    """count little-endian 16-bit floats: random low byte, high byte = sign | fixed exponent."""
    low = os.urandom(count)
    # bf16 high byte 0x3c/0x3d (+ sign): exponent 120..123, |x| in [2^-7, 2^-3);
    # f16 high byte 0x28..0x2b (+ sign): exponent 10, |x| in [2^-5, 2^-4).
    base = 0x3C if dtype == "bf16" else 0x28
    table = bytes(base | (b & 0x80) | (b & 0x01 if dtype == "bf16" else b & 0x03) for b in range(256))
    high = os.urandom(count).translate(table)
    out = bytearray(2 * count)
    out[0::2] = low
    out[1::2] = high
    return bytes(out)


def add_shape_args(p: argparse.ArgumentParser) -> None:
    """The Llama shape flags, defaults the issue-27 ~0.85B model (also write_side_by_side_weights.py's)."""
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--intermediate", type=int, default=5632)
    p.add_argument("--vocab", type=int, default=32000)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out_dir")
    p.add_argument("--dtype", choices=["bf16", "f16"], default="bf16")
    add_shape_args(p)
    a = p.parse_args()
    head_dim = a.hidden // a.heads
    q_out, kv_out = a.heads * head_dim, a.kv_heads * head_dim
    tensors = [("model.embed_tokens.weight", [a.vocab, a.hidden])]
    for i in range(a.layers):
        pre = f"model.layers.{i}."
        tensors += [
            (pre + "input_layernorm.weight", [a.hidden]),
            (pre + "post_attention_layernorm.weight", [a.hidden]),
            (pre + "self_attn.q_proj.weight", [q_out, a.hidden]),
            (pre + "self_attn.k_proj.weight", [kv_out, a.hidden]),
            (pre + "self_attn.v_proj.weight", [kv_out, a.hidden]),
            (pre + "self_attn.o_proj.weight", [a.hidden, q_out]),
            (pre + "mlp.gate_proj.weight", [a.intermediate, a.hidden]),
            (pre + "mlp.up_proj.weight", [a.intermediate, a.hidden]),
            (pre + "mlp.down_proj.weight", [a.hidden, a.intermediate]),
        ]
    tensors += [("model.norm.weight", [a.hidden]), ("lm_head.weight", [a.vocab, a.hidden])]
    st_dtype = "BF16" if a.dtype == "bf16" else "F16"
    header, offset = {}, 0
    for name, shape in tensors:
        n = 1
        for d in shape:
            n *= d
        header[name] = {"dtype": st_dtype, "shape": shape, "data_offsets": [offset, offset + 2 * n]}
        offset += 2 * n
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    os.makedirs(a.out_dir, exist_ok=True)
    one = struct.pack("<H", 0x3F80 if a.dtype == "bf16" else 0x3C00)
    with open(os.path.join(a.out_dir, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for name, shape in tensors:
            n = 1
            for d in shape:
                n *= d
            f.write(one * n if name.endswith("norm.weight") else random_halves(n, a.dtype))
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": a.hidden,
        "num_hidden_layers": a.layers, "num_attention_heads": a.heads, "num_key_value_heads": a.kv_heads,
        "intermediate_size": a.intermediate, "vocab_size": a.vocab, "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16" if a.dtype == "bf16" else "float16", "bos_token_id": 1, "eos_token_id": 2,
    }
    with open(os.path.join(a.out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=1)


if __name__ == "__main__":
    main()
