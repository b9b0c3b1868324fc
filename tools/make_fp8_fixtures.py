#!/usr/bin/env python3
"""Makes the tiny FP8 checkpoints of tests/fixtures/fp8/ from a bf16 fixture.

Pure Python (no torch, no numpy): reads the bf16 safetensors of
tests/fixtures/models/mistral_bf16, quantizes its Linear weights to
float8_e4m3fn by hand (round to nearest even, saturating at 448, as torch's
clamp-then-cast does) and writes one checkpoint per format pagoda loads:

  ct_channel_dynamic  compressed-tensors float-quantized: per-channel bf16
                      weight_scale [out, 1], dynamic per-token activations,
                      ignore [lm_head].
  ct_tensor_static    compressed-tensors float-quantized: per-tensor f32
                      weight_scale [1], static f32 input_scale [1]; ignore
                      lm_head and (by regex) layer 1's down_proj, which stays bf16.
  modelopt_fp8        ModelOpt FP8 (quant_method modelopt, quant_algo FP8;
                      hf_quant_config.json too): per-tensor weight_scale [] and
                      input_scale [] in f32, exclude_modules [lm_head].
  block_fp8           quant_method fp8, weight_block_size [32, 32] (the format's
                      usual 128 does not fit a 64-wide model), f32
                      weight_scale_inv [ceil(out/32), ceil(in/32)], dynamic
                      activations per token and 32 columns; lm_head bf16.

  block_fp8_128       the block-wise format at its real size, as DeepSeek-V3 and
                      Qwen3-FP8 ship it (quant_method fp8, fmt e4m3, activation_scheme
                      dynamic, weight_block_size [128, 128], f32 weight_scale_inv
                      [ceil(out/128), ceil(in/128)]); its own seeded random tiny
                      Qwen3 (hidden 256, 2 heads of 128, 1 KV head, intermediate
                      384, 2 layers, vocab 256: every projection whole 128-blocks,
                      so the GPU runs it as 128x128 block fp8), lm_head and
                      embeddings bf16. Its reference is the same model with the
                      weights dequantized, which the tests build themselves (no
                      expected.json).

Every scale multiplies: w = fp8 * scale. Static input scales are fixed
generous bounds (not calibrated): the references apply the same ones, and
the quality against the bf16 source is measured, not assumed.

tools/gpu/fp8_reference.py (on the GPU machine) writes each case's
expected.json from these files.

Usage: python3 tools/make_fp8_fixtures.py [--src DIR] [--out DIR]
"""
import argparse
import json
import math
import os
import struct

SRC = "tests/fixtures/models/mistral_bf16"
OUT = "tests/fixtures/fp8"
LINEARS = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]


