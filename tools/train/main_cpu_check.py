#!/usr/bin/env python3
"""Runs train.main() end to end on the CPU in smoke mode with stand-ins for `tokenizers` (a byte-level
BPE over models/pagoda-tiny/tokenizer.json) and `transformers` (a one-layer torch model with the
LlamaForCausalLM call shape): checks the stages' plumbing (recall data, training with recall rows,
perplexity windows, the recall check, the baseline) where the real libraries are missing. The model
and figures it writes mean nothing. Needs torch and regex (Debian: python3-torch python3-regex).

Run: [FULL=1] [INIT=1] [SHORT=1] [GAP=1] [FLAGS='...'] /usr/bin/python3 tools/train/main_cpu_check.py [DATA]  (DATA: extract_text.py's folder,
default .cache/train-data; writes /tmp/main_cpu_check; FULL=1: the default 2,048 context and
recall-check settings with 4 training steps instead of --smoke; INIT=1: --init-from a fake
checkpoint with the real tokenizer files, checking that training starts from its weights and that
tokenizer.json comes out byte for byte)
"""
import json
import os
import shutil
import sys
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
DATA = sys.argv[1] if len(sys.argv) > 1 else ".cache/train-data"
import torch  # noqa: E402
import selftest  # noqa: E402
import train  # noqa: E402

TOK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "models", "pagoda-tiny", "tokenizer.json")

class Enc:
    def __init__(self, ids): self.ids = ids

class FakeTokenizer:
    def __init__(self, path=TOK):
        self.bpe = selftest.MiniBpe(path); self.path = path
        self.special = {t: i for i, t in enumerate(train.SPECIAL_TOKENS)}
    def encode(self, text, add_special_tokens=False):
        # split out special tokens
        import re
        ids = []
        for part in re.split("(" + "|".join(re.escape(t) for t in self.special) + ")", text):
            if part in self.special: ids.append(self.special[part])
            elif part: ids += self.bpe.encode(part)
        return Enc(ids)
    def encode_batch(self, texts, add_special_tokens=False): return [self.encode(t) for t in texts]
    def decode(self, ids, skip_special_tokens=False):
        inv = {v: k for k, v in self.special.items()}
        return "".join(inv[i] if i in inv else self.bpe.decode([i]) for i in ids)
    def token_to_id(self, t): return self.special.get(t, self.bpe.vocab.get(t))
    def get_vocab_size(self): return len(self.bpe.vocab)
    def save(self, path): shutil.copy(self.path, path)
    def to_str(self): return open(self.path).read()
    @classmethod
    def from_file(cls, path): return cls(path)

train.train_tokenizer = lambda texts, vocab: FakeTokenizer()
tk = types.ModuleType("tokenizers"); tk.__version__ = "fake"; tk.Tokenizer = FakeTokenizer
sys.modules["tokenizers"] = tk

class Cfg(types.SimpleNamespace):
    def to_dict(self): return dict(vars(self))

class FakeLlama(torch.nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.embed = torch.nn.Embedding(config.vocab_size, 32)
        self.attn = torch.nn.MultiheadAttention(32, 4, batch_first=True)
        self.head = torch.nn.Linear(32, config.vocab_size)
    def forward(self, input_ids, use_cache=False, attention_mask=None):
        x = self.embed(input_ids); t = input_ids.shape[1]
        assert t <= self.config.max_position_embeddings, (t, self.config.max_position_embeddings)
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool, device=x.device), diagonal=1)
        y, _ = self.attn(x, x, x, attn_mask=mask, need_weights=False)
        return types.SimpleNamespace(logits=self.head(x + y))
    @property
    def dtype(self): return self.head.weight.dtype
    def save_pretrained(self, d):
        torch.save(self.state_dict(), os.path.join(d, "model.pt"))
        json.dump(self.config.to_dict(), open(os.path.join(d, "config.json"), "w"))
        open(os.path.join(d, "generation_config.json"), "w").write("{}")
    def generate(self, input_ids, max_new_tokens, **kw):
        x = input_ids
        for _ in range(max_new_tokens):
            x = torch.cat([x, self(x).logits[:, -1].argmax(-1, keepdim=True)], 1)
        return x

class Auto:
    @staticmethod
    def from_pretrained(d, dtype=None, attn_implementation=None):
        cfg = Cfg(**json.load(open(os.path.join(d, "config.json"))))
        m = FakeLlama(cfg)
        p = os.path.join(d, "model.pt")
        if os.path.exists(p): m.load_state_dict(torch.load(p))
        return m.float()

tf = types.ModuleType("transformers"); tf.__version__ = "fake"
tf.LlamaConfig = lambda **kw: Cfg(**kw)
tf.LlamaForCausalLM = FakeLlama
tf.AutoModelForCausalLM = Auto
sys.modules["transformers"] = tf

# A baseline folder shaped like models/pagoda-tiny (context 1024) with the same tokenizer.
base = "/tmp/main_cpu_check/base"
os.makedirs(base, exist_ok=True)
shutil.copy(TOK, base + "/tokenizer.json")
json.dump({"vocab_size": 4096, "max_position_embeddings": 1024}, open(base + "/config.json", "w"))

