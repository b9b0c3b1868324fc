"""Gap rows for train.py (--gap-rows): a copy curriculum on the distance between a segment and its
copy, with natural text in between, trained in the same step as the text rows (a forward of its own
and a loss on the copyable targets only).

Why: the fifth attempt's tiled random-token rows formed a copy circuit (held-out copy accuracy 0.97+
in rows of 128-2,048 tokens) that never fired when the two occurrences were separated by text
(copy100 / copy1000 and list recall stayed at 0). A gap row is a crop of training text in which
segments are placed and copied G tokens later, text in between:

    <text> SEGMENT <text: the gap> SEGMENT' <text> ...

- "random": SEGMENT is 8-32 tokens drawn from the pool (every token id but the special ones) and
  SEGMENT' is the same; the targets from the copy's second token on are copyable (its first token
  has no cue, as in the copy100 probe).
- "list": the recall prompt format of docs/EVAL.md: INTRO w1 .. wN TERMINATOR, then text, then
  INTRO w1 .. wN TERMINATOR again; the gap is the recall depth (end of the first TERMINATOR to the end
  of the second INTRO, the cue), and the copyable targets are the recalled words and TERMINATOR.

The curriculum's stages are the gaps (default 0, 16, 64, 256, 1,024, 1,750): at stage k a pair's gap
is drawn uniformly from [previous stage's gap, gaps[k]], the row is the shortest of 128, 256, 512,
1,024, 2,048 tokens that holds the longest gap and a segment (so short distances keep the strong gradient of short rows), rows
per step keep about the same tokens, and the share of list segments grows linearly with the stage
from 0 to list_share. A stage ends when the smoothed training copy accuracy passes advance_at.

below_share (--gap-below-share): the share of pairs whose gap is drawn from [0, gaps[k]] instead of
the stage's band. The sixth attempt (below_share 0) learned its last band, 1,024-1,750, to 0.97
training copy accuracy while the held-out probes at 100 and 1,000 tokens stayed at 0-0.04: a copy
that works only at the distances it was last trained on. Pairs below the band keep every distance
trained.

cue weight (train.py --gap-cue-weight, with batch_with_cues()): each list copy's first recalled token,
the one predicted at the cue (the copy's INTRO), is one target per list against ~17 for the rest, and
it is where the seventeenth candidate fails most (session 19, pagoda eval's lists on the CPU: a wrong
first token while the rest is copied right, or the whole list derailed from it). In the filler the
cue's last token (":") is common (the KJV's verses), so finding the list from the cue needs more than
the previous token; the weight gives that target more of the gap loss.

distractors (--gap-distractors K): K of a list's own words, each alone, written over the text between
the list and its copy (never over another pair's tokens). The twenty-second attempt found the candidate
losing its place at word boundaries (a later word's first token right 0.85 of the time teacher-forced,
inner pieces 0.91): a copy that finds the next word from the previous token alone goes wrong when that
token also occurs elsewhere in the context, as the list's words do in the filler. Words repeated
between the pair make that wrong often, so only a match on more than the previous token recalls the list.
They are drawn from a generator of their own: with K = 0 the rows are drawn exactly as before.

corrupt_share (--gap-corrupt-share): the share of a copy's copyable tokens that the model READS as a
random pool token while its targets stay the true ones (inputs() gives the rows as read). The
sixteenth attempt reached 0.82 teacher-forced recall with greedy recall at 0.3: one wrong token in
free-running decoding derails the rest of the list, since an induction-style copy finds its place
in the source from the previous token. Reading a wrong token and still having to produce the next
true one trains the copy to keep its place from the tokens before it. corrupt_from "pool" draws the
wrong token from the random segments' pool; "words" from the tokens of the training words, the kind of
wrong token greedy decoding of a list actually produces (another word's piece).

Standard library only (the loss and accuracy are computed in train.py); not thread safe."""
import random

ROW_LENGTHS = (128, 256, 512, 1024, 2048)
SEGMENT = (8, 32)  # random segment lengths
LIST_WORDS = (4, 12)
HEAD_ROOM = 16  # the least text before the first segment (the row starts as text)


def parse_gaps(text):
    """'0,16,64' -> [0, 16, 64]; raises ValueError naming the problem."""
    try:
        gaps = [int(x) for x in text.split(",")]
    except ValueError:
        raise ValueError(f"gaps must be integers separated by commas, got '{text}'") from None
    if not gaps or gaps[0] < 0 or gaps != sorted(set(gaps)):
        raise ValueError(f"gaps must be increasing and >= 0, got '{text}'")
    return gaps


