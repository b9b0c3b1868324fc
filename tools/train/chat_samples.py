"""Synthetic chat conversations for the bundled model, built from the training text only.

The corpus has no dialogue in chat form, so a model trained on it alone would not know where an
assistant turn starts or ends. Each conversation here asks the assistant to continue a passage and
answers with the passage's real continuation; a few percent of the training bytes in this shape
teach the template (<|user|> ... <|eos|> <|assistant|> ... <|eos|>) and when to stop.

Standard library only; deterministic for a given seed.
"""

import random
import re

USER_TEMPLATES = [
    "Continue this passage: {opening}",
    "{opening}",
    "Please continue the story: {opening}",
    "What comes next? {opening}",
    "Write the next few sentences after this: {opening}",
]
KJV_USER_TEMPLATES = [
    "Continue the verse: {opening}",
    "{opening}",
    "What follows this verse? {opening}",
]
SYSTEM_PROMPT = "You are a helpful assistant who writes in the style of classic English books."

SENTENCE_END = re.compile(r"(?<=[.!?])[\"']?\s+(?=[\"'A-Z])")


ABBREVIATIONS = ("Mr.", "Mrs.", "Dr.", "St.", "Col.", "Capt.", "Messrs.")


def split_sentences(paragraph):
    sentences = []
    for piece in SENTENCE_END.split(paragraph):
        piece = piece.strip()
        if not piece:
            continue
        # "Mrs. Bennet" is not two sentences.
        if sentences and sentences[-1].endswith(ABBREVIATIONS):
            sentences[-1] += " " + piece
        else:
            sentences.append(piece)
    return sentences


def austen_candidates(text):
    """(opening, continuation) pairs from paragraphs of at least two sentences."""
    pairs = []
    for paragraph in text.split("\n\n"):
        if not 120 <= len(paragraph) <= 1500:
            continue
        sentences = split_sentences(paragraph)
        if len(sentences) < 2 or len(sentences[0]) < 20:
            continue
        pairs.append((sentences[0], " ".join(sentences[1:])))
    return pairs


def kjv_candidates(text):
    """(verse, next one or two verses) pairs within a chapter."""
    pairs = []
    for chapter in text.split("\n\n"):
        verses = [v.strip() for v in chapter.split("\n") if v.strip()]
        verses = [v for v in verses if not v.startswith("Chapter ")]
        for i in range(0, len(verses) - 2, 3):
            pairs.append((verses[i], " ".join(verses[i + 1:i + 3])))
    return pairs


def build(train_docs, fraction, seed):
    """Returns conversations [{"messages": [{"role", "content"}, ...]}] totalling about
    `fraction` of the training bytes, half from each source where both exist."""
    rng = random.Random(seed)
    by_source = {"austen": [], "kjv": []}
    for doc in train_docs:
        if doc["source"] == "austen":
            by_source["austen"] += austen_candidates(doc["text"])
        elif doc["source"] == "kjv":
            by_source["kjv"] += kjv_candidates(doc["text"])
    sources = [s for s in by_source if by_source[s]]
    if not sources or fraction <= 0:
        return []
    budget = fraction * sum(len(d["text"]) for d in train_docs) / len(sources)
    conversations = []
    for source in sources:
        pairs = by_source[source]
        rng.shuffle(pairs)
        templates = KJV_USER_TEMPLATES if source == "kjv" else USER_TEMPLATES
        used = 0
        for opening, continuation in pairs:
            if used >= budget:
                break
            messages = []
            if rng.random() < 0.2:
                messages.append({"role": "system", "content": SYSTEM_PROMPT})
            user = rng.choice(templates).format(opening=opening)
            messages.append({"role": "user", "content": user})
            messages.append({"role": "assistant", "content": continuation})
            conversations.append({"messages": messages})
            used += len(user) + len(continuation)
    rng.shuffle(conversations)
    return conversations
