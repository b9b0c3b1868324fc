#!/usr/bin/env python3
"""Trains pagoda's bundled model (models/pagoda-tiny) on the GPU machine, in one device call.

Input: the folder written by tools/train/extract_text.py (train.jsonl, heldout.jsonl, chat.jsonl,
heldout_sample.txt). Steps, each logged with elapsed seconds:
  1. a byte-level BPE tokenizer (HF `tokenizers`, Llama-3-style split regex, vocab --vocab-size,
     special tokens <|bos|> <|eos|> <|pad|> <|system|> <|user|> <|assistant|>);
  2. a LlamaForCausalLM with GQA (default: hidden 256, 8 layers, 8 query heads of 32, 2 KV heads,
     ~8M parameters, context 2,048) trained with plain PyTorch: bf16 autocast, AdamW, linear warmup
     then cosine decay, random --context-token crops of the token stream, of which a share
     (--recall-fraction of every batch) are in-context recall sequences (recall_data.py: a word
     list recalled later, or a passage repeated later, at distances up to ~1,800 tokens); the step
     count comes from the wall-time budget (--minutes, measured after a short probe) capped at
     --epochs; every --eval-every steps the held-out loss and a teacher-forced recall accuracy on
     held-out word lists are measured, and the weights kept are those with the best held-out loss
     among the evaluations whose recall reaches --recall-select (else those with the best recall);
  3. export in Hugging Face format, bf16 (save_pretrained), reloaded from disk for every figure below;
  4. held-out perplexity in float32 with the protocol `pagoda eval perplexity` uses: the text file
     is tokenized without special tokens, cut into consecutive non-overlapping windows (of 1,024
     tokens and of --context tokens: both are reported), each window scored from an empty cache,
     every token but a window's first predicted; with --baseline-model, the same figures for that
     model (e.g. the previous models/pagoda-tiny) with its own tokenizer, at its own context;
  4b. the recall check: greedy decoding (float32, eager) after prompts in `pagoda eval recall`'s
     format (docs/EVAL.md) with lists of held-out words placed --recall-depths tokens back in a
     --recall-context-token prompt of held-out filler; recall token accuracy = decoded tokens equal
     to the list's tokens in place, over the list's tokens (goal: >= 0.8 at depths >= 1,000);
  5. greedy continuations of a few prompts in float32 (full recompute per step, eager attention, no
     TF32), with the top-1/top-2 logit margin and top-5 logprobs per step, cross-checked against
     model.generate(); pagoda's reference test compares against these.

Outputs (8 files, the most one device call brings back):
  OUT/model/{config.json, generation_config.json, model.safetensors, tokenizer.json,
             tokenizer_config.json}
  OUT/train_report.json   versions, data, config, training figures, perplexities, greedy outputs,
                          loss log, errors (written after every stage, so a late crash keeps it)
  OUT/loss.csv            step, tokens, lr, train_loss, val_loss, elapsed_s
  OUT/loss_curve.png

Usage: python3 tools/train/train.py --data .cache/train-data --out $OUT --minutes 7 \
           --baseline-model models/pagoda-tiny      (tools/gpu/train_call.sh: one device call)
       (--smoke: a tiny model and a few steps, to check the script end to end in under a minute)
"""

import argparse
import contextlib
import csv
import json
import math
import os
import platform
import random
import sys
import time
import traceback
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import recall_data  # noqa: E402
import short_copy  # noqa: E402
import gap_copy  # noqa: E402

START_TIME = time.time()

SPECIAL_TOKENS = ["<|bos|>", "<|eos|>", "<|pad|>", "<|system|>", "<|user|>", "<|assistant|>"]
BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"

# The Llama 3 pre-tokenizer split: contractions, words with one leading non-letter, numbers of up
# to three digits, punctuation runs, newlines, spaces. PCRE2-compatible (pagoda's tokenizer).
SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
    r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Real newlines (no '\n' escapes inside expressions) keep it within a small Jinja subset.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>\n"
    "{{ message['content'] }}<|eos|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

GREEDY_PROMPTS = [
    ("austen_opening", "It is a truth universally acknowledged, that a single man"),
    ("austen_elizabeth", "Elizabeth could not help"),
    ("austen_emma", "Emma was"),
    ("kjv_genesis", "In the beginning God created"),
    ("kjv_moses", "And the LORD spake unto Moses, saying,"),
]
# Extra teacher-forced monitor depths, logged at every evaluation (not used for selection).
MONITOR_SHORT_DEPTHS = (100, 400)
# Induction probes logged at every evaluation: random spans copied this far back.
COPY_PROBE_DISTANCES = (100, 1000)
COPY_PROBE_SPAN = 24
CHAT_PROMPT = [{"role": "user", "content": "Continue this passage: Mr. Darcy walked into the room."}]


def log(message):
    print(f"[{time.time() - START_TIME:7.1f}s] {message}", flush=True)


# ---------------------------------------------------------------- pure helpers (tested without torch)

def render_chat(messages, add_generation_prompt=False):
    """The Python twin of CHAT_TEMPLATE (the training data is rendered with this)."""
    text = BOS
    for message in messages:
        text += f"<|{message['role']}|>\n{message['content']}{EOS}\n"
    if add_generation_prompt:
        text += "<|assistant|>\n"
    return text


def make_windows(ids, window):
    """Consecutive non-overlapping windows of `window` tokens; a last window shorter than 2 tokens
    predicts nothing and is dropped. Each window predicts len(window) - 1 tokens."""
    if window < 2:
        raise ValueError(f"window must be at least 2 tokens, got {window}")
    windows = [ids[i:i + window] for i in range(0, len(ids), window)]
    return [w for w in windows if len(w) >= 2]


