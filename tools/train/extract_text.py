#!/usr/bin/env python3
"""Extracts the public-domain English training text for the bundled model (models/pagoda-tiny).

Sources (Debian packages, installed by scripts/install-deps.sh plus the `bible-kjv` reader):
  - r-cran-janeaustenr: Jane Austen's six novels, stored as R data; read through Rscript
    (r-base-core comes with the package as a dependency).
  - bible-kjv-text: the King James Bible, in a compressed format read by the `bible` program of
    the bible-kjv package (`apt-get install bible-kjv`; needed here only, not at test time).

Each book is one document. The last --heldout-fraction of every book (cut at a paragraph or verse
boundary) is held out for evaluation and never trained on.

Outputs in --out (default .cache/train-data, git-ignored):
  train.jsonl      one document per line: {"source", "title", "text"}
  heldout.jsonl    the held-out tail of every book, same shape
  heldout.txt      all held-out text, documents separated by a blank line
  heldout_sample.txt  ~80 KB drawn from the held-out text of every source; committed as
                   models/pagoda-tiny/heldout.txt and used by the eval tests
  chat.jsonl       synthetic chat conversations built from the training text only
                   (see chat_samples.py), so the model learns the chat template's shape
  manifest.json    sizes and counts

Python standard library only. Usage: python3 tools/train/extract_text.py [--out DIR]
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import chat_samples  # noqa: E402

AUSTEN_NOVELS = [
    ("sensesensibility", "Sense and Sensibility"),
    ("prideprejudice", "Pride and Prejudice"),
    ("mansfieldpark", "Mansfield Park"),
    ("emma", "Emma"),
    ("northangerabbey", "Northanger Abbey"),
    ("persuasion", "Persuasion"),
]

# Abbreviations printed by `bible`, in canonical order, with the book names used as headings.
KJV_BOOKS = [
    ("Ge", "Genesis"), ("Exo", "Exodus"), ("Lev", "Leviticus"), ("Num", "Numbers"),
    ("Deu", "Deuteronomy"), ("Josh", "Joshua"), ("Jdgs", "Judges"), ("Ruth", "Ruth"),
    ("1Sm", "1 Samuel"), ("2Sm", "2 Samuel"), ("1Ki", "1 Kings"), ("2Ki", "2 Kings"),
    ("1Chr", "1 Chronicles"), ("2Chr", "2 Chronicles"), ("Ezra", "Ezra"), ("Neh", "Nehemiah"),
    ("Est", "Esther"), ("Job", "Job"), ("Psa", "Psalms"), ("Prv", "Proverbs"),
    ("Eccl", "Ecclesiastes"), ("SSol", "Song of Solomon"), ("Isa", "Isaiah"),
    ("Jer", "Jeremiah"), ("Lam", "Lamentations"), ("Eze", "Ezekiel"), ("Dan", "Daniel"),
    ("Hos", "Hosea"), ("Joel", "Joel"), ("Amos", "Amos"), ("Obad", "Obadiah"),
    ("Jonah", "Jonah"), ("Mic", "Micah"), ("Nahum", "Nahum"), ("Hab", "Habakkuk"),
    ("Zep", "Zephaniah"), ("Hag", "Haggai"), ("Zec", "Zechariah"), ("Mal", "Malachi"),
    ("Mat", "Matthew"), ("Mark", "Mark"), ("Luke", "Luke"), ("John", "John"), ("Acts", "Acts"),
    ("Rom", "Romans"), ("1Cor", "1 Corinthians"), ("2Cor", "2 Corinthians"),
    ("Gal", "Galatians"), ("Eph", "Ephesians"), ("Phi", "Philippians"), ("Col", "Colossians"),
    ("1Th", "1 Thessalonians"), ("2Th", "2 Thessalonians"), ("1Tim", "1 Timothy"),
    ("2Tim", "2 Timothy"), ("Titus", "Titus"), ("Phmn", "Philemon"), ("Heb", "Hebrews"),
    ("Jas", "James"), ("1Pet", "1 Peter"), ("2Pet", "2 Peter"), ("1Jn", "1 John"),
    ("2Jn", "2 John"), ("3Jn", "3 John"), ("Jude", "Jude"), ("Rev", "Revelation"),
]

VERSE_LINE = re.compile(r"^(\d?[A-Za-z]+)(\d+):(\d+) (.*)$")


def fail(message):
    print(f"extract_text: error: {message}", file=sys.stderr)
    sys.exit(1)


def run(command):
    try:
        return subprocess.run(command, check=True, capture_output=True, text=True).stdout
    except FileNotFoundError:
        fail(f"'{command[0]}' not found; see this script's docstring for the Debian package")
    except subprocess.CalledProcessError as error:
        fail(f"{' '.join(command[:2])} failed ({error.returncode}): {error.stderr.strip()[:500]}")


def unwrap_paragraphs(lines):
    """Joins hard-wrapped lines into paragraphs (blank lines separate paragraphs)."""
    paragraphs, current = [], []
    for line in lines:
        line = line.strip()
        if line:
            current.append(line)
        elif current:
            paragraphs.append(" ".join(current))
            current = []
    if current:
        paragraphs.append(" ".join(current))
    # _word_ marks italics in the Gutenberg text; the markers are noise for a language model.
    return [re.sub(r"\s+", " ", p.replace("_", "")).strip() for p in paragraphs]


def austen_documents():
    with tempfile.TemporaryDirectory() as tmp:
        names = ", ".join(f'"{name}"' for name, _ in AUSTEN_NOVELS)
        script = (
            "suppressMessages(library(janeaustenr)); "
            f"for (n in c({names})) writeLines(enc2utf8(get(n)), "
            f"file.path('{tmp}', paste0(n, '.txt')), useBytes = TRUE)"
        )
        run(["Rscript", "-e", script])
        documents = []
        for name, title in AUSTEN_NOVELS:
            with open(os.path.join(tmp, name + ".txt"), encoding="utf-8") as f:
                paragraphs = unwrap_paragraphs(f.read().split("\n"))
            if len(paragraphs) < 100:
                fail(f"janeaustenr novel '{name}' has only {len(paragraphs)} paragraphs")
            documents.append({"source": "austen", "title": title, "units": paragraphs})
    return documents


def kjv_documents():
    output = run(["bible", "-f", "Gen1:1-Rev22:21"])
    names = dict(KJV_BOOKS)
    books, order = {}, []
    for line in output.split("\n"):
        match = VERSE_LINE.match(line.strip())
        if not match:
            continue
        abbreviation, chapter, _verse, text = match.groups()
        if abbreviation not in names:
            fail(f"bible printed an unknown book abbreviation '{abbreviation}'")
        if abbreviation not in books:
            books[abbreviation] = []
            order.append(abbreviation)
        chapters = books[abbreviation]
        if not chapters or chapters[-1][0] != chapter:
            chapters.append((chapter, []))
        chapters[-1][1].append(text.strip())
    if len(order) != 66:
        fail(f"expected 66 books from `bible`, got {len(order)}")
    documents = []
    for abbreviation in order:
        # One unit per verse; a chapter heading opens each chapter's first verse.
        units = []
        for chapter, verses in books[abbreviation]:
            units.append(f"Chapter {chapter}\n\n{verses[0]}")
            units.extend(verses[1:])
        documents.append({"source": "kjv", "title": names[abbreviation], "units": units,
                          "joiner": "\n"})
    return documents


def render(title, units, joiner):
    """Renders a document: title, blank line, units joined (paragraphs by blank lines)."""
    body = joiner.join(units)
    body = body.replace("\nChapter ", "\n\nChapter ") if joiner == "\n" else body
    return f"{title}\n\n{body}\n" if title else body + "\n"


def split_document(document, heldout_fraction):
    units = document["units"]
    joiner = document.get("joiner", "\n\n")
    total = sum(len(u) for u in units)
    # Cut at the unit boundary where the tail first reaches the held-out fraction.
    tail, cut = 0, len(units)
    while cut > 1 and tail < heldout_fraction * total:
        cut -= 1
        tail += len(units[cut])
    train = {"source": document["source"], "title": document["title"],
             "text": render(document["title"], units[:cut], joiner)}
    heldout = {"source": document["source"], "title": document["title"],
               "text": render("", units[cut:], joiner)}
    return train, heldout


def heldout_sample(heldout_docs, target_bytes):
    """Takes the start of every held-out tail, Austen and KJV weighted equally by bytes."""
    by_source = {}
    for doc in heldout_docs:
        by_source.setdefault(doc["source"], []).append(doc)
    pieces = []
    for source in sorted(by_source):
        docs = by_source[source]
        per_source = target_bytes // len(by_source)
        per_doc = max(400, per_source // len(docs))
        budget = per_source
        for doc in docs:
            if budget <= 0:
                break
            take = min(per_doc, budget)
            text = doc["text"]
            if len(text) > take:
                # End on a line boundary so no sentence is cut in half.
                end = text.rfind("\n", 0, take)
                text = text[: end if end > 0 else take].rstrip() + "\n"
            pieces.append(text.strip())
            budget -= len(text)
    return "\n\n".join(pieces) + "\n"


def write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=".cache/train-data")
    parser.add_argument("--heldout-fraction", type=float, default=0.05)
    parser.add_argument("--sample-bytes", type=int, default=80_000)
    parser.add_argument("--chat-fraction", type=float, default=0.05,
                        help="chat conversations as a fraction of the training bytes")
    parser.add_argument("--seed", type=int, default=1234)
    args = parser.parse_args()
    if not 0.0 < args.heldout_fraction < 0.5:
        fail(f"--heldout-fraction must be in (0, 0.5), got {args.heldout_fraction}")

    documents = austen_documents() + kjv_documents()
    train_docs, heldout_docs = [], []
    for document in documents:
        train, heldout = split_document(document, args.heldout_fraction)
        train_docs.append(train)
        heldout_docs.append(heldout)

    chats = chat_samples.build(train_docs, args.chat_fraction, args.seed)

    os.makedirs(args.out, exist_ok=True)
    write_jsonl(os.path.join(args.out, "train.jsonl"), train_docs)
    write_jsonl(os.path.join(args.out, "heldout.jsonl"), heldout_docs)
    write_jsonl(os.path.join(args.out, "chat.jsonl"), chats)
    with open(os.path.join(args.out, "heldout.txt"), "w", encoding="utf-8") as f:
        f.write("\n\n".join(d["text"].strip() for d in heldout_docs) + "\n")
    sample = heldout_sample(heldout_docs, args.sample_bytes)
    with open(os.path.join(args.out, "heldout_sample.txt"), "w", encoding="utf-8") as f:
        f.write(sample)

    manifest = {
        "sources": {
            "austen": "Debian r-cran-janeaustenr (Project Gutenberg texts, public domain)",
            "kjv": "Debian bible-kjv-text (King James Version, 1611, public domain)",
        },
        "heldout_fraction": args.heldout_fraction,
        "documents": len(train_docs),
        "train_bytes": sum(len(d["text"].encode()) for d in train_docs),
        "heldout_bytes": sum(len(d["text"].encode()) for d in heldout_docs),
        "heldout_sample_bytes": len(sample.encode()),
        "chat_conversations": len(chats),
        "chat_bytes": sum(len(m["content"].encode()) for c in chats for m in c["messages"]),
    }
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=2)
    print(json.dumps(manifest, indent=2))


if __name__ == "__main__":
    if shutil.which("Rscript") is None:
        fail("Rscript not found: apt-get install r-base-core (r-cran-janeaustenr needs it)")
    main()
