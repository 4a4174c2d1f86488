"""Raw text -> extractive summary with a finetuned model, segmenting and encoding exactly as the model's
training data was (segmenter kind and limits recorded in the export)."""
from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hibert.config.data import DataConfig, SegmenterConfig

_PTB_MARKERS = re.compile(r"(-lrb-|-rrb-| n't\b| 's\b| `` | '' )")


class InputError(ValueError):
    """Input we cannot summarize, with a message for the user (no stack trace)."""


@dataclass
class Summary:
    doc_id: str
    sentences: list[str]
    indices: list[int]
    num_sentences: int
    note: str = ""


def looks_ptb(text: str) -> bool:
    """See et al.'s CNN/DM style: lowercased, PTB tokens (-lrb-, n't split off, `` '')."""
    return bool(_PTB_MARKERS.search(text)) and text == text.lower()


def read_documents(source: str, field: str, limit: int | None = None) -> Iterator[tuple[str, str]]:
    """(doc id, text) from a text file (one document), JSONL (one per line) or '-' (stdin)."""
    if source == "-":
        raw = sys.stdin.buffer.read()
        name = "stdin"
    else:
        path = Path(source)
        if not path.is_file():
            raise InputError(f"input {source!r} is not a file")
        raw = path.read_bytes()
        name = path.name
    if b"\x00" in raw[:8192]:
        raise InputError(f"{name}: looks like binary data, not text")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"{name}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    if not text.strip():
        raise InputError(f"{name}: empty input, nothing to summarize")
    if name.endswith(".jsonl"):
        n = 0
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise InputError(f"{name}:{lineno}: invalid JSON ({e.msg})") from None
            if not isinstance(rec, dict) or not isinstance(rec.get(field), str):
                raise InputError(f"{name}:{lineno}: no text field {field!r} (use --field)")
            yield f"{name}:{lineno}", rec[field]
            n += 1
            if limit and n >= limit:
                return
    else:
        yield name, text


class TextEncoder:
    """Raw text -> encoded sentences exactly as the model's training data was made (segmenter kind and
    limits recorded in the export's `data` settings, its own tokenizer)."""

    def __init__(self, export_dir: Path, meta: dict, stanza_dir: str | None = None):
        from data_prep import tokenizer as tok
        from data_prep.process import Sentencizer

        data = meta.get("data", {})
        seg = data.get("segmenter", {})
        limits = data.get("limits", {})
        seg_cfg = SegmenterConfig(kind=seg.get("kind", "spacy"), stanza_dir=stanza_dir)
        self.cfg = DataConfig(segmenter=seg_cfg,
                              max_sentence_tokens=limits.get("max_sentence_tokens", 50),
                              max_doc_sentences=limits.get("max_doc_sentences", 30))
        self.sentencizer = Sentencizer(self.cfg)
        self.sp = tok.load(Path(export_dir) / "tokenizer.model")

    def __call__(self, text: str) -> tuple[list[str], list[np.ndarray], bool]:
        """(sentence texts, their subword ids, read as PTB?) — empty sentences dropped."""
        ptb = looks_ptb(text)
        paragraphs = [p for p in re.split(r"\n\s*\n", text) if p.strip()]
        sents = [s for s in self.sentencizer.sentences([(paragraphs, ptb)])[0] if s[0].strip()]
        texts = [t for t, _ in sents]
        ids = [np.asarray(x[: self.cfg.max_sentence_tokens], dtype=np.int32)
               for x in self.sp.encode(texts, out_type=int)] if texts else []
        keep = [i for i, x in enumerate(ids) if len(x)]
        return [texts[i] for i in keep], [ids[i] for i in keep], ptb


class Summarizer:
    def __init__(self, export_dir: Path, device: str = "cpu", stanza_dir: str | None = None):
        from finetune.inference import load_extractive

        self.model, meta = load_extractive(export_dir, device)
        self.device = device
        self.k = meta["selection"].get("top_k", 3)
        self.trigram_blocking = meta["selection"].get("trigram_blocking", False)
        self.encode = TextEncoder(export_dir, meta, stanza_dir)
        self.cfg = self.encode.cfg

    def __call__(self, doc_id: str, text: str, k: int | None = None) -> Summary:
        from finetune.inference import score_documents
        from finetune.selection import select

        k = k or self.k
        texts, ids, ptb = self.encode(text)
        if not texts:
            return Summary(doc_id, [], [], 0, "no sentences found")
        if len(texts) <= k:
            return Summary(doc_id, texts, list(range(len(texts))), len(texts),
                           f"document has {len(texts)} sentence(s), at most k={k}: returned whole")
        step = self.cfg.max_doc_sentences
        chunks = [ids[i:i + step] for i in range(0, len(ids), step)]
        scores = np.concatenate(score_documents(self.model, chunks, self.device))
        chosen = select(scores, texts, k, self.trigram_blocking)
        return Summary(doc_id, [texts[i] for i in chosen], chosen, len(texts),
                       "input read as PTB-tokenized text" if ptb else "")


class AbstractiveSummarizer:
    """Raw text -> abstract with an abstractive export; documents are decoded in batches."""

    def __init__(self, export_dir: Path, device: str = "cpu", stanza_dir: str | None = None, generation=None):
        from finetune.abstractive_inference import Decoder, load_abstractive

        model, meta = load_abstractive(export_dir, device)
        self.generation = generation(meta["generation"]) if callable(generation) else meta["generation"]
        self.encode = TextEncoder(export_dir, meta, stanza_dir)
        self.decoder = Decoder(model, Path(export_dir) / "tokenizer.model", self.generation, device)

    def summarize_all(self, docs: list[tuple[str, str]]) -> list[Summary]:
        encoded = [self.encode(text) for _, text in docs]
        step = self.encode.cfg.max_doc_sentences
        todo = [i for i, (texts, _, _) in enumerate(encoded) if texts]
        # the encoder reads the first max_doc_sentences sentences, as in training
        decoded = self.decoder.summarize_ids([encoded[i][1][:step] for i in todo])
        out = [Summary(doc_id, [], [], 0, "no sentences found") for doc_id, _ in docs]
        for i, d in zip(todo, decoded):
            texts, _, ptb = encoded[i]
            notes = (["input read as PTB-tokenized text"] if ptb else []) + \
                    ([f"read the first {step} of {len(texts)} sentences"] if len(texts) > step else [])
            out[i] = Summary(docs[i][0], d.sentences, [], len(texts), "; ".join(notes))
        return out