def learning_rate(step, total_steps, peak, warmup, min_ratio):
    """Linear warmup to `peak`, then cosine decay to peak * min_ratio at total_steps."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
    return peak * (min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress)))


def step_learning_rate(args, step, total_steps):
    """The learning rate of step `step` of `total_steps` (copy warm-up steps included). Without
    --restart-schedule: one warm-up and cosine over all steps. With it: the copy warm-up holds
    --copy-warmup-lr (after the linear warm-up), and the language-model schedule restarts its own
    warm-up and cosine after it, so the warm-up costs no language-model learning rate."""
    warm = args.copy_warmup_steps
    if not args.restart_schedule or not warm:
        return learning_rate(step, total_steps, args.lr, args.warmup, args.min_lr_ratio)
    if step < warm:
        peak = args.copy_warmup_lr or args.lr
        return peak * min(1.0, (step + 1) / max(1, args.warmup))
    return learning_rate(step - warm, total_steps - warm, args.lr, args.warmup,
                         args.min_lr_ratio)


def load_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


class Report:
    """train_report.json, rewritten after every stage."""

    def __init__(self, path):
        self.path = path
        self.data = {"status": "running", "errors": []}

    def __setitem__(self, key, value):
        self.data[key] = value
        self.save()

    def __getitem__(self, key):
        return self.data[key]

    def save(self):
        self.data["elapsed_s"] = round(time.time() - START_TIME, 1)
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.data, f, indent=1, default=str)
        os.replace(tmp, self.path)

    @contextlib.contextmanager
    def stage(self, name, fatal):
        log(f"stage: {name}")
        try:
            yield
        except Exception as error:  # noqa: BLE001 - recorded, then re-raised when fatal
            trace = traceback.format_exc()
            print(trace, file=sys.stderr, flush=True)
            self.data["errors"].append({"stage": name, "error": repr(error), "trace": trace[-3000:]})
            self.save()
            if fatal:
                self.data["status"] = f"failed in stage '{name}'"
                self.save()
                raise


# ---------------------------------------------------------------- tokenizer

def train_tokenizer(texts, vocab_size):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2, show_progress=False,
        special_tokens=SPECIAL_TOKENS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())

    def chunks():
        for text in texts:
            for start in range(0, len(text), 100_000):
                yield text[start:start + 100_000]

    tokenizer.train_from_iterator(chunks(), trainer=trainer)
    for token in SPECIAL_TOKENS:
        if tokenizer.token_to_id(token) is None:
            raise RuntimeError(f"special token {token} missing from the trained vocabulary")
    return tokenizer


def encode_all(tokenizer, texts):
    return [e.ids for e in tokenizer.encode_batch(texts, add_special_tokens=False)]


def tokenizer_config(context):
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": context,
        "chat_template": CHAT_TEMPLATE,
    }


INIT_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def check_init_dir(path):
    """Raises ValueError naming the first file an --init-from checkpoint lacks."""
    for name in INIT_FILES:
        if not os.path.isfile(os.path.join(path, name)):
            raise ValueError(f"--init-from {path}: no {name}")


def init_tokenizer_files(src_dir, dst_dir, context):
    """Continued training keeps the checkpoint's tokenizer: tokenizer.json is copied byte for byte
    (token ids must not change), tokenizer_config.json with only model_max_length set to
    `context`. Returns the tokenizer config written."""
    import shutil

    shutil.copyfile(os.path.join(src_dir, "tokenizer.json"), os.path.join(dst_dir, "tokenizer.json"))
    with open(os.path.join(src_dir, "tokenizer_config.json"), encoding="utf-8") as f:
        config = json.load(f)
    config["model_max_length"] = context
    with open(os.path.join(dst_dir, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=2)
    return config


def apply_init_weights(model, state):
    """Loads a checkpoint's state dict into `model` (cast to the model's dtypes). Every tensor of
    the model must be in `state` with the same shape and `state` must hold nothing else; else a
    ValueError names the first mismatch (a checkpoint of another shape is never half-loaded)."""
    own = model.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    if missing or unexpected:
        raise ValueError(f"--init-from: checkpoint lacks {missing[:3]} / has extra {unexpected[:3]}")
    for name, tensor in own.items():
        if tuple(tensor.shape) != tuple(state[name].shape):
            raise ValueError(f"--init-from: {name} has shape {tuple(state[name].shape)}, the model "
                             f"{tuple(tensor.shape)}")
    model.load_state_dict(state, strict=True)


def file_sha256(path):
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def set_rope_theta(config, theta):
    """Sets RoPE theta in either transformers spelling (5: rope_parameters, 4: rope_theta)."""
    params = getattr(config, "rope_parameters", None)
    if isinstance(params, dict):
        config.rope_parameters = dict(params, rope_theta=float(theta))
    else:
        config.rope_theta = float(theta)


# ---------------------------------------------------------------- model evaluation

def score_text(model, ids, window, device, batch_size, autocast_dtype=None):
    """(perplexity, predicted tokens, mean nll) over make_windows(ids, window)."""
    import torch

    windows = make_windows(ids, window)
    if not windows:
        raise ValueError("text too short to score")
    full = [w for w in windows if len(w) == window]
    groups = [full[i:i + batch_size] for i in range(0, len(full), batch_size)]
    groups += [[w] for w in windows if len(w) != window]
    nll, count = 0.0, 0
    with torch.no_grad():
        for group in groups:
            x = torch.tensor(group, device=device, dtype=torch.long)
            ctx = (torch.autocast(device_type=device.type, dtype=autocast_dtype)
                   if autocast_dtype is not None else contextlib.nullcontext())
            with ctx:
                logits = model(input_ids=x, use_cache=False).logits
            logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
            target = x[:, 1:]
            nll -= logp.gather(-1, target.unsqueeze(-1)).double().sum().item()
            count += target.numel()
    return math.exp(nll / count), count, nll / count


def greedy_continuation(model, prompt_ids, max_new_tokens, eos_id, device):
    """Greedy decoding by full recompute: (new ids, top1-top2 logit margins, top-5 logprobs)."""
    import torch

    ids, new, margins, top5 = list(prompt_ids), [], [], []
    with torch.no_grad():
        for _ in range(max_new_tokens):
            x = torch.tensor([ids], device=device, dtype=torch.long)
            logits = model(input_ids=x, use_cache=False).logits[0, -1].float()
            best = torch.topk(logits, 5)
            logprobs = torch.log_softmax(logits, dim=-1)
            token = int(best.indices[0])
            margins.append(round(float(best.values[0] - best.values[1]), 6))
            top5.append([[int(i), round(float(logprobs[i]), 6)] for i in best.indices])
            new.append(token)
            ids.append(token)
            if token == eos_id:
                break
    return new, margins, top5


def _recall_batches(trials, batch_size):
    return [trials[i:i + batch_size] for i in range(0, len(trials), batch_size)]


def teacher_forced_recall(model, trials, device, batch_size=16, autocast_dtype=None,
                          by_depth=None):
    """Share of list tokens that are the argmax after the prompt and the list's earlier tokens
    (one forward per batch: the cheap monitor used while training). by_depth, when a dict, gets
    [hits, tokens] per trial depth."""
    import torch

    hits, total = 0, 0
    with torch.no_grad():
        for group in _recall_batches(trials, batch_size):
            prompt_len = len(group[0]["prompt"])
            longest = max(len(t["expected"]) for t in group)
            rows = [t["prompt"] + t["expected"] + [0] * (longest - len(t["expected"]))
                    for t in group]
            x = torch.tensor(rows, device=device, dtype=torch.long)
            ctx = (torch.autocast(device_type=device.type, dtype=autocast_dtype)
                   if autocast_dtype is not None else contextlib.nullcontext())
            with ctx:
                logits = model(input_ids=x, use_cache=False).logits
            predicted = logits[:, prompt_len - 1:prompt_len - 1 + longest].argmax(-1).tolist()
            for trial, row in zip(group, predicted):
                h, n = recall_data.in_place_accuracy(trial["expected"], row)
                hits, total = hits + h, total + n
                if by_depth is not None:
                    d = by_depth.setdefault(trial["depth"], [0, 0])
                    d[0], d[1] = d[0] + h, d[1] + n
    return hits / max(1, total)


def list_accuracy_standard_error(rows):
    """Standard error of the mean per-list token accuracy over greedy_recall's rows: the spread a
    recall figure carries from the lists drawn (a derailed list loses most of its tokens at once,
    so lists, not tokens, are the independent draws)."""
    accuracies = [r["hits"] / max(1, len(r["expected"])) for r in rows]
    if len(accuracies) < 2:
        return 0.0
    mean = sum(accuracies) / len(accuracies)
    variance = sum((a - mean) ** 2 for a in accuracies) / (len(accuracies) - 1)
    return (variance / len(accuracies)) ** 0.5


def greedy_recall(model, trials, device, batch_size=16):
    """pagoda eval recall's measure: greedy decoding (full recompute) of as many tokens as the
    list has; returns (token accuracy, accuracy by depth, per-trial rows)."""
    import torch

    by_depth, rows = {}, []
    with torch.no_grad():
        for group in _recall_batches(trials, batch_size):
            x = torch.tensor([t["prompt"] for t in group], device=device, dtype=torch.long)
            steps = max(len(t["expected"]) for t in group)
            produced = []
            for _ in range(steps):
                token = model(input_ids=x, use_cache=False).logits[:, -1].float().argmax(-1)
                produced.append(token)
                x = torch.cat([x, token[:, None]], dim=1)
            produced = torch.stack(produced, dim=1).tolist()
            for trial, out in zip(group, produced):
                out = out[:len(trial["expected"])]
                h, n = recall_data.in_place_accuracy(trial["expected"], out)
                d = by_depth.setdefault(trial["depth"], [0, 0])
                d[0], d[1] = d[0] + h, d[1] + n
                rows.append({"depth": trial["depth"], "words": trial["words"],
                             "expected": trial["expected"], "produced": out, "hits": h})
    hits = sum(v[0] for v in by_depth.values())
    total = sum(v[1] for v in by_depth.values())
    return (hits / max(1, total),
            {str(k): round(v[0] / max(1, v[1]), 4) for k, v in sorted(by_depth.items())}, rows)


# ---------------------------------------------------------------- training

def set_float32_matmul_precision(torch, precision):
    try:
        torch.set_float32_matmul_precision(precision)
    except Exception as error:  # noqa: BLE001 - a speed/precision knob, never worth a crash
        log(f"set_float32_matmul_precision({precision}) failed: {error!r}")


def build_config(args, vocab_size, special_ids):
    from transformers import LlamaConfig

    common = dict(
        vocab_size=vocab_size, hidden_size=args.hidden, intermediate_size=args.intermediate,
        num_hidden_layers=args.layers, num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads, head_dim=args.head_dim, max_position_embeddings=args.context,
        rms_norm_eps=1e-5, hidden_act="silu", tie_word_embeddings=False,
        attention_bias=False, mlp_bias=False, initializer_range=0.02,
        bos_token_id=special_ids[BOS], eos_token_id=special_ids[EOS],
        pad_token_id=special_ids[PAD])
    try:  # transformers 5 spelling
        config = LlamaConfig(**common, rope_parameters={"rope_type": "default",
                                                       "rope_theta": args.rope_theta or 10000.0})
        if getattr(config, "rope_parameters", None) is None:
            raise TypeError("no rope_parameters")
    except TypeError:  # transformers 4 spelling
        config = LlamaConfig(**common, rope_theta=args.rope_theta or 10000.0)
    return config


def self_sampled_inputs(read, predicted, mask, share, generator):
    """Scheduled sampling for the gap rows (--gap-self-share): read [rows, L] is what the model
    reads, predicted [rows, L] its greedy prediction of each target (predicted[:, k] guesses the
    token read at k + 1), mask [rows, L] the copyable targets. Each inner copy token read[:, k]
    (mask[:, k - 1] and mask[:, k], as the corruption of gap_copy.GapRows.inputs) is replaced with
    probability share by predicted[:, k - 1], the model's own guess for it, so the copy trains on
    its own errors (greedy recall derails where teacher-forced recall does not); where the guess
    is right nothing changes. The targets stay the true tokens. Returns a new tensor."""
    import torch
    inner = mask[:, :-1] & mask[:, 1:]
    draw = torch.rand(inner.shape, generator=generator, device=inner.device) < share
    out = read.clone()
    out[:, 1:] = torch.where(inner & draw, predicted[:, :-1], read[:, 1:])
    return out


def train(args, model, train_ids, heldout_ids, device, max_epochs, deadline, run_name,
          recall_source=None, recall_monitor=None, copy_monitor=None, copy_pool=None,
          short_monitor=None, gap_rows=None):
    """recall_source: a recall_data.RecallSequences (or None: plain crops only); recall_monitor:
    held-out recall trials scored teacher-forced at every evaluation (or None); copy_monitor:
    recall_data.copy_trials scored the same way and logged (or None); copy_pool: token ids, most
    frequent first, for the copy warm-up (needed when args.copy_warmup_steps > 0 or
    args.short_copy_rows > 0); short_monitor: short_copy.monitor_rows, scored at every evaluation;
    gap_rows: a gap_copy.GapRows (--gap-rows) whose rows are trained in a forward of their own."""
    import torch
    import torch.nn.functional as F

    context, batch = args.context, args.batch_size
    stream = torch.tensor(train_ids, dtype=torch.long, device=device)
    if stream.numel() < context + 2:
        raise RuntimeError(f"training stream has only {stream.numel()} tokens")
    heldout_eval = heldout_ids[: args.val_tokens]

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": args.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    try:
        optimizer = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), eps=1e-8,
                                      fused=device.type == "cuda")
    except (TypeError, RuntimeError):
        optimizer = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), eps=1e-8)

    step_model = model
    if args.compile:
        try:
            step_model = torch.compile(model)
        except Exception as error:  # noqa: BLE001 - eager still works
            log(f"torch.compile failed, training eagerly: {error!r}")
            step_model = model

    generator = torch.Generator(device=device)
    generator.manual_seed(args.seed)
    # Its own generator, so the rest of the run draws exactly as without --gap-self-share.
    self_generator = torch.Generator(device=device)
    self_generator.manual_seed(args.seed + 7)
    offsets_arange = torch.arange(context + 1, device=device)
    tokens_per_step = batch * context
    steps_per_epoch = stream.numel() / tokens_per_step
    epoch_cap = max(1, math.ceil(max_epochs * steps_per_epoch))
    total_steps = min(epoch_cap, args.max_steps) if args.max_steps > 0 else epoch_cap
    # The copy warm-up's steps come on top of the epoch cap: their rows hold no training text.
    warm = args.copy_warmup_steps
    if (warm or args.copy_rows) and not copy_pool:
        raise ValueError("the copy warm-up and --copy-rows need copy_pool")
    total_steps += warm
    warm_rng = random.Random(args.seed + 6)
    autocast = (torch.autocast(device_type=device.type, dtype=torch.bfloat16)
                if args.autocast else contextlib.nullcontext())

    kinds = {k: 0 for k in recall_data.KINDS + ("tiled", "short_copy", "gap")}
    curriculum = None
    if args.short_copy_rows:
        if not copy_pool:
            raise ValueError("--short-copy-rows needs copy_pool")
        curriculum = short_copy.Curriculum(args.short_copy_length_list, args.short_copy_rows,
                                           args.short_copy_advance, copy_pool,
                                           args.short_copy_alphabet, args.seed + 7)
    copy_loss = copy_acc = gap_loss = gap_acc = None
    # The curriculum's last distance: the flag, not the source's current value (an earlier run
    # may have left it part way).
    max_depth_end = args.recall_max_depth

    def evaluate():
        model.eval()
        dtype = torch.bfloat16 if args.autocast else None
        _, _, nll = score_text(model, heldout_eval, context, device, 16, dtype)
        recall, short = None, {}
        if recall_monitor:
            # Selection uses the check's depths; shorter monitor depths (where copying forms
            # first) are only logged.
            counts = {}
            teacher_forced_recall(model, recall_monitor, device, 16, dtype, counts)
            chosen = [v for d, v in counts.items() if d in args.recall_depth_list] or list(
                counts.values())
            recall = sum(v[0] for v in chosen) / max(1, sum(v[1] for v in chosen))
            short = {d: round(v[0] / max(1, v[1]), 3) for d, v in sorted(counts.items())
                     if d not in args.recall_depth_list}
            # Greedy recall (the goal's measure) on one batch of the deep trials: copying can
            # show teacher-forced long before greedy decoding reproduces a whole list.
            deep = [t for t in recall_monitor if t["depth"] in args.recall_depth_list][:16]
            ctx = (torch.autocast(device_type=device.type, dtype=dtype) if dtype is not None
                   else contextlib.nullcontext())
            with ctx:
                short["greedy"] = round(greedy_recall(model, deep, device)[0], 3)
        if short_monitor:
            # Copy accuracy of held-out short tiled rows, by row length (the curriculum's lengths).
            for length, (ids, mask) in short_monitor.items():
                hits = total = 0
                for i in range(0, len(ids), 16):
                    chunk = torch.tensor(ids[i:i + 16], dtype=torch.long, device=device)
                    m = torch.tensor(mask[i:i + 16], dtype=torch.bool, device=device)
                    with torch.no_grad(), (torch.autocast(device_type=device.type, dtype=dtype)
                                           if dtype is not None else contextlib.nullcontext()):
                        logits = model(input_ids=chunk[:, :-1], use_cache=False).logits
                    hits += int(((logits.argmax(-1) == chunk[:, 1:]) & m).sum())
                    total += int(m.sum())
                short[f"short{length}"] = round(hits / max(1, total), 3)
        if copy_monitor:
            counts = {}
            teacher_forced_recall(model, copy_monitor, device, 16, dtype, counts)
            short.update({f"copy{d}": round(v[0] / max(1, v[1]), 3)
                          for d, v in sorted(counts.items())})
        model.train()
        return nll, recall, short

    def selection_key(val_loss, recall):
        # Best held-out loss among evaluations whose recall reaches the bar, else best recall.
        if recall is None or recall >= args.recall_select:
            return (1, -val_loss)
        return (0, recall, -val_loss)

    def keep_if_best(val_loss, recall):
        nonlocal best
        key = selection_key(val_loss, recall)
        if best["state"] is None or key > best["key"]:
            best = {"val_loss": val_loss, "recall": recall, "step": step, "key": key,
                    "state": {k: v.detach().clone() for k, v in model.state_dict().items()}}

    log_rows, best = [], {"val_loss": float("inf"), "recall": None, "step": -1, "state": None,
                          "key": None}
    probe_steps, probe_start, probe = min(30, total_steps), None, None
    model.train()
    step, smoothed, stop_reason = 0, None, "step budget reached"
    while step < total_steps:
        if step == 5:
            if device.type == "cuda":
                torch.cuda.synchronize()
            probe_start = time.time()
        if step == probe_steps and probe_start is not None:
            if device.type == "cuda":
                torch.cuda.synchronize()
            step_time = (time.time() - probe_start) / (probe_steps - 5)
            # Evaluations cost about a few steps each; keep 10% slack on top.
            affordable = int((deadline - time.time()) / (step_time * 1.1)) + step
            planned = min(total_steps, max(step + 1, affordable))
            log(f"{run_name} probe: {step_time * 1000:.1f} ms/step, "
                f"{tokens_per_step / step_time:,.0f} tok/s; planning {planned} steps "
                f"(epoch cap {epoch_cap})")
            probe = {"ms_per_step": round(step_time * 1000, 2),
                     "tokens_per_s": round(tokens_per_step / step_time),
                     "planned_steps": planned, "epoch_cap_steps": epoch_cap}
            total_steps = planned
            if planned <= warm:
                log(f"{run_name}: the time budget ends within the copy warm-up ({warm} steps): "
                    f"no language-model steps will run")
        if time.time() > deadline:
            stop_reason = "time budget reached"
            break
        lr = step_learning_rate(args, step, total_steps)
        for group in optimizer.param_groups:
            group["lr"] = lr
        recall_rows, depth = recall_schedule(args, max(0, step - warm), total_steps - warm,
                                             max_depth_end, recall_source is not None)
        if step < warm:
            recall_rows = 0
            rows = [recall_data.tiled_row(warm_rng, context + 1, pool, 4, high)[0]
                    for pool, high in [copy_warmup_stage(args, step, copy_pool, context)]
                    for _ in range(batch)]
            kinds["tiled"] += batch
            chunk = torch.tensor(rows, dtype=torch.long).to(device)
        else:
            if recall_rows:
                recall_source.max_depth = depth
            # Tiled rows kept in the language-model schedule, so the copy mechanism the
            # warm-up formed keeps its dense signal (periods up to half the context).
            tiled = min(args.copy_rows, batch - recall_rows)
            starts = torch.randint(0, stream.numel() - context - 1,
                                   (batch - recall_rows - tiled,), device=device,
                                   generator=generator)
            chunk = stream[starts[:, None] + offsets_arange[None, :]]
            if tiled:
                rows = [recall_data.tiled_row(warm_rng, context + 1, copy_pool, 4,
                                              context // 2)[0] for _ in range(tiled)]
                kinds["tiled"] += tiled
                chunk = torch.cat([chunk, torch.tensor(rows, dtype=torch.long).to(device)])
        if recall_rows:
            made = [recall_source.next() for _ in range(recall_rows)]
            for _, info in made:
                kinds[info["kind"]] += 1
            extra = torch.tensor([ids for ids, _ in made], dtype=torch.long)
            if device.type == "cuda":  # pinned: the copy does not wait for the queued step
                extra = extra.pin_memory()
            extra = extra.to(device, non_blocking=True)
            chunk = torch.cat([chunk, extra], dim=0)
        x, y = chunk[:, :-1], chunk[:, 1:]
        with autocast:
            logits = step_model(input_ids=x, use_cache=False).logits
        loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), y.reshape(-1))
        total_loss = loss
        def extra_forward(ids, mask, inputs=None):
            # A second forward over extra rows (short copy or gap rows): per-target losses and the
            # greedy accuracy on the masked (copyable) targets. inputs: what the model reads when
            # it differs from ids[:-1] (gap rows with --gap-corrupt-share).
            rows = torch.tensor(ids, dtype=torch.long).to(device)
            row_mask = torch.tensor(mask, dtype=torch.bool).to(device)
            read = rows[:, :-1] if inputs is None else (
                inputs if torch.is_tensor(inputs) else torch.tensor(inputs, dtype=torch.long).to(device))
            with autocast:
                row_logits = step_model(input_ids=read, use_cache=False).logits
            per_target = F.cross_entropy(row_logits.float().reshape(-1, row_logits.size(-1)),
                                         rows[:, 1:].reshape(-1), reduction="none")
            accuracy = short_copy.masked_accuracy(row_logits.detach(), rows[:, 1:], row_mask)
            return per_target, row_mask, accuracy

        if curriculum is not None:
            # Short copy rows: a second forward at the curriculum's current length, summed into
            # the loss (their copy signal is not diluted over 2,048 positions).
            ids, mask = curriculum.batch()
            kinds["short_copy"] += len(ids)
            per_target, _, copy_acc = extra_forward(ids, mask)
            copy_loss = per_target.mean()
            total_loss = loss + args.short_copy_weight * copy_loss
        if gap_rows is not None:
            # Gap rows: segments copied across text; the loss is on the copyable targets only
            # (their text is ordinary training text, already in the text rows).
            ids, mask, inputs, cues = gap_rows.batch_with_cues()
            kinds["gap"] += len(ids)
            if args.gap_self_share > 0:
                # Scheduled sampling: a no-grad forward over the rows as read, then some inner copy
                # tokens read as the model's own greedy guesses (self_sampled_inputs).
                read_t = torch.tensor(inputs, dtype=torch.long).to(device)
                with torch.no_grad(), autocast:
                    guesses = step_model(input_ids=read_t, use_cache=False).logits.argmax(-1)
                inputs = self_sampled_inputs(read_t, guesses, torch.tensor(mask, dtype=torch.bool).to(device),
                                             args.gap_self_share, self_generator)
            per_target, gap_mask, gap_acc = extra_forward(ids, mask, inputs)
            weights = gap_mask.float()
            if args.gap_cue_weight != 1.0:  # each list copy's first recalled token (gap_copy.py)
                for row, row_cues in enumerate(cues):
                    weights[row, row_cues] = args.gap_cue_weight
            flat = weights.reshape(-1)
            gap_loss = (per_target * flat).sum() / flat.sum().clamp(min=1)
            total_loss = total_loss + args.gap_weight * gap_loss
        total_loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1

        val_loss = None
        last = step == total_steps
        if step % args.log_every == 0 or step % args.eval_every == 0 or last:
            loss_value = loss.item()
            if not math.isfinite(loss_value):
                raise RuntimeError(f"training loss is {loss_value} at step {step}")
            smoothed = loss_value if smoothed is None else 0.9 * smoothed + 0.1 * loss_value
            recall = None
            copy_note = ""
            if curriculum is not None:
                acc_value, length = float(copy_acc), curriculum.length
                copy_note = (f" short copy L{length} loss {float(copy_loss):.3f} acc "
                             f"{acc_value:.3f}")
                if curriculum.observe(acc_value, step):
                    log(f"{run_name} step {step}: short copy rows {length} -> "
                        f"{curriculum.length} tokens (train copy accuracy {acc_value:.3f})")
            if gap_rows is not None:
                acc_value, gap_now = float(gap_acc), gap_rows.gap
                copy_note += (f" gap G{gap_now} L{gap_rows.length} loss {float(gap_loss):.3f} "
                              f"acc {acc_value:.3f}")
                if gap_rows.observe(acc_value, step):
                    log(f"{run_name} step {step}: gap rows G{gap_now} -> G{gap_rows.gap} "
                        f"(rows of {gap_rows.length} tokens, list share "
                        f"{gap_rows.list_fraction():.2f}; train copy accuracy {acc_value:.3f})")
            if copy_note and step % args.eval_every and not last:
                log(f"{run_name} step {step}/{total_steps} loss {loss_value:.4f}{copy_note}")
            if step % args.eval_every == 0 or last:
                val_loss, recall, short = evaluate()
                if step > warm:  # warm-up weights are no language model yet
                    keep_if_best(val_loss, recall)
                log(f"{run_name} step {step}/{total_steps} lr {lr:.2e} loss {loss_value:.4f} "
                    f"val {val_loss:.4f} (ppl {math.exp(val_loss):.2f}) recall(tf) {recall} "
                    f"monitors {short}{copy_note} "
                    f"epoch {step / steps_per_epoch:.2f} recall rows {recall_rows} "
                    f"max depth {depth}")
            log_rows.append([run_name, step, step * tokens_per_step, lr, round(loss_value, 5),
                             None if val_loss is None else round(val_loss, 5),
                             round(time.time() - START_TIME, 1),
                             None if recall is None else round(recall, 4),
                             json.dumps(short) if val_loss is not None and short else None])

    if best["state"] is None or (log_rows and log_rows[-1][5] is None):
        # The loop ended without a fresh evaluation (time budget): evaluate the last weights too.
        val_loss, recall, short = evaluate()
        keep_if_best(val_loss, recall)
        log_rows.append([run_name, step, step * tokens_per_step, None, None, round(val_loss, 5),
                         round(time.time() - START_TIME, 1),
                         None if recall is None else round(recall, 4), None])
    model.load_state_dict(best["state"])
    summary = {
        "run": run_name, "max_epochs": max_epochs, "probe": probe, "steps": step, "stop_reason": stop_reason, "tokens_per_step": tokens_per_step,
        "tokens_seen": step * tokens_per_step, "epochs": round(step / steps_per_epoch, 3),
        "best_step": best["step"], "best_val_loss": round(best["val_loss"], 5),
        "best_val_perplexity_bf16": round(math.exp(best["val_loss"]), 4),
        "best_recall_teacher_forced": best["recall"], "selection_key": list(best["key"]),
        "recall_rows_per_step": recall_schedule(args, 0, total_steps, max_depth_end,
                                                recall_source is not None)[0],
        "recall_rows_last_step": recall_rows if step else 0, "recall_sequences": kinds,
        "short_copy": None if curriculum is None else {
            "lengths": curriculum.lengths, "final_length": curriculum.length,
            "advances": curriculum.history},
        "gap_rows": None if gap_rows is None else {
            "gaps": gap_rows.gaps, "lengths": gap_rows.lengths, "final_gap": gap_rows.gap,
            "list_share": gap_rows.list_share, "advances": gap_rows.history},
        "val_tokens": len(heldout_eval),
        "wall_s": round(time.time() - START_TIME, 1),
    }
    return summary, log_rows


def copy_warmup_stage(args, step, pool, context):
    """(pool, longest period) for copy warm-up step `step`: the tiled rows draw from the
    args.copy_warmup_alphabet most frequent tokens at first (0: the whole pool throughout),
    growing linearly to the whole pool, and their longest period grows from 32 to half the
    context (short periods: many copies per row, the densest signal; the growth carries the
    mechanism to longer distances)."""
    progress = step / max(1, args.copy_warmup_steps)
    start = args.copy_warmup_alphabet or len(pool)
    size = min(len(pool), int(start + (len(pool) - start) * progress))
    high = int(32 + (context // 2 - 32) * progress)
    return pool[:max(1, size)], max(8, high)


def recall_schedule(args, step, total_steps, max_depth_end, enabled):
    """(recall rows in this step's batch, longest recall distance for them). Over the first
    args.curriculum of the steps, the recall share falls linearly from args.recall_fraction_start
    to args.recall_fraction and the distance grows from args.curriculum_start_depth to
    max_depth_end; after that (or with curriculum 0) both hold their final values."""
    if not enabled:
        return 0, max_depth_end
    span = args.curriculum * total_steps
    progress = min(1.0, step / span) if span > 0 else 1.0
    start = args.recall_fraction if args.recall_fraction_start is None else args.recall_fraction_start
    fraction = start + (args.recall_fraction - start) * progress
    rows = 0
    if fraction > 0:
        rows = min(args.batch_size, max(1, round(fraction * args.batch_size)))
    low = min(args.curriculum_start_depth, max_depth_end)
    depth = int(round(low + (max_depth_end - low) * progress))
    return rows, depth


def parse_kinds(text):
    """'list=1,passage=1,random=2' -> {kind: weight}; raises ValueError naming the bad part."""
    weights = {}
    for part in text.split(","):
        name, _, value = part.partition("=")
        name = name.strip()
        if name not in recall_data.KINDS:
            raise ValueError(f"unknown kind '{name}' (known: {', '.join(recall_data.KINDS)})")
        weights[name] = float(value)
        if weights[name] < 0:
            raise ValueError(f"weight of '{name}' is negative")
    if sum(weights.values()) <= 0:
        raise ValueError("all weights are 0")
    return weights


def write_loss_csv(path, rows):
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["run", "step", "tokens", "lr", "train_loss", "val_loss", "elapsed_s",
                         "recall_teacher_forced", "monitors_teacher_forced"])
        for row in rows:
            writer.writerow(["" if v is None else v for v in row])


def plot_loss(path, rows, title, chosen_run):
    """Train and held-out loss of every run; the chosen run drawn bold."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.2), dpi=110)
    runs = list(dict.fromkeys(r[0] for r in rows))
    for index, run in enumerate(runs):
        chosen = run == chosen_run
        color = f"C{index}"
        train = [(r[2] / 1e6, r[4]) for r in rows if r[0] == run and r[4] is not None]
        val = [(r[2] / 1e6, r[5]) for r in rows if r[0] == run and r[5] is not None]
        suffix = " (chosen)" if chosen else ""
        if train:
            ax.plot(*zip(*train), color=color, linewidth=1.2 if chosen else 0.6,
                    alpha=0.9 if chosen else 0.35, label=f"{run} train{suffix}")
        if val:
            ax.plot(*zip(*val), "o--", color=color, markersize=3 if chosen else 2,
                    linewidth=1.2 if chosen else 0.6, alpha=1.0 if chosen else 0.5,
                    label=f"{run} held-out{suffix}")
    ax.set_xlabel("training tokens (millions)")
    ax.set_ylabel("cross-entropy (nats / token)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


# ---------------------------------------------------------------- main

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True, help="folder written by extract_text.py")
    p.add_argument("--out", required=True)
    p.add_argument("--minutes", type=float, default=7.0, help="wall-time budget of the whole run")
    p.add_argument("--reserve-seconds", type=float, default=75.0,
                   help="kept back from --minutes for export, evaluation and references")
    p.add_argument("--init-from", default="",
                   help="continue training a Hugging Face Llama checkpoint (e.g. models/pagoda-tiny): "
                        "its config, weights and tokenizer files (copied verbatim, ids unchanged); "
                        "the context becomes --context; --vocab-size and the shape flags are ignored")
    p.add_argument("--rope-theta", type=float, default=0.0,
                   help="RoPE theta (0: the --init-from checkpoint's, else 10,000)")
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=0,
                   help="dims a head (0: --hidden / --heads); q_proj is then --hidden x heads x head_dim")
    p.add_argument("--intermediate", type=int, default=768)
    p.add_argument("--context", type=int, default=2048)
    p.add_argument("--recall-fraction", type=float, default=0.375,
                   help="share of every batch that is in-context recall sequences (0: none)")
    p.add_argument("--recall-fraction-start", type=float, default=None,
                   help="recall share at the first step, moving linearly to --recall-fraction "
                        "over the curriculum (default: --recall-fraction throughout)")
    p.add_argument("--recall-kinds", default="list=1,passage=1",
                   help="weights of the recall sequence kinds (recall_data.KINDS): list, passage "
                        "(training text repeated), random (random tokens repeated)")
    p.add_argument("--curriculum", type=float, default=0.0,
                   help="share of the steps over which the recall distance grows from "
                        "--curriculum-start-depth to --recall-max-depth (0: no curriculum)")
    p.add_argument("--curriculum-start-depth", type=int, default=200,
                   help="longest recall distance at the first step of the curriculum")
    p.add_argument("--gap-rows", type=int, default=0,
                   help="gap rows per step at the first stage (tools/train/gap_copy.py: segments "
                        "copied across training text, the gap growing as copy accuracy passes "
                        "--gap-advance; 0: none)")
    p.add_argument("--gap-gaps", default="0,16,64,256,1024,1750",
                   help="the gap curriculum's stages (tokens between a segment and its copy)")
    p.add_argument("--gap-advance", type=float, default=0.5,
                   help="training copy accuracy of the gap rows that moves to the next gap")
    p.add_argument("--gap-weight", type=float, default=1.0,
                   help="weight of the gap rows' loss in the sum")
    p.add_argument("--gap-distractors", type=int, default=0,
                   help="a list's own words written, each alone, over the text between it and its "
                        "copy, this many per list (a copy from the previous token alone then goes "
                        "wrong; 0: none)")
    p.add_argument("--gap-cue-weight", type=float, default=1.0,
                   help="weight in the gap loss of each list copy's first recalled token, the one "
                        "predicted at the cue (1: as every other copied token)")
    p.add_argument("--gap-below-share", type=float, default=0.0,
                   help="share of gap pairs whose gap is drawn from [0, current gap] instead of "
                        "the stage's band (keeps the shorter distances trained; 0: the band only)")
    p.add_argument("--gap-corrupt-share", type=float, default=0.0,
                   help="share of a copy's inner tokens the model reads as a random token while "
                        "its targets stay true (trains recovery after a wrong token; 0: off)")
    p.add_argument("--gap-self-share", type=float, default=0.0,
                   help="scheduled sampling: share of a copy's inner tokens the model reads as its "
                        "own greedy guess (a no-grad forward first; ~1/3 more work a gap batch; 0: off)")
    p.add_argument("--gap-corrupt-from", choices=("pool", "words"), default="pool",
                   help="where --gap-corrupt-share's wrong tokens come from: the random segments' "
                        "pool, or the training words' tokens (plausible wrong pieces of a list)")
    p.add_argument("--gap-list-share", type=float, default=0.5,
                   help="share of word-list segments (the recall format) at the last stage; "
                        "it grows linearly from 0 at the first")
    p.add_argument("--copy-warmup-steps", type=int, default=0,
                   help="steps of tiled random-token rows before the main schedule (0: none)")
    p.add_argument("--copy-warmup-alphabet", type=int, default=0,
                   help="most frequent tokens the copy warm-up draws from at its start "
                        "(0: every token throughout)")
    p.add_argument("--copy-warmup-lr", type=float, default=0.0,
                   help="peak learning rate of the copy warm-up with --restart-schedule "
                        "(0: --lr)")
    p.add_argument("--restart-schedule", action="store_true",
                   help="the language-model schedule restarts its learning-rate warm-up and "
                        "cosine after the copy warm-up (default: one schedule over all steps)")
    p.add_argument("--copy-rows", type=int, default=0,
                   help="tiled random-token rows (as in the copy warm-up, periods 4 to half the "
                        "context) in every batch of the language-model schedule (0: none)")
    p.add_argument("--short-copy-rows", type=int, default=0,
                   help="short tiled random-token rows per step at the first curriculum length, "
                        "trained in a second forward summed into the loss (0: none)")
    p.add_argument("--short-copy-lengths", default="128,256,512,2048",
                   help="the short copy rows' length curriculum (tokens per row)")
    p.add_argument("--short-copy-advance", type=float, default=0.5,
                   help="smoothed training copy accuracy that moves to the next length")
    p.add_argument("--short-copy-weight", type=float, default=1.0,
                   help="weight of the short copy rows' loss in the sum")
    p.add_argument("--short-copy-alphabet", type=int, default=0,
                   help="draw short copy rows from the K most frequent tokens (0: all)")
    p.add_argument("--init-tokenizer-only", action="store_true",
                   help="with --init-from: keep its tokenizer and special tokens, start from random "
                        "weights in the shape of --hidden / --layers / --heads / --kv-heads / "
                        "--intermediate (their defaults are the bundled model's: the from-scratch "
                        "comparison with unchanged token ids, or another shape with them)")
    p.add_argument("--recall-max-depth", type=int, default=1800,
                   help="longest distance between a list or passage and its recall, in tokens")
    p.add_argument("--recall-context", type=int, default=2000,
                   help="prompt tokens of each recall-check trial")
    p.add_argument("--recall-depths", default="1000,1250,1500,1750",
                   help="recall-check depths: tokens from the list's end to the prompt's end")
    p.add_argument("--recall-trials", type=int, default=16, help="recall-check trials per depth")
    p.add_argument("--final-recall-trials", type=int, default=0,
                   help="trials per depth of the final greedy recall check (0: --recall-trials); "
                        "its standard error over lists is reported with it")
    p.add_argument("--eval-seed", type=int, default=1234,
                   help="seed of every recall / copy check's lists and filler, apart from --seed so "
                        "that runs trained with other seeds are measured on the same lists")
    p.add_argument("--recall-select", type=float, default=0.9,
                   help="teacher-forced recall an evaluation must reach to be chosen by loss")
    p.add_argument("--baseline-model", default="",
                   help="a model folder (e.g. the previous models/pagoda-tiny) scored alongside")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--min-lr-ratio", type=float, default=0.1)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--epochs", default="4,8,16",
                   help="comma-separated schedule lengths in epochs; one run each (same seed), "
                        "the best held-out loss is kept; the time budget is shared by epochs")
    p.add_argument("--max-steps", type=int, default=0, help="0: no cap besides epochs and time")
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--val-tokens", type=int, default=1 << 20,
                   help="held-out tokens per evaluation during training (default: all)")
    p.add_argument("--gen-tokens", type=int, default=40)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--no-autocast", dest="autocast", action="store_false")
    p.add_argument("--compile", action="store_true", help="torch.compile the training forward")
    p.add_argument("--smoke", action="store_true", help="tiny model, few steps: checks the script")
    args = p.parse_args(argv)
    if args.smoke:
        args.vocab_size, args.hidden, args.layers, args.heads, args.kv_heads = 512, 64, 2, 4, 2
        args.intermediate, args.context, args.batch_size, args.max_steps = 128, 128, 8, 40
        args.recall_context, args.recall_depths, args.recall_trials = 96, "30,50", 4
        args.eval_every, args.val_tokens, args.gen_tokens, args.warmup = 20, 4096, 8, 10
        args.epochs = "1,2"
        args.minutes = min(args.minutes, 3.0)
        args.reserve_seconds = min(args.reserve_seconds, 30.0)
    try:
        args.epoch_list = [float(e) for e in args.epochs.split(",")]
        if not args.epoch_list or min(args.epoch_list) <= 0:
            raise ValueError
    except ValueError:
        p.error(f"--epochs must be positive numbers separated by commas, got '{args.epochs}'")
    try:
        args.recall_depth_list = [int(d) for d in args.recall_depths.split(",")]
        if not args.recall_depth_list or min(args.recall_depth_list) <= 0:
            raise ValueError
    except ValueError:
        p.error(f"--recall-depths must be positive integers separated by commas, "
                f"got '{args.recall_depths}'")
    if not 0.0 <= args.recall_fraction <= 1.0:
        p.error(f"--recall-fraction must be in [0, 1], got {args.recall_fraction}")
    if args.final_recall_trials < 0:
        p.error(f"--final-recall-trials must be >= 0, got {args.final_recall_trials}")
    if args.recall_fraction_start is not None and not 0.0 <= args.recall_fraction_start <= 1.0:
        p.error(f"--recall-fraction-start must be in [0, 1], got {args.recall_fraction_start}")
    if not 0.0 <= args.curriculum <= 1.0:
        p.error(f"--curriculum must be in [0, 1], got {args.curriculum}")
    if args.copy_warmup_lr < 0:
        p.error(f"--copy-warmup-lr must be >= 0, got {args.copy_warmup_lr}")
    if not 0 <= args.copy_rows < args.batch_size:
        p.error(f"--copy-rows must be in [0, batch size), got {args.copy_rows}")
    if args.copy_warmup_steps < 0 or args.copy_warmup_alphabet == 1 or \
            args.copy_warmup_alphabet < 0:
        p.error(f"--copy-warmup-steps must be >= 0 and --copy-warmup-alphabet 0 or >= 2, got "
                f"{args.copy_warmup_steps} and {args.copy_warmup_alphabet}")
    try:
        args.short_copy_length_list = short_copy.parse_lengths(args.short_copy_lengths)
    except ValueError as error:
        p.error(f"--short-copy-lengths: {error}")
    if args.short_copy_rows < 0 or args.short_copy_alphabet < 0 or \
            args.short_copy_alphabet == 1 or not 0 < args.short_copy_advance <= 1 or \
            args.short_copy_weight < 0:
        p.error(f"--short-copy-rows and --short-copy-alphabet must be >= 0 (alphabet not 1), "
                f"--short-copy-advance in (0, 1], --short-copy-weight >= 0; got "
                f"{args.short_copy_rows}, {args.short_copy_alphabet}, "
                f"{args.short_copy_advance}, {args.short_copy_weight}")
    try:
        args.gap_list = gap_copy.parse_gaps(args.gap_gaps)
        if args.gap_rows:
            # The list segments' room is checked again with the real words when the rows are made.
            gap_copy.row_length(args.gap_list[-1], gap_copy.SEGMENT[1], args.context)
    except ValueError as error:
        p.error(f"--gap-gaps: {error}")
    if not 0 <= args.gap_corrupt_share < 1:
        p.error(f"--gap-corrupt-share must be in [0, 1), got {args.gap_corrupt_share}")
    if not 0 <= args.gap_self_share <= 1:
        p.error(f"--gap-self-share must be in [0, 1], got {args.gap_self_share}")
    if args.gap_distractors < 0:
        p.error(f"--gap-distractors must be >= 0, got {args.gap_distractors}")
    if args.gap_cue_weight <= 0:
        p.error(f"--gap-cue-weight must be > 0, got {args.gap_cue_weight}")
    if args.gap_rows < 0 or not 0 < args.gap_advance <= 1 or args.gap_weight < 0 or \
            not 0 <= args.gap_list_share <= 1 or not 0 <= args.gap_below_share <= 1:
        p.error(f"--gap-rows must be >= 0, --gap-advance in (0, 1], --gap-weight >= 0, "
                f"--gap-list-share and --gap-below-share in [0, 1]; got {args.gap_rows}, "
                f"{args.gap_advance}, {args.gap_weight}, {args.gap_list_share}, {args.gap_below_share}")
    if args.short_copy_rows and max(args.short_copy_length_list) > args.context:
        p.error(f"--short-copy-lengths must not exceed --context {args.context}")
    if args.init_tokenizer_only and not args.init_from:
        p.error("--init-tokenizer-only needs --init-from")
    if args.curriculum_start_depth < recall_data.MIN_DEPTH:
        p.error(f"--curriculum-start-depth must be at least {recall_data.MIN_DEPTH}, "
                f"got {args.curriculum_start_depth}")
    try:
        args.recall_kind_weights = parse_kinds(args.recall_kinds)
    except ValueError as error:
        p.error(f"--recall-kinds: {error}")
    if args.recall_context + 2 * recall_data.LIST_WORDS + 16 > args.context:
        p.error(f"--recall-context {args.recall_context} leaves no room for the list within "
                f"--context {args.context}")
    if max(args.recall_depth_list) >= args.recall_context:
        p.error(f"--recall-depths must be below --recall-context {args.recall_context}")
    if args.init_from:
        try:
            check_init_dir(args.init_from)
        except ValueError as error:
            p.error(str(error))
    if args.rope_theta < 0:
        p.error(f"--rope-theta must be >= 0, got {args.rope_theta}")
    if args.head_dim < 0 or args.head_dim % 2:
        p.error(f"--head-dim must be 0 (--hidden / --heads) or a positive even number, got {args.head_dim}")
    if (not args.head_dim and args.hidden % args.heads) or args.heads % args.kv_heads:
        p.error(f"--hidden {args.hidden} must divide by --heads {args.heads} (or give --head-dim), "
                f"and --heads by --kv-heads {args.kv_heads}")
    if not args.head_dim:
        args.head_dim = args.hidden // args.heads
    return args


