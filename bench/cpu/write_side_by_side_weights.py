#!/usr/bin/env python3
"""Writes one random Llama as safetensors (for pagoda) and as GGUF (for llama.cpp), in f32, f16 and bf16.

The weights of bench/cpu/llamacpp_side_by_side.sh: every file holds the same values. They are drawn once
per tensor (normal, standard deviation 0.02, from a seeded generator) in f32 and written to all six outputs
in one pass; f16 is numpy's round-to-nearest cast and bf16 rounds to nearest even (as torch does), so the
f16 / bf16 files of the two engines are bit for bit the same numbers. Norm weights are ones.

GGUF files are written with llama.cpp's own gguf-py (pass its directory with --gguf-py) the way its
convert_hf_to_gguf.py writes a LlamaForCausalLM: the same metadata keys, tensor names, f32 norms, and
q_proj / k_proj rows permuted from the Hugging Face rotary layout to llama.cpp's interleaved one, as that
converter does (not checked here by comparing the two engines' outputs). The vocabulary is synthetic (llama-bench and pagoda's --prompt-ids use token ids):
<unk>, <s>, </s>, the 256 byte tokens, then "t<id>". Q8_0 / Q4_0 files are made from the f32 GGUF by
llama-quantize (the shell script does that).

Needs numpy (Debian python3-numpy) and python3-yaml (gguf-py imports it).

    write_side_by_side_weights.py OUT_DIR --gguf-py SRC/gguf-py [--hidden 2048 --layers 16 ...]
    -> OUT_DIR/{f32,f16,bf16}/{config.json,model.safetensors}, OUT_DIR/gguf/model-{f32,f16,bf16}.gguf
"""
import argparse
import json
import os
import struct
import sys

import numpy as np

from write_random_checkpoint import add_shape_args  # same directory

