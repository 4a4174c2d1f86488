"""What the abstractive head reads from a prepared dataset: the first chunk of every document that has a
summary (HIBERT's encoder reads at most `data.max_doc_sentences` sentences; later chunks of a long article
would be trained against the same summary they may not contain — PreSumm truncates the same way), and the
summary's subwords joined by [SEP] as the decoder's target."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from hibert.tokens import SEP_ID


def target_ids(summary: list[np.ndarray], max_tokens: int) -> np.ndarray:
    """Summary sentences' subwords joined with [SEP], cut to `max_tokens` (EOS is added by the batch)."""
    parts: list[np.ndarray] = []
    for j, sent in enumerate(summary):
        if j:
            parts.append(np.array([SEP_ID], dtype=np.int64))
        parts.append(np.asarray(sent, dtype=np.int64))
    ids = np.concatenate(parts) if parts else np.empty(0, np.int64)
    return ids[:max_tokens]


def split_sentences(ids: list[int]) -> list[list[int]]:
    """Decoded subwords back into sentences at [SEP] (empty pieces dropped)."""
    out: list[list[int]] = [[]]
    for t in ids:
        if t == SEP_ID:
            out.append([])
        else:
            out[-1].append(int(t))
    return [s for s in out if s]


class FirstChunks:
    """A view of a `DocumentDataset` split with only chunk 0 of each document that has a summary. Same
    interface as the dataset for everything the runtime and the evaluation use; picklable by path."""

    def __init__(self, dataset):
        self.base = dataset
        first = np.array([dataset.chunk_index(i) == 0 for i in range(len(dataset))], dtype=bool)
        keep = [i for i in np.flatnonzero(first).tolist() if dataset.labels(i) is not None]
        self.rows = np.asarray(keep, dtype=np.int64)
        self.skipped_later_chunks = int((~first).sum())
        self.doc_num_tokens = np.asarray(dataset.doc_num_tokens)[self.rows]
        self.doc_num_sentences = np.asarray(dataset.doc_num_sentences)[self.rows]
        self.doc_source = np.asarray(dataset.doc_source)[self.rows]

    def __getstate__(self) -> dict[str, Any]:
        return {"base": self.base, "rows": self.rows, "skipped": self.skipped_later_chunks}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.base, self.rows, self.skipped_later_chunks = state["base"], state["rows"], state["skipped"]
        self.doc_num_tokens = np.asarray(self.base.doc_num_tokens)[self.rows]
        self.doc_num_sentences = np.asarray(self.base.doc_num_sentences)[self.rows]
        self.doc_source = np.asarray(self.base.doc_source)[self.rows]

    def __len__(self) -> int:
        return len(self.rows)

    def __repr__(self) -> str:
        return f"FirstChunks({self.base!r}, documents={len(self)})"

    @property
    def split(self) -> str:
        return self.base.split

    @property
    def tokenizer_path(self) -> Path:
        return self.base.tokenizer_path

    @property
    def manifest(self) -> dict[str, Any]:
        return self.base.manifest

    def __getitem__(self, i: int) -> list[np.ndarray]:
        return self.base[int(self.rows[i])]

    def __getattr__(self, name: str):
        # per-item accessors of the dataset (summary, summary_text, sentences_text, doc_id, source_doc,
        # labels, chunk_index) take the view's index
        if name.startswith("_") or name == "base":
            raise AttributeError(name)
        attr = getattr(self.base, name)
        if callable(attr):
            return lambda i, *a, **k: attr(int(self.rows[i]), *a, **k)
        return attr
