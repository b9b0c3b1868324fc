#!/usr/bin/env python3
"""Trains pagoda's bundled model (models/pagoda-tiny) on the GPU machine, in one device call.

Input: the folder written by tools/train/extract_text.py (train.jsonl, heldout.jsonl, chat.jsonl,
heldout_sample.txt). Steps, each logged with elapsed seconds:
  1. a byte-level BPE tokenizer (HF `tokenizers`, Llama-3-style split regex, vocab --vocab-size,
     special tokens <|bos|> <|eos|> <|pad|> <|system|> <|user|> <|assistant|>);
  2. a LlamaForCausalLM with GQA (default: hidden 256, 8 layers, 8 query heads of 32, 2 KV heads,
     ~8M parameters, context 1,024) trained with plain PyTorch: bf16 autocast, AdamW, linear warmup
     then cosine decay, random 1,024-token crops of the token stream; the step count comes from the
     wall-time budget (--minutes, measured after a short probe) capped at --max-epochs; the weights
     with the best held-out loss are kept;
  3. export in Hugging Face format, bf16 (save_pretrained), reloaded from disk for every figure below;
  4. held-out perplexity in float32 with the protocol `pagoda eval perplexity` uses: the text file
     is tokenized without special tokens, cut into consecutive non-overlapping windows of --context
     tokens, each window scored from an empty cache, every token but a window's first predicted;
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

Usage: python3 tools/train/train.py --data .cache/train-data --out $OUT --minutes 7
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


def make_recall_piece(rng, filler_ids, word_ids, intro_ids, end_ids, list_words, gap, head):
    """A training sequence that rewards in-context recall (issue #21): `head` filler tokens, a list
    (intro, `list_words` words drawn from `word_ids`, end), `gap` filler tokens, then the same list
    again: its words can only be predicted from the first copy, `gap` + len(intro) tokens back.
    Filler comes from one random place in `filler_ids`; word_ids holds each candidate word's ids."""
    if list_words > len(word_ids):
        raise ValueError(f"{len(word_ids)} candidate words for lists of {list_words}")
    if head + gap > len(filler_ids):
        raise ValueError(f"{len(filler_ids)} filler tokens for {head} + {gap}")
    words = rng.sample(range(len(word_ids)), list_words)
    listed = list(intro_ids) + [t for w in words for t in word_ids[w]] + list(end_ids)
    start = rng.randrange(0, len(filler_ids) - head - gap + 1)
    filler = filler_ids[start:start + head + gap]
    return filler[:head] + listed + filler[head:] + listed


def recall_pieces(rng, filler_ids, word_ids, intro_ids, end_ids, list_words, context, total_tokens):
    """Recall pieces (make_recall_piece) adding up to about total_tokens, each fitting in one
    `context` window, gaps uniform over what the window allows (so lists recalled from far back)."""
    listed = len(intro_ids) + len(end_ids) + list_words * max(len(w) for w in word_ids)
    room = context - 2 * listed - 1
    if room < 16:
        raise ValueError(f"context {context} leaves no room for two lists of {listed} tokens")
    pieces, made = [], 0
    while made < total_tokens:
        gap = rng.randrange(16, room + 1)
        head = rng.randrange(0, room - gap + 1)
        piece = make_recall_piece(rng, filler_ids, word_ids, intro_ids, end_ids, list_words, gap, head)
        pieces.append(piece)
        made += len(piece)
    return pieces


def recall_words(texts, count):
    """The `count` most frequent lowercase alphabetic words (3-10 letters) of the texts: the
    candidates recall lists are drawn from."""
    counts = {}
    for text in texts:
        for word in text.split():
            if word.isalpha() and word.islower() and 3 <= len(word) <= 10:
                counts[word] = counts.get(word, 0) + 1
    return [w for w, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:count]]


