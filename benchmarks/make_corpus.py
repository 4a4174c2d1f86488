"""A real-looking news corpus of a chosen size, for the scale benchmarks (never for tests, never committed).

Real sentences from the shared corpora (Reuters-21578 bodies and CNN/DM articles, ../shared/data) are resampled
into documents whose sentence counts follow the real documents' distribution (a document's length is drawn
from the empirical sentence counts of the same corpora); headlines are real Reuters titles. Deterministic from
`--seed`: the same arguments write the same bytes. Formats: English Gigaword's LDC SGML layout (`<DOC id=...
type="story">`, `<HEADLINE>`, `<TEXT>` with one `<P>` per 1-3 sentences; gzipped like the LDC files, split into
files of `--file-mb` uncompressed) and JSON Lines ({"id", "title", "text"}, paragraphs separated by blank lines).

    python benchmarks/make_corpus.py --size 100MB --format gigaword --out /tmp/corpus-100mb --seed 0
    python benchmarks/make_corpus.py --size 1GB --format jsonl --out /tmp/corpus-1gb
"""
from __future__ import annotations

import argparse
import gzip
import html
import json
import re
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"
_SPLIT = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"'])")


def parse_size(text: str) -> int:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([KMG]?B)", text.strip().upper())
    if not m:
        raise SystemExit(f"--size {text!r}: e.g. 10MB, 100MB, 1GB")
    return int(float(m.group(1)) * {"B": 1, "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30}[m.group(2)])


def load_pool() -> tuple[list[str], list[int], list[str]]:
    """(sentences, sentences per real document, headlines) from Reuters bodies and CNN/DM articles."""
    sentences: list[str] = []
    lengths: list[int] = []
    titles: list[str] = []
    for line in open(SHARED / "open_domain" / "reuters21578.jsonl", encoding="utf-8"):
        rec = json.loads(line)
        body = " ".join((rec.get("body") or "").split())
        if rec.get("title"):
            titles.append(" ".join(rec["title"].split()))
        if len(body) < 200:
            continue
        sents = [s for s in _SPLIT.split(body) if len(s) > 20]
        sentences += sents
        lengths.append(len(sents))
    for split in ("train", "val", "test"):
        for line in open(SHARED / "in_domain" / f"cnndm_{split}.jsonl", encoding="utf-8"):
            sents = [s for s in json.loads(line)["article"].split(" . ") if len(s) > 20]
            sentences += [s + " ." for s in sents]
            lengths.append(len(sents))
    return sentences, [n for n in lengths if n > 0], titles


def documents(seed: int):
    """An endless, deterministic stream of (id, title, paragraphs)."""
    sentences, lengths, titles = load_pool()
    rng = np.random.default_rng(seed)
    n = 0
    while True:
        k = int(lengths[rng.integers(len(lengths))])
        picks = rng.integers(len(sentences), size=k)
        sents = [sentences[i] for i in picks]
        paragraphs, i = [], 0
        while i < len(sents):
            step = int(rng.integers(1, 4))
            paragraphs.append(" ".join(sents[i:i + step]))
            i += step
        yield f"SYN_ENG_{seed:04d}.{n:08d}", titles[rng.integers(len(titles))], paragraphs
        n += 1


def write(out: Path, size: int, fmt: str, seed: int, file_mb: float) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    written = docs = words = files = 0
    stream = documents(seed)
    limit = max(1, int(file_mb * 2**20))
    while written < size:
        name = out / (f"syn_{files:06d}.sgml.gz" if fmt == "gigaword" else f"syn_{files:06d}.jsonl")
        # mtime=0: the same arguments give the same bytes
        opener = (gzip.GzipFile(filename="", mode="wb", compresslevel=1, mtime=0, fileobj=open(name, "wb"))
                  if fmt == "gigaword" else open(name, "wb"))
        in_file = 0
        with opener as f:
            while in_file < limit and written < size:
                doc_id, title, paragraphs = next(stream)
                if fmt == "gigaword":
                    body = "".join(f"<P>\n{html.escape(p, quote=False)}\n</P>\n" for p in paragraphs)
                    text = (f'<DOC id="{doc_id}" type="story" >\n<HEADLINE>\n{html.escape(title, quote=False)}\n'
                            f"</HEADLINE>\n<TEXT>\n{body}</TEXT>\n</DOC>\n")
                else:
                    text = json.dumps({"id": doc_id, "title": title, "text": "\n\n".join(paragraphs)}) + "\n"
                data = text.encode("utf-8")
                f.write(data)
                in_file += len(data)
                written += len(data)
                docs += 1
                words += sum(len(p.split()) for p in paragraphs)
        files += 1
    meta = {"format": fmt, "bytes": written, "documents": docs, "words": words, "files": files, "seed": seed,
            "sources": "Reuters-21578 bodies and titles, CNN/DM articles (../shared/data), sentences resampled"}
    (out / "corpus.json").write_text(json.dumps(meta, indent=1))
    return meta


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", required=True, help="uncompressed size: 10MB, 100MB, 1GB")
    p.add_argument("--format", choices=["gigaword", "jsonl"], default="gigaword")
    p.add_argument("--out", type=Path, required=True, help="a scratch directory (never inside the repository)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--file-mb", type=float, default=64,
                   help="uncompressed MB per file (the LDC files are ~10-100; 0.001: one or two documents each)")
    args = p.parse_args()
    if args.out.resolve().is_relative_to(REPO):
        raise SystemExit(f"--out {args.out}: inside the repository; generated corpora are never committed")
    meta = write(args.out, parse_size(args.size), args.format, args.seed, args.file_mb)
    print(json.dumps(meta))
    return 0


if __name__ == "__main__":
    sys.exit(main())
