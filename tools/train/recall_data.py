"""In-context recall data for the bundled model: training sequences and the held-out recall check.

Standard library only, deterministic for a given seed, tokenizer-agnostic (every function takes
token ids or an `encode(text) -> ids` callable), so it is checked without torch (selftest.py).

The word-list format is the one `pagoda eval recall` uses (docs/EVAL.md, "Recall prompt format"):

    <filler> INTRO w1 w2 ... wN TERMINATOR <filler of depth - len(INTRO) tokens> INTRO

INTRO is "\\nThe words to remember are:", each word is " word" encoded on its own, TERMINATOR is
".\\n", and the pieces are joined as token ids (never re-tokenized as one string). The model should
continue the prompt with the list's tokens. `depth` counts the tokens from the end of the list's
TERMINATOR to the end of the prompt (the filler after the list plus the closing INTRO).

Training sequences (RecallSequences) are of three kinds, drawn by weight (default: list and
passage half each, no random):
  - "list": a contiguous crop of the training stream with one word list presented at a random
    place and recalled (INTRO, the same words, TERMINATOR) at a depth drawn uniformly from
    [MIN_DEPTH, max_depth]; the sequence then goes on with filler. Words come from the training
    vocabulary minus the held-out words (split_words).
  - "passage": a crop of the training stream in which one to three spans of 32-256 tokens are
    repeated verbatim later, each at a gap (end of the span to the start of its copy) drawn
    uniformly from [MIN_DEPTH, max_depth], no copy overlapping a span or another copy: unmarked
    repetition, a dense signal for the copy mechanism the lists use.
  - "random": the passage layout (up to RANDOM_PAIRS spans of RANDOM_TOKENS), but each span is
    replaced by tokens drawn uniformly from `random_ids` before it is copied. The copy cannot be predicted from memorised training text
    (the corpus is small and seen many times), only by looking back: the densest signal for
    forming induction heads.

`max_depth` may be changed between calls to next() (a curriculum: short distances first).
"""

import random
import re
import zlib
from collections import Counter

INTRO = "\nThe words to remember are:"
TERMINATOR = ".\n"
LIST_WORDS = 8  # words per list in the recall check (pagoda eval recall's default too)
MIN_DEPTH = 16
PASSAGE_TOKENS = (32, 256)
PASSAGES = 3  # repeated spans per passage sequence, at most
TRAIN_LIST_WORDS = (4, 12)
RANDOM_TOKENS = (32, 384)  # span lengths of the "random" kind
RANDOM_PAIRS = 6  # repeated spans per random sequence, at most
KINDS = ("list", "passage", "random")

# The words `pagoda eval recall` draws its lists from; never used in a training list.
EVAL_WORDS = [
    "apple", "river", "stone", "candle", "garden", "silver", "window", "horse", "bread", "winter",
    "mirror", "forest", "letter", "castle", "button", "ribbon", "violet", "anchor", "copper",
    "meadow", "pencil", "barrel", "saddle", "orange", "tiger", "velvet", "harbor", "ladder",
    "marble", "feather", "kettle", "pepper", "rabbit", "shadow", "thunder", "valley", "wagon",
    "cherry", "dragon", "lantern",
]

WORD = re.compile(r"(?<![A-Za-z'])[a-z]{3,12}(?![A-Za-z'])")


def vocabulary_words(texts, min_count=3):
    """Lower-case words of 3-12 letters seen at least min_count times, sorted."""
    counts = Counter()
    for text in texts:
        counts.update(WORD.findall(text))
    return sorted(w for w, c in counts.items() if c >= min_count)


def split_words(words, heldout_modulus=10):
    """(training words, held-out words): a word is held out when crc32(word) % modulus == 0;
    EVAL_WORDS are in neither list (they are the eval's own held-out set)."""
    excluded = set(EVAL_WORDS)
    train, heldout = [], []
    for word in words:
        if word in excluded:
            continue
        (heldout if zlib.crc32(word.encode()) % heldout_modulus == 0 else train).append(word)
    return train, heldout