def learning_rate(step, total_steps, peak, warmup, min_ratio):
    """Linear warmup to `peak`, then cosine decay to peak * min_ratio at total_steps."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
    return peak * (min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress)))


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
        num_key_value_heads=args.kv_heads, max_position_embeddings=args.context,
        rms_norm_eps=1e-5, hidden_act="silu", tie_word_embeddings=False,
        attention_bias=False, mlp_bias=False, initializer_range=0.02,
        bos_token_id=special_ids[BOS], eos_token_id=special_ids[EOS],
        pad_token_id=special_ids[PAD])
    try:  # transformers 5 spelling
        config = LlamaConfig(**common, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
        if getattr(config, "rope_parameters", None) is None:
            raise TypeError("no rope_parameters")
    except TypeError:  # transformers 4 spelling
        config = LlamaConfig(**common, rope_theta=10000.0)
    return config


def train(args, model, train_ids, heldout_ids, device, max_epochs, deadline, run_name):
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
    offsets_arange = torch.arange(context + 1, device=device)
    tokens_per_step = batch * context
    steps_per_epoch = stream.numel() / tokens_per_step
    epoch_cap = max(1, math.ceil(max_epochs * steps_per_epoch))
    total_steps = min(epoch_cap, args.max_steps) if args.max_steps > 0 else epoch_cap
    autocast = (torch.autocast(device_type=device.type, dtype=torch.bfloat16)
                if args.autocast else contextlib.nullcontext())

    def evaluate():
        model.eval()
        _, _, nll = score_text(model, heldout_eval, context, device, 16,
                               torch.bfloat16 if args.autocast else None)
        model.train()
        return nll

    log_rows, best = [], {"val_loss": float("inf"), "step": -1, "state": None}
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
        if time.time() > deadline:
            stop_reason = "time budget reached"
            break
        lr = learning_rate(step, total_steps, args.lr, args.warmup, args.min_lr_ratio)
        for group in optimizer.param_groups:
            group["lr"] = lr
        starts = torch.randint(0, stream.numel() - context - 1, (batch,), device=device,
                               generator=generator)
        chunk = stream[starts[:, None] + offsets_arange[None, :]]
        x, y = chunk[:, :-1], chunk[:, 1:]
        with autocast:
            logits = step_model(input_ids=x, use_cache=False).logits
        loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), y.reshape(-1))
        loss.backward()
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
            if step % args.eval_every == 0 or last:
                val_loss = evaluate()
                if val_loss < best["val_loss"]:
                    best = {"val_loss": val_loss, "step": step,
                            "state": {k: v.detach().clone() for k, v in model.state_dict().items()}}
                log(f"{run_name} step {step}/{total_steps} lr {lr:.2e} loss {loss_value:.4f} "
                    f"val {val_loss:.4f} (ppl {math.exp(val_loss):.2f}) "
                    f"epoch {step / steps_per_epoch:.2f}")
            log_rows.append([run_name, step, step * tokens_per_step, lr, round(loss_value, 5),
                             None if val_loss is None else round(val_loss, 5),
                             round(time.time() - START_TIME, 1)])

    if best["state"] is None or (log_rows and log_rows[-1][5] is None):
        # The loop ended without a fresh evaluation (time budget): evaluate the last weights too.
        val_loss = evaluate()
        if val_loss < best["val_loss"]:
            best = {"val_loss": val_loss, "step": step,
                    "state": {k: v.detach().clone() for k, v in model.state_dict().items()}}
        log_rows.append([run_name, step, step * tokens_per_step, None, None, round(val_loss, 5),
                         round(time.time() - START_TIME, 1)])
    model.load_state_dict(best["state"])
    summary = {
        "run": run_name, "max_epochs": max_epochs, "probe": probe, "steps": step, "stop_reason": stop_reason, "tokens_per_step": tokens_per_step,
        "tokens_seen": step * tokens_per_step, "epochs": round(step / steps_per_epoch, 3),
        "best_step": best["step"], "best_val_loss": round(best["val_loss"], 5),
        "best_val_perplexity_bf16": round(math.exp(best["val_loss"]), 4),
        "val_tokens": len(heldout_eval),
        "wall_s": round(time.time() - START_TIME, 1),
    }
    return summary, log_rows


def write_loss_csv(path, rows):
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["run", "step", "tokens", "lr", "train_loss", "val_loss", "elapsed_s"])
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
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--intermediate", type=int, default=768)
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--recall-share", type=float, default=0.0,
                   help="share of training tokens in recall sequences (a word list repeated up to a "
                        "window later; issue #21); 0: none")
    p.add_argument("--recall-words", type=int, default=8, help="words per recall list")
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
    if args.hidden % args.heads or args.heads % args.kv_heads:
        p.error(f"--hidden {args.hidden} must divide by --heads {args.heads}, "
                f"and --heads by --kv-heads {args.kv_heads}")
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
        if not 0.0 <= args.recall_share < 1.0:
            raise SystemExit(f"--recall-share {args.recall_share}: must be in [0, 1)")
        if args.recall_share > 0:
            # Sequences that reward in-context recall, a share of the training tokens (issue #21).
            rng = random.Random(args.seed + 1)
            words = recall_words([d["text"] for d in train_docs], 2000)
            word_ids = [ids for ids in encode_all(tokenizer, [" " + w for w in words]) if ids]
            filler = [t for ids in doc_ids for t in ids]
            base = sum(len(p) for p in pieces)
            extra = recall_pieces(rng, filler, word_ids,
                                  tokenizer.encode("\nThe words to remember are:", add_special_tokens=False).ids,
                                  tokenizer.encode(".\n", add_special_tokens=False).ids, args.recall_words,
                                  args.context, int(base * args.recall_share / (1 - args.recall_share)))
            report["recall_training"] = {"share": args.recall_share, "pieces": len(extra),
                                         "tokens": sum(len(p) for p in extra), "candidate_words": len(word_ids),
                                         "list_words": args.recall_words}
            pieces += extra
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

    with report.stage("model", fatal=True):
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
            model = LlamaForCausalLM(config).to(device)
            summary, rows = train(args, model, train_ids, heldout_ids, device, epochs,
                                  run_deadline, run_name)
            runs.append(summary)
            log_rows += rows
            log(f"run {run_name}: {summary}")
            if chosen is None or summary["best_val_loss"] < chosen[0]["best_val_loss"]:
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
                              "note": "chosen by held-out loss, which is also the reported "
                                      "held-out set: figures are slightly optimistic"}
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
        results = {"protocol": f"tokenize without special tokens; consecutive windows of "
                               f"{args.context} tokens, each from an empty cache; "
                               f"every token but a window's first is predicted"}
        for name, ids in [("heldout_sample", sample_ids),
                          ("heldout_sample_first_2048", sample_ids[:2048]),
                          ("heldout_full", heldout_ids)]:
            ppl, count, nll = score_text(reference, ids, args.context, device, 8)
            results[name] = {"perplexity": round(ppl, 5), "tokens": count,
                             "mean_nll": round(nll, 6), "dtype": "float32"}
            log(f"perplexity {name}: {ppl:.4f} over {count} tokens")
        ppl, count, _ = score_text(reference, sample_ids, args.context, device, 8, torch.bfloat16)
        results["heldout_sample_bf16_autocast"] = {"perplexity": round(ppl, 5), "tokens": count}
        report["perplexity"] = results

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