def row_length(gap, segment_room, context):
    """The shortest of ROW_LENGTHS (at most context) holding head room, a segment of segment_room
    tokens, the gap and the copy; ValueError when even the context does not."""
    need = HEAD_ROOM + 2 * segment_room + gap
    for length in ROW_LENGTHS:
        if need <= length <= context:
            return length
    if need <= context:
        return context
    raise ValueError(f"a gap of {gap} with segments of {segment_room} tokens needs {need} > "
                     f"context {context}")


class GapRows:
    """Rows and the advance rule. stream: training token ids (the text); pool: ids for random
    segments; words: encoded training words (lists of ids; never the eval's or held-out words);
    intro / terminator: the recall format's ids; rows_at_first: rows per step at the first stage
    (later stages keep about the same tokens, at least 2 rows)."""

    def __init__(self, stream, gaps, context, rows_at_first, advance_at, pool, words, intro,
                 terminator, list_share, seed, below_share=0.0, corrupt_share=0.0,
                 corrupt_from="pool", distractors=0):
        if rows_at_first < 1 or not pool or not 0 < advance_at <= 1 or not 0 <= list_share <= 1 \
                or not 0 <= below_share <= 1 or not 0 <= corrupt_share < 1:
            raise ValueError(f"gap rows: rows {rows_at_first}, pool {len(pool)}, advance_at "
                             f"{advance_at}, list_share {list_share}, below_share {below_share}, "
                             f"corrupt_share {corrupt_share}")
        if distractors < 0:
            raise ValueError(f"gap rows: distractors {distractors} must be >= 0")
        self.distractors = distractors
        self.distractor_rng = random.Random(seed + 2)
        if corrupt_from not in ("pool", "words"):
            raise ValueError(f"gap rows: corrupt_from must be 'pool' or 'words', got '{corrupt_from}'")
        self.below_share, self.corrupt_share = below_share, corrupt_share
        self.corrupt_pool = list(pool) if corrupt_from == "pool" else sorted(
            {t for w in words for t in w})
        if corrupt_share > 0 and len(self.corrupt_pool) < 2:
            raise ValueError(f"gap rows: {len(self.corrupt_pool)} tokens to corrupt with")
        # A separate generator: with corrupt_share 0 the rows are drawn exactly as before.
        self.corrupt_rng = random.Random(seed + 1)
        if list_share > 0 and len(words) < LIST_WORDS[1]:
            raise ValueError(f"gap rows: {len(words)} words for lists of up to {LIST_WORDS[1]}")
        self.gaps, self.context = list(gaps), context
        self.intro, self.terminator = list(intro), list(terminator)
        self.list_share = list_share
        # Room for a list segment: the longest list of words of the mean length, rounded up (a
        # longer draw that does not fit is placed at another gap or left out of that row).
        mean_word = -(-sum(len(w) for w in words) // max(1, len(words)))
        self.list_room = len(self.intro) + LIST_WORDS[1] * mean_word + len(self.terminator)
        self.lengths = []
        for stage, gap in enumerate(self.gaps):
            room = SEGMENT[1] if self.list_fraction(stage) == 0 else max(SEGMENT[1],
                                                                          self.list_room)
            self.lengths.append(row_length(gap, room, context))
        if len(stream) < 2 * (max(self.lengths) + 1):
            raise ValueError(f"training stream of {len(stream)} tokens is too short")
        self.stream, self.pool, self.words = stream, list(pool), [list(w) for w in words]
        self.rows_at_first, self.advance_at = rows_at_first, advance_at
        self.rng = random.Random(seed)
        self.stage, self.smoothed, self.history = 0, None, []

    @property
    def gap(self):
        return self.gaps[self.stage]

    @property
    def length(self):
        return self.lengths[self.stage]

    def gap_range(self):
        return (self.gaps[self.stage - 1] if self.stage else 0), self.gap

    def list_fraction(self, stage=None):
        """Share of list segments at a stage (default: the current one): 0 at the first,
        list_share at the last."""
        stage = self.stage if stage is None else stage
        if len(self.gaps) == 1:
            return self.list_share
        return self.list_share * stage / (len(self.gaps) - 1)

    def rows(self):
        return max(2, self.rows_at_first * self.lengths[0] // self.length)

    def _segment(self, rng, kind):
        """(the segment, offsets in the copy that are masked targets, its words): lists copy
        INTRO + words + TERMINATOR with the words and TERMINATOR masked (their gap counts the cue
        INTRO, the recall depth); a random segment has no words."""
        if kind == "random":
            seg = [rng.choice(self.pool) for _ in range(rng.randint(*SEGMENT))]
            return seg, list(range(1, len(seg))), []
        count = rng.randint(*LIST_WORDS)
        chosen = [self.words[i] for i in rng.sample(range(len(self.words)), count)]
        seg = self.intro + [t for w in chosen for t in w] + self.terminator
        return seg, list(range(len(self.intro), len(seg))), chosen

    def _place_distractors(self, ids, words, begin, end, taken):
        """Writes self.distractors of `words`, each alone, over ids[begin:end] where no segment
        placed so far is (taken: [start, end) regions); a draw that does not fit is skipped. They
        are not added to taken, so the row's pairs are drawn as without them (a later pair may
        overwrite one)."""
        rng = self.distractor_rng
        for _ in range(self.distractors):
            word = rng.choice(words)
            if end - begin < len(word):
                return
            at = rng.randint(begin, end - len(word))
            if all(at + len(word) <= a or b <= at for a, b in taken):
                ids[at:at + len(word)] = word

    def make_row(self):
        """(ids of length + 1, mask of length, pairs): mask[k] is True iff target k (ids[k + 1])
        is a copyable token of a copy; pairs lists each placed pair (kind, source, target, span,
        gap)."""
        rng, length = self.rng, self.length
        start = rng.randrange(0, len(self.stream) - length)
        ids = list(self.stream[start:start + length + 1])
        mask = [False] * length
        band = self.gap_range()
        taken, pairs = [], []
        for _ in range(max(1, length // 64)):
            kind = "list" if rng.random() < self.list_fraction() else "random"
            # (no draw when below_share is 0: the sixth attempt's rows stay as they were)
            below = self.below_share > 0 and rng.random() < self.below_share
            low, high = (0, self.gap) if below else band
            seg, masked, words = self._segment(rng, kind)
            span = len(seg)
            for _attempt in range(20):
                gap = rng.randint(low, high)
                # A list's gap is the recall depth: the text between the pair plus the cue.
                between = max(0, gap - len(self.intro)) if kind == "list" else gap
                last = length + 1 - 2 * span - between
                if last < HEAD_ROOM:
                    continue
                source = rng.randint(HEAD_ROOM, last)
                target = source + span + between
                regions = [(source, source + span), (target, target + span)]
                if all(e <= a or b <= s for s, e in regions for a, b in taken):
                    break
            else:
                continue
            taken += regions
            ids[source:source + span] = seg
            ids[target:target + span] = seg
            if words and self.distractors:
                self._place_distractors(ids, words, source + span, target, taken)
            for offset in masked:
                mask[target + offset - 1] = True
            pairs.append({"kind": kind, "source": source, "target": target, "span": span,
                          "gap": between + (len(self.intro) if kind == "list" else 0),
                          # the mask index of a list copy's first recalled token (predicted at the cue)
                          "cue": target + masked[0] - 1 if kind == "list" else None})
        return ids, mask, pairs

    def inputs(self, ids, mask):
        """The row as the model reads it (length tokens): ids[:-1] with each copyable token that
        is itself followed by a copyable target (mask[k - 1] and mask[k]: a token inside a copy,
        not its last) replaced, with probability corrupt_share, by a random token of the corrupt
        pool (corrupt_from) other than itself. The targets stay ids[1:]: at a corrupted position the model reads a wrong token
        and must still produce the copy's next true one."""
        read = list(ids[:-1])
        if self.corrupt_share == 0:
            return read
        rng = self.corrupt_rng
        for k in range(1, len(read)):
            if mask[k - 1] and mask[k] and rng.random() < self.corrupt_share:
                token = rng.choice(self.corrupt_pool)
                while token == read[k]:
                    token = rng.choice(self.corrupt_pool)
                read[k] = token
        return read

    def batch(self):
        """(ids [rows][length + 1], mask [rows][length], inputs [rows][length]) for one step at
        the current stage: the targets are ids[1:], the model reads inputs (ids[:-1] unless
        corrupt_share > 0)."""
        return self.batch_with_cues()[:3]

    def batch_with_cues(self):
        """batch() and, per row, the mask indices of its list copies' first recalled tokens (the
        targets predicted at each copy's cue)."""
        made = [self.make_row() for _ in range(self.rows())]
        return ([ids for ids, _, _ in made], [mask for _, mask, _ in made],
                [self.inputs(ids, mask) for ids, mask, _ in made],
                [[p["cue"] for p in pairs if p["cue"] is not None] for _, _, pairs in made])

    def observe(self, accuracy, step):
        """Feeds one training-batch copy accuracy; advances a stage when the smoothed value passes
        the bar (the smoothing restarts at each stage). Returns True when it advanced."""
        self.smoothed = accuracy if self.smoothed is None else 0.7 * self.smoothed + 0.3 * accuracy
        if self.smoothed >= self.advance_at and self.stage + 1 < len(self.gaps):
            self.history.append({"step": step, "from_gap": self.gap,
                                 "accuracy": round(self.smoothed, 3)})
            self.stage += 1
            self.smoothed = None
            return True
        return False