def main():
    args = parse_args()
    model_dir = os.path.join(args.out, "model")
    os.makedirs(model_dir, exist_ok=True)
    report = Report(os.path.join(args.out, "train_report.json"))
    report["command"] = " ".join(sys.argv)
    report["args"] = vars(args)

    with report.stage("imports", fatal=True):
        import tokenizers
        import torch
        import transformers
        from transformers import AutoModelForCausalLM, LlamaForCausalLM
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        report["versions"] = {
            "python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
            "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu"}
        log(f"versions: {report['versions']}")
        random.seed(args.seed)
        torch.manual_seed(args.seed)

    with report.stage("data", fatal=True):
        train_docs = load_jsonl(os.path.join(args.data, "train.jsonl"))
        heldout_docs = load_jsonl(os.path.join(args.data, "heldout.jsonl"))
        chat_path = os.path.join(args.data, "chat.jsonl")
        chats = load_jsonl(chat_path) if os.path.exists(chat_path) else []
        with open(os.path.join(args.data, "heldout_sample.txt"), encoding="utf-8") as f:
            sample_text = f.read()
        if args.smoke:
            train_docs = [dict(d, text=d["text"][:20_000]) for d in train_docs[:12]]
            heldout_docs = heldout_docs[:12]
            chats = chats[:50]
        chat_texts = [render_chat(c["messages"]) for c in chats]
        report["data"] = {
            "train_documents": len(train_docs), "heldout_documents": len(heldout_docs),
            "chat_conversations": len(chats),
            "train_bytes": sum(len(d["text"].encode()) for d in train_docs),
            "chat_bytes": sum(len(t.encode()) for t in chat_texts),
            "heldout_bytes": sum(len(d["text"].encode()) for d in heldout_docs),
            "heldout_sample_bytes": len(sample_text.encode())}
        log(f"data: {report['data']}")

    with report.stage("tokenizer", fatal=True):
        corpus = [d["text"] for d in train_docs]
        corpus += [m["content"] for c in chats for m in c["messages"]]
        if args.init_from:  # continued training: the checkpoint's tokenizer, ids unchanged
            from tokenizers import Tokenizer
            tokenizer = Tokenizer.from_file(os.path.join(args.init_from, "tokenizer.json"))
            init_tokenizer_files(args.init_from, model_dir, args.context)
            for token in SPECIAL_TOKENS:
                if tokenizer.token_to_id(token) is None:
                    raise RuntimeError(f"--init-from tokenizer lacks the special token {token}")
        else:
            tokenizer = train_tokenizer(corpus, args.vocab_size)
            tokenizer.save(os.path.join(model_dir, "tokenizer.json"))
            with open(os.path.join(model_dir, "tokenizer_config.json"), "w") as f:
                json.dump(tokenizer_config(args.context), f, indent=2)
        special_ids = {t: tokenizer.token_to_id(t) for t in SPECIAL_TOKENS}
        bos_id, eos_id = special_ids[BOS], special_ids[EOS]
        doc_ids = encode_all(tokenizer, [d["text"] for d in train_docs])
        chat_ids = encode_all(tokenizer, chat_texts)
        # Books open with <|bos|> and close with <|eos|>; conversations carry theirs.
        pieces = [[bos_id] + ids + [eos_id] for ids in doc_ids] + chat_ids
        random.Random(args.seed).shuffle(pieces)
        train_ids = [t for piece in pieces for t in piece]
        heldout_ids = [t for ids in encode_all(tokenizer, [d["text"] for d in heldout_docs])
                       for t in ids]
        sample_ids = tokenizer.encode(sample_text, add_special_tokens=False).ids
        round_trip = tokenizer.decode(sample_ids, skip_special_tokens=False) == sample_text
        report["tokenizer"] = {
            "vocab_size": tokenizer.get_vocab_size(), "special_token_ids": special_ids,
            "train_tokens": len(train_ids), "chat_tokens": sum(len(c) for c in chat_ids),
            "heldout_tokens": len(heldout_ids), "heldout_sample_tokens": len(sample_ids),
            "heldout_bytes_per_token": round(
                report["data"]["heldout_bytes"] / max(1, len(heldout_ids)), 3),
            "sample_round_trip_exact": round_trip}
        log(f"tokenizer: {report['tokenizer']}")

    with report.stage("recall_data", fatal=True):
        def encode(text):
            return tokenizer.encode(text, add_special_tokens=False).ids

        words = recall_data.vocabulary_words(corpus)
        train_words, heldout_words = recall_data.split_words(words)
        recall_source = None
        if args.recall_fraction > 0 or (args.recall_fraction_start or 0) > 0:
            special = set(special_ids.values())
            random_ids = sorted(set(train_ids) - special)
            recall_source = recall_data.RecallSequences(
                train_ids, encode, train_words, args.context, args.seed + 1,
                max_depth=args.recall_max_depth, weights=args.recall_kind_weights,
                random_ids=random_ids)
        # The monitor (teacher-forced, every evaluation) uses held-out vocabulary words over the
        # full held-out text; the final check also uses the eval's own words over the sample.
        monitor_depths = [d for d in MONITOR_SHORT_DEPTHS if d < min(args.recall_depth_list)]
        monitor = recall_data.recall_trials(
            heldout_ids, encode, heldout_words, args.recall_context,
            monitor_depths + args.recall_depth_list,
            max(2, args.recall_trials // 2), recall_data.LIST_WORDS, args.eval_seed + 2)
        special = set(special_ids.values())
        copy_pool = [t for t, _ in Counter(train_ids).most_common() if t not in special]
        # Induction probes: random spans repeated in held-out text (copy accuracy by distance).
        copy_distances = [d for d in COPY_PROBE_DISTANCES
                          if d + COPY_PROBE_SPAN + 1 <= args.recall_context]
        copy_monitor = recall_data.copy_trials(
            heldout_ids, sorted(set(train_ids) - set(special_ids.values())), args.recall_context,
            copy_distances, max(2, args.recall_trials // 2), COPY_PROBE_SPAN, args.eval_seed + 5)
        def make_gap_rows():
            # One per run: the curriculum starts again at the first gap.
            return gap_copy.GapRows(
                train_ids, args.gap_list, args.context, args.gap_rows, args.gap_advance,
                copy_pool, [encode(" " + w) for w in train_words], encode(recall_data.INTRO),
                encode(recall_data.TERMINATOR), args.gap_list_share, args.seed + 9,
                args.gap_below_share, args.gap_corrupt_share, args.gap_corrupt_from,
                args.gap_distractors)
        if args.gap_rows:
            make_gap_rows()  # fails here, before training, if the lists do not fit
        short_monitor = (short_copy.monitor_rows(args.short_copy_length_list, copy_pool, 16,
                                                 args.seed + 8) if args.short_copy_rows else None)
        example, info = (recall_source.next() if recall_source else (None, None))
        if recall_source:  # a fresh generator: the example does not shift the training stream
            recall_source.rng.seed(args.seed + 1)
        report["recall_data"] = {
            "intro": recall_data.INTRO, "terminator": recall_data.TERMINATOR,
            "intro_ids": encode(recall_data.INTRO),
            "terminator_ids": encode(recall_data.TERMINATOR),
            "vocabulary_words": len(words), "training_words": len(train_words),
            "heldout_words": len(heldout_words), "eval_words": recall_data.EVAL_WORDS,
            "eval_word_tokens": {w: len(encode(" " + w)) for w in recall_data.EVAL_WORDS},
            "monitor_trials": len(monitor),
            "example_sequence": info,
            "example_text": tokenizer.decode(example, skip_special_tokens=False)[:6000]
            if example else None}
        log(f"recall data: {len(train_words)} training words, {len(heldout_words)} held out")

    with report.stage("model", fatal=True):
        init_state = None
        if args.init_from:
            from transformers import AutoConfig
            config = AutoConfig.from_pretrained(args.init_from)
            source = {"dir": args.init_from,
                      "max_position_embeddings": config.max_position_embeddings,
                      "rope_parameters": getattr(config, "rope_parameters", None),
                      "sha256": {n: file_sha256(os.path.join(args.init_from, n))
                                 for n in INIT_FILES}}
            if config.vocab_size < tokenizer.get_vocab_size():
                raise RuntimeError(f"--init-from: vocab_size {config.vocab_size} is below the "
                                   f"tokenizer's {tokenizer.get_vocab_size()}")
            config.max_position_embeddings = args.context
            if args.rope_theta:
                set_rope_theta(config, args.rope_theta)
            try:
                init_model = AutoModelForCausalLM.from_pretrained(args.init_from,
                                                                  dtype=torch.float32)
            except TypeError:  # transformers 4 spelling
                init_model = AutoModelForCausalLM.from_pretrained(args.init_from,
                                                                  torch_dtype=torch.float32)
            init_state = {k: v.detach().to("cpu", torch.float32, copy=True)
                          for k, v in init_model.state_dict().items()}
            del init_model
            if args.init_tokenizer_only:  # same tokenizer, the flags' shape, random weights
                init_state = None
                source["weights"] = "not loaded (--init-tokenizer-only)"
                config.hidden_size, config.intermediate_size = args.hidden, args.intermediate
                config.num_hidden_layers, config.num_attention_heads = args.layers, args.heads
                config.num_key_value_heads = args.kv_heads
                config.head_dim = args.head_dim
                if getattr(config, "layer_types", None):  # one entry per layer where it exists
                    config.layer_types = [config.layer_types[0]] * args.layers
            report["init_from"] = source
            log(f"init from {args.init_from}: context {source['max_position_embeddings']} -> "
                f"{args.context}, rope {getattr(config, 'rope_parameters', None)}")
        else:
            vocab = max(args.vocab_size, tokenizer.get_vocab_size())
            vocab = (vocab + 63) // 64 * 64
            config = build_config(args, vocab, special_ids)
        parameters = sum(p.numel() for p in LlamaForCausalLM(config).parameters())
        report["model"] = {"parameters": parameters, "config": config.to_dict()}
        log(f"model: {parameters:,} parameters")
        set_float32_matmul_precision(torch, "high")  # TF32 while training: faster, harmless

    with report.stage("train", fatal=True):
        # One run per schedule length; the longest schedules overfit this small corpus, the
        # shortest underfit, and the held-out loss picks. Runs share the time budget by epochs.
        runs, log_rows, chosen = [], [], None
        deadline = START_TIME + args.minutes * 60.0 - args.reserve_seconds
        for index, epochs in enumerate(args.epoch_list):
            share = epochs / sum(args.epoch_list[index:])
            run_deadline = time.time() + (deadline - time.time()) * share
            run_name = f"{epochs:g}ep"
            torch.manual_seed(args.seed)
            if recall_source is not None:  # every run sees the same recall sequences
                recall_source.rng.seed(args.seed + 1)
            model = LlamaForCausalLM(config)
            if args.init_from:  # float32 master weights (the checkpoint's config may say bf16)
                model = model.float()
            if init_state is not None:  # every run starts from the checkpoint
                apply_init_weights(model, init_state)
            model = model.to(device)
            summary, rows = train(args, model, train_ids, heldout_ids, device, epochs,
                                  run_deadline, run_name, recall_source, monitor,
                                  copy_monitor, copy_pool, short_monitor,
                                  make_gap_rows() if args.gap_rows else None)
            runs.append(summary)
            log_rows += rows
            log(f"run {run_name}: {summary}")
            if chosen is None or summary["selection_key"] > chosen[0]["selection_key"]:
                chosen = (summary, {k: v.detach().to("cpu", copy=True)
                                    for k, v in model.state_dict().items()})
            del model
            report["training"] = {"runs": runs, "chosen_run": chosen[0]["run"]}
            report["loss_log"] = log_rows
        model = LlamaForCausalLM(config)
        model.load_state_dict(chosen[1])
        model = model.to(device)
        report["training"] = {"runs": runs, "chosen_run": chosen[0]["run"],
                              "chosen": chosen[0],
                              "note": "chosen by held-out loss (among evaluations whose "
                                      "teacher-forced recall on held-out words reaches "
                                      f"{args.recall_select}), and the held-out loss is also "
                                      "the reported held-out set: figures are slightly "
                                      "optimistic"}
        write_loss_csv(os.path.join(args.out, "loss.csv"), log_rows)

    with report.stage("export", fatal=True):
        model = model.to(torch.bfloat16)
        model.config.use_cache = True
        model.save_pretrained(model_dir)
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()

    # Everything below uses the exported files, upcast to float32 like pagoda's CPU reference.
    with report.stage("reload", fatal=True):
        set_float32_matmul_precision(torch, "highest")  # no TF32: figures match a CPU f32 run
        try:
            reference = AutoModelForCausalLM.from_pretrained(
                model_dir, dtype=torch.float32, attn_implementation="eager")
        except TypeError:  # transformers 4 spelling
            reference = AutoModelForCausalLM.from_pretrained(
                model_dir, torch_dtype=torch.float32, attn_implementation="eager")
        reference = reference.to(device).eval()
        if reference.dtype != torch.float32:
            reference = reference.float()

    with report.stage("perplexity", fatal=False):
        windows = sorted({min(1024, args.context), args.context})
        results = {"protocol": "tokenize without special tokens; consecutive windows of W "
                               "tokens, each from an empty cache; every token but a window's "
                               "first is predicted",
                   "windows": windows}
        for window in windows:
            suffix = "" if window == args.context else f"_window_{window}"
            for name, ids in [("heldout_sample", sample_ids),
                              ("heldout_sample_first_2048", sample_ids[:2048]),
                              ("heldout_full", heldout_ids)]:
                ppl, count, nll = score_text(reference, ids, window, device, 8)
                results[name + suffix] = {"perplexity": round(ppl, 5), "tokens": count,
                                          "mean_nll": round(nll, 6), "dtype": "float32",
                                          "window": window}
                log(f"perplexity {name} (window {window}): {ppl:.4f} over {count} tokens")
        ppl, count, _ = score_text(reference, sample_ids, args.context, device, 8, torch.bfloat16)
        results["heldout_sample_bf16_autocast"] = {"perplexity": round(ppl, 5), "tokens": count}
        report["perplexity"] = results

    with report.stage("recall", fatal=False):
        final_trials = args.final_recall_trials or args.recall_trials
        check = {"format": "docs/EVAL.md (Recall prompt format)", "greedy": "float32, eager",
                 "context_tokens": args.recall_context, "depths": args.recall_depth_list,
                 "trials_per_depth": final_trials, "list_words": recall_data.LIST_WORDS,
                 "eval_seed": args.eval_seed,
                 "goal": "token accuracy >= 0.8 with lists >= 1,000 tokens back"}
        pools = [("eval_words", recall_data.EVAL_WORDS, sample_ids, args.eval_seed + 3),
                 ("heldout_vocabulary_words", heldout_words, heldout_ids, args.eval_seed + 4)]
        for name, pool, filler, seed in pools:
            trials = recall_data.recall_trials(
                filler, encode, pool, args.recall_context, args.recall_depth_list,
                final_trials, recall_data.LIST_WORDS, seed)
            accuracy, by_depth, rows = greedy_recall(reference, trials, device)
            se = list_accuracy_standard_error(rows)
            check[name] = {"token_accuracy": round(accuracy, 4), "by_depth": by_depth,
                           "standard_error_over_lists": round(se, 4), "lists": len(rows),
                           "list_tokens": sum(len(t["expected"]) for t in trials),
                           "filler": "heldout sample" if filler is sample_ids else "heldout full",
                           "examples": [dict(r, produced_text=tokenizer.decode(r["produced"]))
                                        for r in rows[:3]]}
            log(f"recall {name}: {accuracy:.4f} (+-{se:.3f} s.e. over {len(rows)} lists) by depth {by_depth}")
        check["goal_met"] = (min(args.recall_depth_list) >= 1000
                             and min(check[n]["token_accuracy"] for n, *_ in pools) >= 0.8)
        report["recall"] = check

    if args.baseline_model:
        with report.stage("baseline", fatal=False):
            from tokenizers import Tokenizer
            base_tok = Tokenizer.from_file(os.path.join(args.baseline_model, "tokenizer.json"))
            try:
                base = AutoModelForCausalLM.from_pretrained(
                    args.baseline_model, dtype=torch.float32, attn_implementation="eager")
            except TypeError:
                base = AutoModelForCausalLM.from_pretrained(
                    args.baseline_model, torch_dtype=torch.float32, attn_implementation="eager")
            base = base.to(device).eval().float()
            base_context = int(base.config.max_position_embeddings)
            heldout_text = [d["text"] for d in heldout_docs]
            base_sample = base_tok.encode(sample_text, add_special_tokens=False).ids
            base_full = [t for e in base_tok.encode_batch(heldout_text, add_special_tokens=False)
                         for t in e.ids]
            # The weights' digest names which model the ratio is against (a baseline path in a working
            # tree may hold another candidate than the committed model).
            baseline = {"model": args.baseline_model, "context": base_context,
                        "model_sha256": file_sha256(os.path.join(args.baseline_model, "model.safetensors")),
                        "same_tokenizer": base_tok.to_str() == tokenizer.to_str()}
            for name, ids in [("heldout_sample", base_sample), ("heldout_full", base_full)]:
                ppl, count, nll = score_text(base, ids, min(1024, base_context), device, 8)
                baseline[name] = {"perplexity": round(ppl, 5), "tokens": count,
                                  "window": min(1024, base_context)}
            # The observation: the old model does not recall a list 500 tokens back.
            base_recall_context = min(base_context - 24, 1000)
            base_depths = [d for d in (500, 750) if d < base_recall_context]
            if base_depths:
                trials = recall_data.recall_trials(
                    base_sample, lambda t: base_tok.encode(t, add_special_tokens=False).ids,
                    recall_data.EVAL_WORDS, base_recall_context, base_depths,
                    args.recall_trials, recall_data.LIST_WORDS, args.eval_seed + 3)
                accuracy, by_depth, _ = greedy_recall(base, trials, device)
                baseline["recall_eval_words"] = {"context_tokens": base_recall_context,
                                                 "token_accuracy": round(accuracy, 4),
                                                 "by_depth": by_depth}
            new = report.data.get("perplexity", {})
            key = "heldout_full" if args.context == 1024 else "heldout_full_window_1024"
            if key in new:
                baseline["heldout_full_ratio_new_over_baseline_window_1024"] = round(
                    new[key]["perplexity"] / baseline["heldout_full"]["perplexity"], 4)
                baseline["goal"] = "ratio <= 1.10"
                baseline["goal_met"] = baseline["heldout_full_ratio_new_over_baseline_window_1024"] <= 1.10
            key = "heldout_sample" if args.context == 1024 else "heldout_sample_window_1024"
            if key in new:
                baseline["heldout_sample_ratio_new_over_baseline_window_1024"] = round(
                    new[key]["perplexity"] / baseline["heldout_sample"]["perplexity"], 4)
            report["baseline"] = baseline
            log(f"baseline: {baseline}")
            del base

    with report.stage("greedy", fatal=False):
        prompts = [(name, text) for name, text in GREEDY_PROMPTS]
        prompts.append(("chat", render_chat(CHAT_PROMPT, add_generation_prompt=True)))
        outputs = []
        for name, text in prompts:
            prompt_ids = tokenizer.encode(text, add_special_tokens=False).ids
            new, margins, top5 = greedy_continuation(reference, prompt_ids, args.gen_tokens,
                                                     eos_id, device)
            entry = {"name": name, "prompt": text, "prompt_ids": prompt_ids, "output_ids": new,
                     "output_text": tokenizer.decode(new, skip_special_tokens=False),
                     "top1_margin": margins, "top5_logprobs": top5}
            try:
                x = torch.tensor([prompt_ids], device=device)
                generated = reference.generate(
                    input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=len(new),
                    do_sample=False, eos_token_id=eos_id, pad_token_id=special_ids[PAD])
                entry["generate_ids"] = generated[0, len(prompt_ids):].tolist()
                entry["generate_agrees"] = entry["generate_ids"] == new
            except Exception as error:  # noqa: BLE001 - the cross-check is optional
                entry["generate_error"] = repr(error)
            outputs.append(entry)
            log(f"greedy {name}: {text!r} -> {entry['output_text']!r}")
        report["greedy"] = {"max_new_tokens": args.gen_tokens, "dtype": "float32",
                            "attention": "eager", "tf32": False, "prompts": outputs}

    with report.stage("greedy_long", fatal=False):
        # One long prompt (the recall check's first eval-words trial at its deepest depth, ids
        # stored) so that pagoda's decoding can be compared past the old 1,024 positions.
        trials = recall_data.recall_trials(
            sample_ids, encode, recall_data.EVAL_WORDS, args.recall_context,
            [max(args.recall_depth_list)], 1, recall_data.LIST_WORDS, args.eval_seed + 3)
        long_ids = trials[0]["prompt"]
        new, margins, top5 = greedy_continuation(reference, long_ids, 16, eos_id, device)
        report["greedy_long"] = {
            "depth": trials[0]["depth"], "words": trials[0]["words"],
            "expected": trials[0]["expected"], "prompt_ids": long_ids, "output_ids": new,
            "output_text": tokenizer.decode(new, skip_special_tokens=False),
            "top1_margin": margins, "top5_logprobs": top5, "dtype": "float32",
            "attention": "eager", "tf32": False}
        log(f"greedy_long: {len(long_ids)} prompt tokens -> {report['greedy_long']['output_text']!r}")

    with report.stage("transformers_tokenizer_check", fatal=False):
        from transformers import AutoTokenizer
        hf_tokenizer = AutoTokenizer.from_pretrained(model_dir)
        rendered = hf_tokenizer.apply_chat_template(CHAT_PROMPT, tokenize=False,
                                                    add_generation_prompt=True)
        expected = render_chat(CHAT_PROMPT, add_generation_prompt=True)
        hf_ids = hf_tokenizer(sample_text[:5000], add_special_tokens=True)["input_ids"]
        report["transformers_tokenizer_check"] = {
            "class": type(hf_tokenizer).__name__,
            "chat_template_matches_training_format": rendered == expected,
            "rendered": rendered,
            "encode_matches_tokenizers": hf_ids == tokenizer.encode(sample_text[:5000]).ids}

    with report.stage("plot", fatal=False):
        cfg = report["model"]["config"]
        title = (f"pagoda-tiny: {report['model']['parameters'] / 1e6:.1f}M params, "
                 f"{cfg['num_hidden_layers']} layers, hidden {cfg['hidden_size']}, "
                 f"GQA {cfg['num_attention_heads']}/{cfg['num_key_value_heads']}, "
                 f"context {args.context}")
        plot_loss(os.path.join(args.out, "loss_curve.png"), report["loss_log"], title,
                  report["training"]["chosen_run"])

    files = {}
    for root, _, names in os.walk(args.out):
        for name in names:
            path = os.path.join(root, name)
            files[os.path.relpath(path, args.out)] = os.path.getsize(path)
    report.data["files"] = files
    if len(files) > 8 or any(size >= 16 * 2**20 for size in files.values()):
        report.data["errors"].append({"stage": "files", "error": f"over the limits: {files}"})
    report.data["status"] = "ok" if not report.data["errors"] else "ok with errors"
    report.save()
    log(f"done: status {report.data['status']}, files {files}")


if __name__ == "__main__":
    main()
