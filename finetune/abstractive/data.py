"""What the abstractive head reads from a prepared dataset: the first chunk of every document that has a
summary (HIBERT's encoder reads at most `data.max_doc_sentences` sentences; later chunks of a long article
would be trained against the same summary they may not contain — PreSumm truncates the same way), and the
summary's subwords joined by [SEP] as the decoder's target."""
from __future__ import annotations

import numpy as np

from hibert.finetune.base.views import RowView
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


class FirstChunks(RowView):
    """A view of a `DocumentDataset` split with only chunk 0 of each document that has a summary."""
    def __init__(self, dataset):
        self.base = dataset
        first = np.array([dataset.chunk_index(i) == 0 for i in range(len(dataset))], dtype=bool)
        keep = [i for i in np.flatnonzero(first).tolist() if dataset.labels(i) is not None]
        self.rows = np.asarray(keep, dtype=np.int64)
        self.skipped_later_chunks = int((~first).sum())
        self.doc_num_tokens = np.asarray(dataset.doc_num_tokens)[self.rows]
        self.doc_num_sentences = np.asarray(dataset.doc_num_sentences)[self.rows]
        self.doc_source = np.asarray(dataset.doc_source)[self.rows]

    def __repr__(self) -> str:
        return f"FirstChunks({self.base!r}, documents={len(self)})"
