"""What the abstractive head reads from a prepared dataset: the first chunk of every document that has a
summary (HIBERT's encoder reads at most `data.max_doc_sentences` sentences; later chunks of a long article
would be trained against the same summary they may not contain — PreSumm truncates the same way), and the
summary's subwords joined by [SEP] as the decoder's target; and the teacher-forcing batches the models take
(`make_abstractive_batch` for documents, `make_mds_batch` for clusters)."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from hibert.finetune.base.views import RowView
from hibert.modeling.abstractive import AbstractiveBatch
from hibert.modeling.clusters import pack_clusters
from hibert.modeling.mds import MDSBatch
from hibert.modeling.packing import Document, Sentence, pack_documents
from hibert.modeling.pretraining import decoder_fields
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


def make_abstractive_batch(docs: Sequence[Document], targets: Sequence[Sentence],
                           pad_to_multiple: int = 8) -> AbstractiveBatch:
    """Padding-free batch. `docs`: lists of sentences of token ids (no specials); `targets[b]`: the summary
    subwords of document b (no specials; the caller joins summary sentences with SEP_ID)."""
    if len(docs) != len(targets):
        raise ValueError(f"{len(docs)} documents but {len(targets)} targets")
    packed = pack_documents(docs, pad_to_multiple)
    return AbstractiveBatch(docs=packed, **_target_fields(targets, pad_to_multiple))


def make_mds_batch(clusters: Sequence[Sequence[Document]], targets: Sequence[Sentence],
                   graphs: Sequence[np.ndarray] | None = None, pad_to_multiple: int = 8) -> MDSBatch:
    """Teacher-forcing batch of clusters (lists of units in rank order; a unit is a list of sentences of token
    ids, no specials), their target summaries (no specials) and optionally each cluster's unit graph."""
    if len(clusters) != len(targets):
        raise ValueError(f"{len(clusters)} clusters but {len(targets)} targets")
    packed = pack_clusters(clusters, graphs, pad_to_multiple)
    return MDSBatch(docs=packed, **_target_fields(targets, pad_to_multiple))


def _target_fields(targets: Sequence[Sentence], pad_to_multiple: int) -> dict:
    """The decoder fields of an `AbstractiveBatch`: one target per document (or cluster), in the packed
    layout of `decoder_fields`."""
    f = decoder_fields([[t] for t in targets], np.arange(len(targets), dtype=np.int64), None, pad_to_multiple)
    return dict(dec_tokens=f["dec_tokens"], dec_labels=f["dec_labels"], dec_pos=f["dec_pos"],
                dec_doc=f["dec_rows"], dec_index=f["dec_index"], dec_cu=f["dec_cu"],
                target_lens=f["target_lens"], max_target_len=f["max_target_len"],
                num_target_tokens=f["num_target_tokens"])


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