def read_safetensors(path):
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "BF16", (name, info["dtype"])
        begin, end = info["data_offsets"]
        raw = body[begin:end]
        values = [bf16_to_f32(v) for v in struct.unpack("<%dH" % ((end - begin) // 2), raw)]
        tensors[name] = (info["shape"], values, raw)
    return tensors


def write_safetensors(path, tensors):
    """tensors: name -> (dtype, shape, bytes), written sorted by name."""
    header, offset, blobs = {}, 0, []
    for name in sorted(tensors):
        dtype, shape, raw = tensors[name]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


def bf16_to_f32(bits):
    return struct.unpack("<f", struct.pack("<I", bits << 16))[0]


def f32_to_bf16_bits(x):
    u = struct.unpack("<I", struct.pack("<f", x))[0]
    u += 0x7FFF + ((u >> 16) & 1)
    return (u >> 16) & 0xFFFF


def round_f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def f32_to_e4m3(x):
    """float8_e4m3fn byte of x: saturate at 448, round to nearest even."""
    sign = 0x80 if math.copysign(1.0, x) < 0 else 0
    a = min(abs(x), 448.0)
    if a < 2.0 ** -10:
        return sign
    if a < 2.0 ** -6:  # subnormal: steps of 2^-9
        m = round(a * 512.0)  # Python rounds halves to even
        return sign | (0x08 if m >= 8 else m)
    e = math.frexp(a)[1] - 1  # a = 1.f * 2^e
    m = round(a / 2.0 ** e * 8.0)  # in [8, 16]
    if m == 16:
        m, e = 8, e + 1
    exp = e + 7
    if exp > 15 or (exp == 15 and m - 8 > 6):
        return sign | 0x7E
    return sign | (exp << 3) | (m - 8)


def e4m3_to_f32(b):
    exp, mant = (b >> 3) & 0xF, b & 7
    v = mant * 2.0 ** -9 if exp == 0 else (1 + mant / 8.0) * 2.0 ** (exp - 7)
    return -v if b & 0x80 else v


def quantize(values, rows, cols, scale_of):
    """fp8 bytes of a [rows, cols] row-major matrix, scale_of(r, c) the multiplier."""
    out = bytearray(rows * cols)
    for r in range(rows):
        for c in range(cols):
            s = scale_of(r, c)
            out[r * cols + c] = f32_to_e4m3(values[r * cols + c] / s) if s > 0 else 0
    return bytes(out)


def f32_bytes(values):
    return struct.pack("<%df" % len(values), *values)


def bf16_bytes(values):
    return struct.pack("<%dH" % len(values), *[f32_to_bf16_bits(v) for v in values])


def linear_modules(config):
    return ["model.layers.%d.%s" % (l, m) for l in range(config["num_hidden_layers"]) for m in LINEARS]


def make_case(name, src, config, out_dir):
    tensors = {k: ("BF16", shape, raw) for k, (shape, _, raw) in src.items()}
    qconfig = None
    extra_files = {}
    modules = linear_modules(config)
    norm_amax = {}
    for l in range(config["num_hidden_layers"]):
        for norm in ("input_layernorm", "post_attention_layernorm"):
            _, vals, _ = src["model.layers.%d.%s.weight" % (l, norm)]
            norm_amax[(l, norm)] = max(abs(v) for v in vals)

    def static_input_scale(module):
        # A generous bound on |input|: a normed input is at most sqrt(hidden) * max|gain|; the attention
        # output and the MLP product get a fixed bound. Not calibrated (see the module docstring).
        l = int(module.split(".")[2])
        if module.endswith(("q_proj", "k_proj", "v_proj")):
            bound = 4.0 * norm_amax[(l, "input_layernorm")]
        elif module.endswith(("gate_proj", "up_proj")):
            bound = 4.0 * norm_amax[(l, "post_attention_layernorm")]
        else:
            bound = 8.0
        return round_f32(bound / 448.0)

    ignore = ["lm_head"]
    if name == "ct_tensor_static":
        ignore = ["lm_head", "re:.*layers\\.1\\.mlp\\.down_proj$"]
    for module in modules:
        if name == "ct_tensor_static" and module == "model.layers.1.mlp.down_proj":
            continue
        shape, vals, _ = src[module + ".weight"]
        rows, cols = shape
        if name == "ct_channel_dynamic":
            scales = []
            for r in range(rows):
                amax = max(abs(v) for v in vals[r * cols:(r + 1) * cols])
                scales.append(bf16_to_f32(f32_to_bf16_bits(amax / 448.0)))
            tensors[module + ".weight_scale"] = ("BF16", [rows, 1], bf16_bytes(scales))
            q = quantize(vals, rows, cols, lambda r, c: scales[r])
        elif name in ("ct_tensor_static", "modelopt_fp8"):
            scale = round_f32(max(abs(v) for v in vals) / 448.0)
            shape_scale = [1] if name == "ct_tensor_static" else []
            tensors[module + ".weight_scale"] = ("F32", shape_scale, f32_bytes([scale]))
            tensors[module + ".input_scale"] = ("F32", shape_scale, f32_bytes([static_input_scale(module)]))
            q = quantize(vals, rows, cols, lambda r, c: scale)
        else:  # block_fp8
            b = 32
            rb, cb = (rows + b - 1) // b, (cols + b - 1) // b
            scales = []
            for i in range(rb):
                for j in range(cb):
                    amax = max(abs(vals[r * cols + c]) for r in range(i * b, min(rows, i * b + b))
                               for c in range(j * b, min(cols, j * b + b)))
                    scales.append(round_f32(amax / 448.0))
            tensors[module + ".weight_scale_inv"] = ("F32", [rb, cb], f32_bytes(scales))
            q = quantize(vals, rows, cols, lambda r, c: scales[(r // b) * cb + c // b])
        tensors[module + ".weight"] = ("F8_E4M3", [rows, cols], q)

    if name == "ct_channel_dynamic":
        qconfig = {
            "quant_method": "compressed-tensors", "format": "float-quantized",
            "quantization_status": "compressed", "ignore": ignore, "kv_cache_scheme": None,
            "config_groups": {"group_0": {
                "targets": ["Linear"],
                "weights": {"type": "float", "num_bits": 8, "strategy": "channel", "symmetric": True,
                            "dynamic": False, "observer": "minmax"},
                "input_activations": {"type": "float", "num_bits": 8, "strategy": "token", "symmetric": True,
                                      "dynamic": True, "observer": None}}}}
    elif name == "ct_tensor_static":
        qconfig = {
            "quant_method": "compressed-tensors", "format": "float-quantized",
            "quantization_status": "compressed", "ignore": ignore, "kv_cache_scheme": None,
            "config_groups": {"group_0": {
                "targets": ["Linear"],
                "weights": {"type": "float", "num_bits": 8, "strategy": "tensor", "symmetric": True,
                            "dynamic": False, "observer": "minmax"},
                "input_activations": {"type": "float", "num_bits": 8, "strategy": "tensor", "symmetric": True,
                                      "dynamic": False, "observer": "minmax"}}}}
    elif name == "modelopt_fp8":
        qconfig = {"quant_method": "modelopt", "quant_algo": "FP8", "ignore": ignore,
                   "producer": {"name": "modelopt"}}
        extra_files["hf_quant_config.json"] = {
            "producer": {"name": "modelopt"},
            "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": None, "exclude_modules": ignore}}
    else:
        qconfig = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                   "weight_block_size": [32, 32]}

    case_dir = os.path.join(out_dir, name)
    os.makedirs(case_dir, exist_ok=True)
    cfg = dict(config)
    cfg["quantization_config"] = qconfig
    with open(os.path.join(case_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    for file_name, content in extra_files.items():
        with open(os.path.join(case_dir, file_name), "w") as f:
            json.dump(content, f, indent=2)
            f.write("\n")
    write_safetensors(os.path.join(case_dir, "model.safetensors"), tensors)


def make_block128_case(out_dir, seed=128):
    """block_fp8_128: a random tiny Qwen3 quantized in 128x128 blocks (see the module docstring)."""
    import random
    rng = random.Random(seed)
    hidden, heads, kv_heads, head_dim, inter, layers, vocab, b = 256, 2, 1, 128, 384, 2, 256, 128
    config = {
        "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 1, "eos_token_id": 2, "head_dim": head_dim, "hidden_act": "silu",
        "hidden_size": hidden, "initializer_range": 0.02, "intermediate_size": inter,
        "max_position_embeddings": 512, "model_type": "qwen3", "num_attention_heads": heads,
        "num_hidden_layers": layers, "num_key_value_heads": kv_heads, "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "use_cache": True, "vocab_size": vocab,
        "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                "weight_block_size": [b, b]}}

    def uniform(n, bound):
        return [bf16_to_f32(f32_to_bf16_bits(rng.uniform(-bound, bound))) for _ in range(n)]

    def norm(n):
        return [bf16_to_f32(f32_to_bf16_bits(1.0 + rng.uniform(-0.2, 0.2))) for _ in range(n)]

    tensors = {}
    tensors["model.embed_tokens.weight"] = ("BF16", [vocab, hidden], bf16_bytes(uniform(vocab * hidden, 1.0)))
    tensors["lm_head.weight"] = ("BF16", [vocab, hidden], bf16_bytes(uniform(vocab * hidden, 0.2)))
    tensors["model.norm.weight"] = ("BF16", [hidden], bf16_bytes(norm(hidden)))
    shapes = {"self_attn.q_proj": (heads * head_dim, hidden), "self_attn.k_proj": (kv_heads * head_dim, hidden),
              "self_attn.v_proj": (kv_heads * head_dim, hidden), "self_attn.o_proj": (hidden, heads * head_dim),
              "mlp.gate_proj": (inter, hidden), "mlp.up_proj": (inter, hidden), "mlp.down_proj": (hidden, inter)}
    for l in range(layers):
        p = "model.layers.%d." % l
        tensors[p + "input_layernorm.weight"] = ("BF16", [hidden], bf16_bytes(norm(hidden)))
        tensors[p + "post_attention_layernorm.weight"] = ("BF16", [hidden], bf16_bytes(norm(hidden)))
        tensors[p + "self_attn.q_norm.weight"] = ("BF16", [head_dim], bf16_bytes(norm(head_dim)))
        tensors[p + "self_attn.k_norm.weight"] = ("BF16", [head_dim], bf16_bytes(norm(head_dim)))
        for module, (rows, cols) in shapes.items():
            vals = uniform(rows * cols, 0.12)
            rb, cb = rows // b, cols // b
            # Blocks of unlike magnitude (x0.25 ... x2), so a scale read from the wrong block shows.
            factor = [[0.25 * 2 ** rng.randint(0, 3) for _ in range(cb)] for _ in range(rb)]
            vals = [v * factor[(i // cols) // b][(i % cols) // b] for i, v in enumerate(vals)]
            scales = []
            for i in range(rb):
                for j in range(cb):
                    amax = max(abs(vals[r * cols + c]) for r in range(i * b, i * b + b) for c in range(j * b, j * b + b))
                    scales.append(round_f32(amax / 448.0))
            tensors[p + module + ".weight_scale_inv"] = ("F32", [rb, cb], f32_bytes(scales))
            q = quantize(vals, rows, cols, lambda r, c: scales[(r // b) * cb + c // b])
            tensors[p + module + ".weight"] = ("F8_E4M3", [rows, cols], q)
    case_dir = os.path.join(out_dir, "block_fp8_128")
    os.makedirs(case_dir, exist_ok=True)
    with open(os.path.join(case_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    write_safetensors(os.path.join(case_dir, "model.safetensors"), tensors)


def self_check():
    # The encoder against the decoder on every byte (NaN encodings aside) and on halfway points.
    for b in range(256):
        if b & 0x7F == 0x7F:
            continue
        v = e4m3_to_f32(b)
        assert f32_to_e4m3(v) == b or v == 0.0, b
    assert f32_to_e4m3(1000.0) == 0x7E and f32_to_e4m3(-1000.0) == 0xFE
    assert f32_to_e4m3(1.0625) == f32_to_e4m3(1.0)    # halfway between 1 and 1.125: to even
    assert f32_to_e4m3(1.1875) == f32_to_e4m3(1.25)   # halfway between 1.125 and 1.25: to even


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--src", default=SRC)
    parser.add_argument("--out", default=OUT)
    args = parser.parse_args()
    self_check()
    src = read_safetensors(os.path.join(args.src, "model.safetensors"))
    config = json.load(open(os.path.join(args.src, "config.json")))
    for name in ("ct_channel_dynamic", "ct_tensor_static", "modelopt_fp8", "block_fp8"):
        make_case(name, src, config, args.out)
        print("wrote", os.path.join(args.out, name))
    make_block128_case(args.out)
    print("wrote", os.path.join(args.out, "block_fp8_128"))


if __name__ == "__main__":
    main()
