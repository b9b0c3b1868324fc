"""A Llama checkpoint (models/pagoda-tiny's shape) as plain torch, for the CPU checks of tools/train: the
safetensors file read by hand and the forward written out, so they run on Debian's python3-torch without
transformers. load(model_dir) returns (config dict, parameters by tensor name, forward(ids) -> logits)."""
import json, math, struct
import torch, torch.nn.functional as F


def _read_safetensors(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n]); base = 8 + n; out = {}
    for k, v in head.items():
        if k == "__metadata__": continue
        a, b = v["data_offsets"]
        t = torch.frombuffer(bytearray(raw[base + a:base + b]), dtype=torch.bfloat16).reshape(v["shape"])
        out[k] = t.float()
    return out


def load(model_dir):
    cfg = json.load(open(f"{model_dir}/config.json"))
    P = {k: torch.nn.Parameter(v) for k, v in _read_safetensors(f"{model_dir}/model.safetensors").items()}
    H, L, NH, NKV, D = (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"],
                        cfg["num_key_value_heads"], cfg["head_dim"])
    inv = 1.0 / cfg["rope_parameters"]["rope_theta"] ** (torch.arange(0, D, 2).float() / D)

    def rms(x, w): return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w

    def rot(x):
        a, b = x[..., :D // 2], x[..., D // 2:]; return torch.cat([-b, a], -1)

    def forward(ids):
        B, T = ids.shape
        f = torch.outer(torch.arange(T).float(), inv); e = torch.cat([f, f], -1)
        cos, sin = e.cos(), e.sin()
        x = P["model.embed_tokens.weight"][ids]
        mask = torch.full((T, T), float("-inf")).triu(1)
        for l in range(L):
            p = f"model.layers.{l}."
            h = rms(x, P[p + "input_layernorm.weight"])
            q = (h @ P[p + "self_attn.q_proj.weight"].T).view(B, T, NH, D).transpose(1, 2)
            k = (h @ P[p + "self_attn.k_proj.weight"].T).view(B, T, NKV, D).transpose(1, 2)
            v = (h @ P[p + "self_attn.v_proj.weight"].T).view(B, T, NKV, D).transpose(1, 2)
            q, k = q * cos + rot(q) * sin, k * cos + rot(k) * sin
            k = k.repeat_interleave(NH // NKV, 1); v = v.repeat_interleave(NH // NKV, 1)
            a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(D) + mask, -1) @ v
            x = x + a.transpose(1, 2).reshape(B, T, H) @ P[p + "self_attn.o_proj.weight"].T
            h = rms(x, P[p + "post_attention_layernorm.weight"])
            x = x + (F.silu(h @ P[p + "mlp.gate_proj.weight"].T) * (h @ P[p + "mlp.up_proj.weight"].T)) @ P[p + "mlp.down_proj.weight"].T
        return rms(x, P["model.norm.weight"]) @ P["lm_head.weight"].T

    return cfg, P, forward