# INIT=1: continue a checkpoint (--init-from) shaped like the fake model, with the real tokenizer
# files, and check that its tokenizer and weights are what training started from.
tf.AutoConfig = types.SimpleNamespace(
    from_pretrained=lambda d: Cfg(**json.load(open(os.path.join(d, "config.json")))))
INIT = os.environ.get("INIT") is not None
if INIT:
    init = "/tmp/main_cpu_check/init"
    os.makedirs(init, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(os.path.dirname(TOK), name), init)
    json.dump({"vocab_size": 4096, "max_position_embeddings": 1024,
               "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}},
              open(init + "/config.json", "w"))
    torch.manual_seed(7)
    FakeLlama(Cfg(vocab_size=4096, max_position_embeddings=1024)).save_pretrained(init)
    json.dump({"vocab_size": 4096, "max_position_embeddings": 1024,
               "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}},
              open(init + "/config.json", "w"))
    open(init + "/model.safetensors", "wb").close()  # the fake loader reads model.pt
    INIT_STATE = torch.load(init + "/model.pt")
    seen = []
    real_train = train.train

    def checking_train(args, model, *rest, **kw):
        state = model.state_dict()
        seen.append(all(torch.equal(state[k].cpu(), INIT_STATE[k]) for k in INIT_STATE))
        return real_train(args, model, *rest, **kw)
    train.train = checking_train

SIZE = (["--smoke"] if os.environ.get("FULL") is None else
        ["--max-steps", "4", "--eval-every", "2", "--epochs", "1", "--batch-size", "4",
         "--recall-trials", "2", "--val-tokens", "8192", "--minutes", "30"])
sys.argv = ["train.py", "--data", DATA, "--out", "/tmp/main_cpu_check/out"] + SIZE + [
            "--baseline-model", base]
if INIT:
    sys.argv += ["--init-from", init, "--rope-theta", "40000"]
SHORT = os.environ.get("SHORT") is not None
if SHORT:  # short copy rows trained and monitored (the curriculum's rule: selftest.py)
    sys.argv += ["--short-copy-rows", "4", "--short-copy-lengths", "32,64",
                 "--short-copy-advance", "0.001", "--log-every", "2"]
GAP = os.environ.get("GAP") is not None
if GAP:  # gap rows trained (the curriculum's rule and the rows: selftest.py GapCopyTest)
    gaps = "0,8,16" if os.environ.get("FULL") is None else "0,16,64,256,1024,1750"
    sys.argv += ["--gap-rows", "8", "--gap-gaps", gaps, "--log-every", "2"]
# FLAGS: more train.py flags, e.g. a device variant's exact flags (they come last, so they win).
sys.argv += os.environ.get("FLAGS", "").split()
train.main()
if GAP:
    report = json.load(open("/tmp/main_cpu_check/out/train_report.json"))
    # The stand-ins have no AutoTokenizer and no full config: only those two stages may fail.
    failed = [e["stage"] for e in report.get("errors", [])]
    assert set(failed) <= {"transformers_tokenizer_check", "plot"}, report.get("errors")
    for run in report["training"]["runs"]:
        g = run["gap_rows"]
        assert g and g["gaps"] == [int(x) for x in gaps.split(",")] and g["final_gap"] in g["gaps"], g
        assert run["recall_sequences"]["gap"] > 0, run["recall_sequences"]
    print("gap rows check: OK (trained, recorded in the report)")
if SHORT:
    report = json.load(open("/tmp/main_cpu_check/out/train_report.json"))
    for run in report["training"]["runs"]:
        sc = run["short_copy"]
        assert sc and sc["lengths"] == [32, 64] and sc["final_length"] in (32, 64), sc
        assert run["recall_sequences"]["short_copy"] > 0, run["recall_sequences"]
    monitors = [json.loads(r[8]) for r in report["loss_log"] if r[8]]
    assert monitors and all("short32" in m and "short64" in m for m in monitors), monitors[:2]
    print("short copy rows check: OK (trained and monitored by length)")
if INIT:
    out = "/tmp/main_cpu_check/out/model"
    assert seen and all(seen), f"runs did not start from the checkpoint's weights: {seen}"
    assert open(out + "/tokenizer.json", "rb").read() == open(TOK, "rb").read(), "tokenizer.json changed"
    cfg = json.load(open(out + "/config.json"))
    tok_cfg = json.load(open(out + "/tokenizer_config.json"))
    context = 128 if os.environ.get("FULL") is None else 2048  # --smoke's, else the default
    assert cfg["max_position_embeddings"] == tok_cfg["model_max_length"] == context, (cfg, tok_cfg)
    assert cfg["rope_parameters"]["rope_theta"] == 40000.0, cfg
    report = json.load(open("/tmp/main_cpu_check/out/train_report.json"))
    assert report["init_from"]["max_position_embeddings"] == 1024, report["init_from"]
    assert report["baseline"]["same_tokenizer"], report["baseline"]
    print("init-from check: OK (weights, tokenizer.json verbatim, context, rope theta)")