class RecallSequences:
    """Endless, seeded training sequences of `length` tokens (input and target: length + 1 ids)."""

    def __init__(self, stream, encode, words, length, seed, max_depth=1800, weights=None,
                 random_ids=None):
        """weights: {kind: weight} over KINDS (default list 1, passage 1); random_ids: the token
        ids the "random" kind draws from (needed when its weight is positive)."""
        weights = dict(weights or {"list": 1.0, "passage": 1.0})
        unknown = sorted(set(weights) - set(KINDS))
        if unknown:
            raise ValueError(f"unknown recall sequence kinds {unknown}; known: {list(KINDS)}")
        if any(w < 0 for w in weights.values()) or sum(weights.values()) <= 0:
            raise ValueError(f"recall kind weights must be >= 0 and not all 0, got {weights}")
        if weights.get("random", 0) > 0 and not random_ids:
            raise ValueError("the random kind needs random_ids")
        if max_depth < MIN_DEPTH:
            raise ValueError(f"max_depth {max_depth} is below {MIN_DEPTH}")
        self.kinds = [k for k in KINDS if weights.get(k, 0) > 0]
        self.weights = [weights[k] for k in self.kinds]
        self.random_ids = list(random_ids or [])
        if length < 64:
            raise ValueError(f"recall sequences need at least 64 tokens, got {length}")
        if len(stream) < 2 * (length + 1):
            raise ValueError(f"training stream of {len(stream)} tokens is too short")
        if len(words) < TRAIN_LIST_WORDS[1]:
            raise ValueError(f"{len(words)} training words, need at least {TRAIN_LIST_WORDS[1]}")
        self.stream = stream
        self.intro = list(encode(INTRO))
        self.terminator = list(encode(TERMINATOR))
        self.words = [list(encode(" " + w)) for w in words]
        self.names = list(words)
        self.total = length + 1
        self.max_depth = max_depth
        self.rng = random.Random(seed)

    def _crop(self, n):
        start = self.rng.randrange(0, len(self.stream) - n + 1)
        return list(self.stream[start:start + n])

    def next(self):
        """(ids of length + 1, info) with info describing where the recall is."""
        kind = self.rng.choices(self.kinds, weights=self.weights)[0]
        if kind == "list":
            return self._list_sequence()
        return self._passage_sequence(random_spans=kind == "random")

    def _list_sequence(self):
        rng = self.rng
        count = rng.randint(*TRAIN_LIST_WORDS)
        chosen = rng.sample(range(len(self.words)), count)
        depth_low = max(MIN_DEPTH, len(self.intro))
        while True:  # short sequences (the smoke run) take fewer words
            listed = [t for i in chosen for t in self.words[i]]
            needle = self.intro + listed + self.terminator
            recalled = listed + self.terminator
            room = self.total - len(needle) - len(recalled)
            if room >= depth_low or len(chosen) == 1:
                break
            chosen.pop()
        depth_high = min(self.max_depth, room)
        if depth_high < depth_low:
            raise ValueError(f"a sequence of {self.total} tokens has no room for a recall")
        depth = rng.randint(depth_low, depth_high)
        head = rng.randint(0, room - depth)
        between = depth - len(self.intro)
        rest = room - depth - head
        filler = self._crop(head + between + rest)
        ids = (filler[:head] + needle + filler[head:head + between] + self.intro + recalled
               + filler[head + between:])
        info = {"kind": "list", "words": [self.names[i] for i in chosen], "depth": depth,
                "list_start": head + len(self.intro), "list_tokens": len(listed),
                "recall_start": head + len(needle) + depth}
        return ids, info

    def _passage_sequence(self, random_spans=False):
        """One to PASSAGES spans repeated later; no copy overlaps a span or another copy. With
        random_spans, each span is first overwritten with tokens drawn from random_ids."""
        rng = self.rng
        ids = self._crop(self.total)
        taken, pairs = [], []
        lengths = RANDOM_TOKENS if random_spans else PASSAGE_TOKENS
        span_high = min(lengths[1], (self.total - MIN_DEPTH) // 2)
        span_low = min(lengths[0], span_high)
        for _ in range(rng.randint(1, RANDOM_PAIRS if random_spans else PASSAGES)):
            for _attempt in range(20):
                span = rng.randint(span_low, span_high)
                gap = rng.randint(MIN_DEPTH, max(MIN_DEPTH, min(self.max_depth,
                                                                self.total - 2 * span)))
                if self.total - 2 * span - gap < 0:
                    continue
                source = rng.randint(0, self.total - 2 * span - gap)
                target = source + span + gap
                regions = [(source, source + span), (target, target + span)]
                if all(e <= a or b <= s for s, e in regions for a, b in taken):
                    break
            else:
                continue
            taken += regions
            if random_spans:
                ids[source:source + span] = [rng.choice(self.random_ids) for _ in range(span)]
            ids[target:target + span] = ids[source:source + span]
            pairs.append({"source": source, "target": target, "span": span, "gap": gap})
        return ids, {"kind": "random" if random_spans else "passage", "pairs": pairs}


def tiled_row(rng, total, pool, period_low, period_high):
    """(ids, period): a segment of period_low..period_high tokens drawn from pool (with
    replacement), repeated to fill `total` ids: every token after the first period is predictable
    by copying, the densest induction signal (the copy warm-up's rows)."""
    period_high = min(period_high, total // 2)
    if not 1 <= period_low <= period_high or not pool:
        raise ValueError(f"periods {period_low}-{period_high} in {total} tokens, pool of "
                         f"{len(pool)}")
    period = rng.randint(period_low, period_high)
    segment = [rng.choice(pool) for _ in range(period)]
    return (segment * (total // period + 1))[:total], period


def recall_trials(filler, encode, words, context_tokens, depths, trials, list_words, seed):
    """Held-out recall prompts in pagoda eval recall's format: a list of dicts with
    prompt (exactly context_tokens ids), expected (the list's ids), depth and words."""
    if len(words) < list_words:
        raise ValueError(f"{len(words)} words for lists of {list_words}")
    intro, terminator = list(encode(INTRO)), list(encode(TERMINATOR))
    encoded = {w: list(encode(" " + w)) for w in words}
    rng = random.Random(seed)
    out = []
    for depth in depths:
        for _ in range(trials):
            chosen = rng.sample(list(words), list_words)
            listed = [t for w in chosen for t in encoded[w]]
            needle = len(intro) + len(listed) + len(terminator)
            tail = depth - len(intro)
            head = context_tokens - needle - depth
            if tail < 0 or head < 0:
                raise ValueError(f"depth {depth} leaves no room for a list of {needle} tokens "
                                 f"in {context_tokens}")
            if len(filler) < head + tail:
                raise ValueError(f"{len(filler)} filler tokens for {head + tail}")
            start = rng.randrange(0, len(filler) - (head + tail) + 1)
            piece = list(filler[start:start + head + tail])
            prompt = piece[:head] + intro + listed + terminator + piece[head:] + intro
            out.append({"prompt": prompt, "expected": listed, "depth": depth, "words": chosen})
    return out


def copy_trials(filler, random_ids, context_tokens, distances, trials, span, seed):
    """Induction probes: a span of `span` distinct tokens drawn from random_ids is placed in
    filler and repeated `distance` tokens later (end of the span to the start of its copy); the prompt
    (exactly context_tokens ids) ends with the copy's first token and `expected` is the rest of
    the span. Only looking back predicts it: a direct measure of the copy mechanism, whatever the
    list format. Same dict keys as recall_trials (depth = distance)."""
    rng = random.Random(seed)
    out = []
    for distance in distances:
        head = context_tokens - span - distance - 1
        if head < 0 or distance < 1 or not 2 <= span <= len(random_ids):
            raise ValueError(f"distance {distance} with spans of {span} does not fit in "
                             f"{context_tokens} tokens")
        if len(filler) < head + distance:
            raise ValueError(f"{len(filler)} filler tokens for {head + distance}")
        for _ in range(trials):
            drawn = rng.sample(random_ids, span)  # distinct: one place to copy from
            start = rng.randrange(0, len(filler) - (head + distance) + 1)
            piece = list(filler[start:start + head + distance])
            prompt = piece[:head] + drawn + piece[head:] + drawn[:1]
            out.append({"prompt": prompt, "expected": drawn[1:], "depth": distance,
                        "words": []})
    return out


def in_place_accuracy(expected, produced):
    """Tokens of `produced` equal to `expected` at the same place, over len(expected)."""
    hits = sum(1 for i, t in enumerate(expected) if i < len(produced) and produced[i] == t)
    return hits, len(expected)
