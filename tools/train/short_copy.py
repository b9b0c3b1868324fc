"""Short copy rows for train.py (--short-copy-rows): tiled random-token rows much shorter than the
context, trained in the same step as the text rows (a second forward and a loss sum), with a
curriculum on their length.

Why short: at initialisation a query spreads its attention over every earlier position, so the share
that lands on the one position worth copying is about 1/row length. Rows of 64-128 tokens give the
induction circuit a gradient 16-30x stronger than 2,048-token rows, where it is drowned (docs/MODEL.md,
the fourth attempt). Once copy accuracy at the current length passes a bar, rows grow to the next
length (e.g. 128 -> 256 -> 512 -> 2,048) keeping about the same tokens per step.

Pure Python plus torch at call time; not thread safe (one curriculum per training run)."""
import random

PERIOD_LOW = 8
PERIOD_HIGH_AT_128 = 48  # periods 8-48 in 128-token rows, scaled with the row length


def parse_lengths(text):
    """'128,256,512,2048' -> [128, 256, 512, 2048]; raises ValueError naming the problem."""
    try:
        lengths = [int(x) for x in text.split(",")]
    except ValueError:
        raise ValueError(f"lengths must be integers separated by commas, got '{text}'") from None
    if not lengths or min(lengths) < 4 * PERIOD_LOW or lengths != sorted(set(lengths)):
        raise ValueError(f"lengths must be increasing and >= {4 * PERIOD_LOW}, got '{text}'")
    return lengths


def period_range(length):
    """(lowest, highest) period of a tiled row of `length` tokens: 8-48 at 128, the top scaled
    with the length, at most half the row (so every row holds at least one full copy)."""
    high = max(PERIOD_LOW, PERIOD_HIGH_AT_128 * length // 128)
    return PERIOD_LOW, max(PERIOD_LOW, min(high, length // 2))


def tiled(rng, length, pool):
    """(ids of length + 1 tokens, period): a random segment from pool repeated to fill the row."""
    low, high = period_range(length)
    period = rng.randint(low, high)
    segment = [rng.choice(pool) for _ in range(period)]
    return (segment * ((length + 1) // period + 1))[: length + 1], period


def copy_mask(periods, length):
    """[rows][length] booleans: target k (token k + 1) is predictable by copying iff k + 1 >= period."""
    return [[k + 1 >= p for k in range(length)] for p in periods]


class Curriculum:
    """The current length's rows for each step and the advance rule.

    rows_at_first: rows per step at the first length; later lengths keep about the same tokens
    (rows_at_first * lengths[0] / length, at least 2 rows). advance_at: copy accuracy (over the
    copyable targets of the training rows, smoothed) that moves to the next length. pool: token ids
    to draw from (most frequent first); alphabet > 0 keeps the first `alphabet` of them."""

    def __init__(self, lengths, rows_at_first, advance_at, pool, alphabet, seed):
        if rows_at_first < 1 or not pool or not 0 < advance_at <= 1:
            raise ValueError(f"short copy rows: rows {rows_at_first}, pool {len(pool)}, "
                             f"advance_at {advance_at}")
        self.lengths, self.rows_at_first, self.advance_at = list(lengths), rows_at_first, advance_at
        self.pool = list(pool[:alphabet] if alphabet else pool)
        self.rng = random.Random(seed)
        self.stage, self.smoothed, self.history = 0, None, []

    @property
    def length(self):
        return self.lengths[self.stage]

    def rows(self):
        return max(2, self.rows_at_first * self.lengths[0] // self.length)

    def batch(self):
        """(ids [rows][length + 1], mask [rows][length]) for one step at the current length."""
        made = [tiled(self.rng, self.length, self.pool) for _ in range(self.rows())]
        return [ids for ids, _ in made], copy_mask([p for _, p in made], self.length)

    def observe(self, accuracy, step):
        """Feeds one training-batch copy accuracy; advances a stage when the smoothed value passes
        the bar (the smoothing restarts at each new length). Returns True when it advanced."""
        self.smoothed = accuracy if self.smoothed is None else 0.7 * self.smoothed + 0.3 * accuracy
        if self.smoothed >= self.advance_at and self.stage + 1 < len(self.lengths):
            self.history.append({"step": step, "from": self.length, "accuracy": round(self.smoothed, 3)})
            self.stage += 1
            self.smoothed = None
            return True
        return False


def monitor_rows(lengths, pool, rows, seed):
    """Fixed held-out probe rows per length: {length: (ids, mask)}, drawn from the whole pool."""
    rng = random.Random(seed)
    out = {}
    for length in lengths:
        made = [tiled(rng, length, pool) for _ in range(rows)]
        out[length] = ([ids for ids, _ in made], copy_mask([p for _, p in made], length))
    return out


def masked_accuracy(logits, targets, mask):
    """Greedy accuracy of logits [rows, length, vocab] on the masked targets, as a 0-dim tensor."""
    hits = (logits.argmax(-1) == targets) & mask
    return hits.sum().float() / mask.sum().clamp(min=1).float()