DTYPES = ("f32", "f16", "bf16")
ST_NAMES = {"f32": "F32", "f16": "F16", "bf16": "BF16"}
BYTES = {"f32": 4, "f16": 2, "bf16": 2}


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """f32 -> bf16 bit patterns (uint16), round to nearest even; inputs are finite here."""
    u = x.view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def convert(x: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "f32":
        return x
    if dtype == "f16":
        return x.astype(np.float16)
    return to_bf16_bits(x)


def permute_rotary(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute: HF's rotate-half rows -> interleaved pairs."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def tensor_list(a):
    """(hf name, gguf name, shape, kind) in file order; kind: 'norm', 'q', 'k' or 'w'."""
    head_dim = a.hidden // a.heads
    q_out, kv_out = a.heads * head_dim, a.kv_heads * head_dim
    out = [("model.embed_tokens.weight", "token_embd.weight", [a.vocab, a.hidden], "w")]
    for i in range(a.layers):
        hf, gg = f"model.layers.{i}.", f"blk.{i}."
        out += [
            (hf + "input_layernorm.weight", gg + "attn_norm.weight", [a.hidden], "norm"),
            (hf + "self_attn.q_proj.weight", gg + "attn_q.weight", [q_out, a.hidden], "q"),
            (hf + "self_attn.k_proj.weight", gg + "attn_k.weight", [kv_out, a.hidden], "k"),
            (hf + "self_attn.v_proj.weight", gg + "attn_v.weight", [kv_out, a.hidden], "w"),
            (hf + "self_attn.o_proj.weight", gg + "attn_output.weight", [a.hidden, q_out], "w"),
            (hf + "post_attention_layernorm.weight", gg + "ffn_norm.weight", [a.hidden], "norm"),
            (hf + "mlp.gate_proj.weight", gg + "ffn_gate.weight", [a.intermediate, a.hidden], "w"),
            (hf + "mlp.up_proj.weight", gg + "ffn_up.weight", [a.intermediate, a.hidden], "w"),
            (hf + "mlp.down_proj.weight", gg + "ffn_down.weight", [a.hidden, a.intermediate], "w"),
        ]
    out += [("model.norm.weight", "output_norm.weight", [a.hidden], "norm"),
            ("lm_head.weight", "output.weight", [a.vocab, a.hidden], "w")]
    return out


def hf_config(a, dtype: str) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": a.hidden,
        "num_hidden_layers": a.layers, "num_attention_heads": a.heads, "num_key_value_heads": a.kv_heads,
        "intermediate_size": a.intermediate, "vocab_size": a.vocab, "max_position_embeddings": a.context,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False,
        "torch_dtype": {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}[dtype],
        "bos_token_id": 1, "eos_token_id": 2,
    }


def gguf_writer(gguf, a, dtype: str, path: str, tensors):
    ftype = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
             "bf16": gguf.LlamaFileType.MOSTLY_BF16}[dtype]
    w = gguf.GGUFWriter(path, gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.LLAMA])
    w.add_name(f"pagoda side-by-side random Llama {dtype}")
    w.add_context_length(a.context)
    w.add_embedding_length(a.hidden)
    w.add_block_count(a.layers)
    w.add_feed_forward_length(a.intermediate)
    w.add_head_count(a.heads)
    w.add_head_count_kv(a.kv_heads)
    w.add_rope_dimension_count(a.hidden // a.heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(a.vocab)
    w.add_file_type(ftype)
    w.add_tokenizer_model("llama")
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    tokens += [f"t{i}" for i in range(len(tokens), a.vocab)]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    types += [gguf.TokenType.BYTE] * 256 + [gguf.TokenType.NORMAL] * (a.vocab - 259)
    w.add_token_list(tokens)
    w.add_token_scores([-float(i) for i in range(a.vocab)])
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    for _, name, shape, kind in tensors:
        n = int(np.prod(shape))
        if kind == "norm" or dtype == "f32":
            w.add_tensor_info(name, shape, np.dtype(np.float32), 4 * n)
        elif dtype == "f16":
            w.add_tensor_info(name, shape, np.dtype(np.float16), 2 * n)
        else:
            w.add_tensor_info(name, shape, np.dtype(np.uint16), 2 * n, raw_dtype=gguf.GGMLQuantizationType.BF16)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    return w


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out_dir")
    p.add_argument("--gguf-py", required=True, help="llama.cpp's gguf-py directory")
    p.add_argument("--seed", type=int, default=27)
    add_shape_args(p)
    p.add_argument("--context", type=int, default=2048)
    a = p.parse_args()
    if a.vocab < 260 or a.hidden % a.heads or a.heads % a.kv_heads or (a.hidden // a.heads) % 2:
        sys.exit("bad shape: need vocab >= 260, hidden divisible by heads, heads by kv-heads, even head dim")
    sys.path.insert(0, a.gguf_py)
    import gguf  # llama.cpp's own writer, from the source tree being benchmarked

    tensors = tensor_list(a)
    os.makedirs(os.path.join(a.out_dir, "gguf"), exist_ok=True)
    st_files, writers = {}, {}
    for dtype in DTYPES:
        d = os.path.join(a.out_dir, dtype)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(hf_config(a, dtype), f, indent=1)
        header, offset = {}, 0
        for hf, _, shape, _ in tensors:
            nbytes = BYTES[dtype] * int(np.prod(shape))
            header[hf] = {"dtype": ST_NAMES[dtype], "shape": shape, "data_offsets": [offset, offset + nbytes]}
            offset += nbytes
        blob = json.dumps(header, separators=(",", ":")).encode()
        blob += b" " * (-len(blob) % 8)
        f = open(os.path.join(d, "model.safetensors.partial"), "wb")
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        st_files[dtype] = f
        writers[dtype] = gguf_writer(gguf, a, dtype, os.path.join(a.out_dir, "gguf", f"model-{dtype}.gguf.partial"),
                                     tensors)

    rng = np.random.default_rng(a.seed)
    for hf, _, shape, kind in tensors:
        if kind == "norm":
            x = np.ones(shape, dtype=np.float32)
        else:
            x = rng.standard_normal(shape, dtype=np.float32)
            x *= np.float32(0.02)
        gg = x
        if kind == "q":
            gg = permute_rotary(x, a.heads)
        elif kind == "k":
            gg = permute_rotary(x, a.kv_heads)
        for dtype in DTYPES:
            convert(x, dtype).tofile(st_files[dtype])
            writers[dtype].write_tensor_data(gg if kind == "norm" else np.ascontiguousarray(convert(gg, dtype)))
    for dtype in DTYPES:
        st_files[dtype].close()
        writers[dtype].close()
        d = os.path.join(a.out_dir, dtype)
        os.replace(os.path.join(d, "model.safetensors.partial"), os.path.join(d, "model.safetensors"))
        g = os.path.join(a.out_dir, "gguf", f"model-{dtype}.gguf")
        os.replace(g + ".partial", g)


if __name__ == "__main__":
    main()
