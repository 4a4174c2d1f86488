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
    subwords: int | None = None   # abstractive: the summary's length in subwords ([SEP] counted, EOS not)


def looks_ptb(text: str) -> bool:
    """See et al.'s CNN/DM style: lowercased, PTB tokens (-lrb-, n't split off, `` '')."""
    return bool(_PTB_MARKERS.search(text)) and text == text.lower()


def read_documents(source: str, field: str, limit: int | None = None) -> Iterator[tuple[str, str]]:
    """(doc id, text) from a text file (one document), JSONL (one per line) or '-' (stdin)."""
    name, text = _read_text(source)
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


def _read_text(source: str) -> tuple[str, str]:
    """(name, text) of a file or '-' (stdin), refusing binary, non-UTF-8 and empty input."""
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
    return name, text


def read_clusters(sources: list[str], field: str, limit: int | None = None) -> Iterator[tuple[str, list[str]]]:
    """(cluster id, document texts) for a multi-document model: several text files = one cluster (one
    document each); a .jsonl file = one cluster per line, its documents a list of strings in `field`
    (`documents` when the given field is the default 'text')."""
    if len(sources) == 1 and sources[0].endswith(".jsonl"):
        name, text = _read_text(sources[0])
        key = "documents" if field == "text" else field
        n = 0
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise InputError(f"{name}:{lineno}: invalid JSON ({e.msg})") from None
            docs = rec.get(key) if isinstance(rec, dict) else None
            if not isinstance(docs, list) or not docs or not all(isinstance(d, str) for d in docs):
                raise InputError(f"{name}:{lineno}: no list of document strings in field {key!r} (use --field)")
            if not any(d.strip() for d in docs):
                raise InputError(f"{name}:{lineno}: every document of the cluster is empty")
            yield f"{name}:{lineno}", docs
            n += 1
            if limit and n >= limit:
                return
    else:
        texts = [_read_text(s) for s in sources]
        name = texts[0][0] if len(texts) == 1 else f"{texts[0][0]}+{len(texts) - 1}"
        yield name, [t for _, t in texts]


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

    def paragraphs(self, text: str) -> tuple[list[tuple[list[str], list[np.ndarray]]], bool]:
        """Per blank-line paragraph, its (sentence texts, subword ids) — empty sentences dropped — and PTB?"""
        ptb = looks_ptb(text)
        paragraphs = [p for p in re.split(r"\n\s*\n", text) if p.strip()]
        out = []
        for sents in self.sentencizer.sentences([([p], ptb) for p in paragraphs]):
            texts = [t for t, _ in sents if t.strip()]
            ids = [np.asarray(x[: self.cfg.max_sentence_tokens], dtype=np.int32)
                   for x in self.sp.encode(texts, out_type=int)] if texts else []
            keep = [i for i, x in enumerate(ids) if len(x)]
            if keep:
                out.append(([texts[i] for i in keep], [ids[i] for i in keep]))
        return out, ptb

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
            out[i] = Summary(docs[i][0], d.sentences, [], len(texts), "; ".join(notes), len(d.ids))
        return out


class ClusterSummarizer:
    """Several documents -> one abstract with a multi-document (mds) export: units as in its training data
    (paragraphs, windows of <= max_unit_sentences), ranked as the model was trained (tf-idf, document order,
    or its learned ranker; the label oracle needs a reference, so tf-idf stands in for it), cut to its token
    budget, decoded in batches."""

    def __init__(self, export_dir: Path, device: str = "cpu", stanza_dir: str | None = None, generation=None,
                 ranking: str | None = None, ranker_dir: Path | None = None):
        from finetune.abstractive_inference import Decoder
        from finetune.mds_inference import load_mds

        model, meta = load_mds(export_dir, device)
        self.generation = generation(meta["generation"]) if callable(generation) else meta["generation"]
        self.mds = meta["mds"]
        self.ranking = ranking or self.mds.ranking
        self.max_unit_sentences = int(meta.get("data", {}).get("clusters", {}).get("max_unit_sentences", 5))
        self.encode = TextEncoder(export_dir, meta, stanza_dir)
        self.decoder = Decoder(model, Path(export_dir) / "tokenizer.model", self.generation, device, clusters=True)
        self.ranker = None
        if ranker_dir is not None:
            from finetune.ranker_task import load_ranker

            self.ranker, _ = load_ranker(ranker_dir, device)
        self.device = device

    def units(self, documents: list[str]) -> tuple[list[list[str]], list[list[np.ndarray]], bool]:
        from data_prep.units import windows

        texts, ids, any_ptb = [], [], False
        for doc in documents:
            paragraphs, ptb = self.encode.paragraphs(doc)
            any_ptb |= ptb
            for t, x in paragraphs:
                for a, b in windows(len(t), self.max_unit_sentences):
                    texts.append(t[a:b])
                    ids.append(x[a:b])
        return texts, ids, any_ptb

    def summarize_all(self, clusters: list[tuple[str, list[str]]]) -> list[Summary]:
        from finetune.mds_data import budget_cut, rank_order, tfidf_scores
        from finetune.ranker_task import score_clusters

        prepared = [self.units(docs) for _, docs in clusters]
        todo = [i for i, (t, _, _) in enumerate(prepared) if t]
        chosen = {}
        scores = score_clusters(self.ranker, [prepared[i][1] for i in todo], self.device) if self.ranker else None
        for k, i in enumerate(todo):
            texts, ids, _ = prepared[i]
            if scores is not None:
                s = scores[k]
            elif self.ranking == "lead":
                s = -np.arange(len(texts), dtype=np.float64)
            else:
                s = tfidf_scores([" ".join(t) for t in texts])
            tokens = np.array([sum(len(x) + 1 for x in u) for u in ids])
            top = self.mds.top_units if self.mds.top_units else self.mds.max_units
            chosen[i] = budget_cut(rank_order(s), tokens, self.mds.budget_tokens, min(top, self.mds.max_units))
        batch = [[prepared[i][1][j] for j in chosen[i].tolist()] for i in todo]
        graphs = None
        if self.mds.graph_attention:
            from modeling.clusters import unit_graph

            graphs = [unit_graph([np.concatenate(u) for u in c], self.mds.graph_threshold) for c in batch]
        decoded = self.decoder.summarize_ids(batch, graphs=graphs)
        out = [Summary(cid, [], [], 0, "no sentences found") for cid, _ in clusters]
        for i, d in zip(todo, decoded):
            texts, _, ptb = prepared[i]
            n_units, n_sents = len(texts), sum(len(t) for t in texts)
            notes = (["input read as PTB-tokenized text"] if ptb else []) + \
                    [f"read {len(chosen[i])} of {n_units} units ({len(clusters[i][1])} documents)"]
            out[i] = Summary(clusters[i][0], d.sentences, [], n_sents, "; ".join(notes), len(d.ids))
        return out
