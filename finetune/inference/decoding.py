"""Decoding outside the training loop (single process, no DeepSpeed) for every head with a decoder: batch
documents (or clusters) by token budget, run the batched beam search, turn subwords back into sentences."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from hibert.data_prep import tokenizer as tok
from hibert.modeling import pack_documents
from hibert.modeling.clusters import pack_clusters
from hibert.modeling.generate import generate
from hibert.runtime.allocator import keep_freed_memory
from hibert.runtime.batching import doc_costs, plan_epoch
from hibert.tokens import SEP_ID


@dataclass
class Decoded:
    sentences: list[str]      # summary sentences ([SEP]-separated in the model's output)
    ids: list[int]            # the decoded subwords (no BOS/EOS)
    score: float              # length-penalised log-probability of the chosen hypothesis


def word_start_mask(sp) -> np.ndarray:
    """True for pieces that begin a word (SentencePiece marks them with '▁') and for control/special
    pieces, which stand alone; word-level n-gram blocking groups the rest with the piece before them."""
    n = sp.get_piece_size()
    return np.array([sp.id_to_piece(i).startswith("\u2581") or sp.is_control(i) or sp.is_unknown(i)
                     or sp.id_to_piece(i).startswith("[") and sp.id_to_piece(i).endswith("]")
                     for i in range(n)], dtype=bool)


# A batch's token budget guards memory when documents are long; it grows with the batch asked for, so that
# `batch_size` documents of up to TOKENS_PER_DOC packed tokens each decode together (a GPU needs large batches:
# docs/abstractive.md, "On a GPU").
MIN_BATCH_TOKENS, TOKENS_PER_DOC = 32768, 2048


def decode_batches(costs: np.ndarray, batch_size: int) -> list[np.ndarray]:
    """Indices of the documents decoded together, similar lengths in a batch (less padding in the encoder's
    grids), at most `batch_size` documents and max(MIN_BATCH_TOKENS, `batch_size` x TOKENS_PER_DOC) tokens
    (`costs`: each document's packed tokens) per batch; batches ordered by the index of their first (shortest)
    document — callers place each output by its document's index."""
    budget = max(MIN_BATCH_TOKENS, batch_size * TOKENS_PER_DOC)
    plan = plan_epoch(costs, seed=0, epoch=0, batch_tokens=budget, max_docs=batch_size, world=1, accum=1)
    return sorted(plan.batches, key=lambda b: int(b[0]))


class Decoder:
    """Summaries of encoded documents with a (plain, single-process) `HibertAbstractive`, or of clusters
    (lists of unit documents, in rank order) with a `HibertMDS` (`clusters=True`)."""
    def __init__(self, model: torch.nn.Module, tokenizer_path: Path, generation, device: torch.device | str,
                 clusters: bool = False):

        self.model, self.generation, self.device = model, generation, torch.device(device)
        if self.device.type == "cpu":
            keep_freed_memory()  # a batch's large temporaries are reused, not mapped and zero-filled anew
        self.clusters = clusters
        self.sp = tok.load(tokenizer_path)
        self.word_start = torch.from_numpy(word_start_mask(self.sp)).to(self.device)

    def _autocast(self):
        if self.device.type == "cuda" and torch.cuda.is_bf16_supported():
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return torch.autocast("cpu", enabled=False)

    @torch.no_grad()
    def summarize_ids(self, docs: list, generation=None, graphs: list[np.ndarray] | None = None) -> list[Decoded]:
        """One summary per document (lists of encoded sentences) or cluster (lists of units), in input order;
        `graphs`: each cluster's unit graph (graph-informed attention)."""
        gen = generation or self.generation
        if not docs:
            return []
        sents = [[s for u in d for s in u] for d in docs] if self.clusters else docs
        costs = doc_costs(np.array([sum(len(s) for s in d) for d in sents]), np.array([len(d) for d in sents]))
        out: list[Decoded | None] = [None] * len(docs)
        for idx in decode_batches(costs, gen.batch_size):
            rows = idx.tolist()
            if self.clusters:
                batch = pack_clusters([docs[i] for i in rows],
                                      None if graphs is None else [graphs[i] for i in rows]).to(self.device)
            else:
                batch = pack_documents([docs[i] for i in rows]).to(self.device)
            with self._autocast():
                hyps = generate(self.model, batch, gen, word_start=self.word_start)
            for i, h in zip(idx.tolist(), hyps):
                ids = [int(t) for t in h.tokens]
                out[i] = Decoded([self.sp.decode(s) for s in split_sentences(ids)], ids, float(h.score))
        return out  # type: ignore[return-value]


def split_sentences(ids: list[int]) -> list[list[int]]:
    """Decoded subwords back into sentences at [SEP] (empty pieces dropped)."""
    out: list[list[int]] = [[]]
    for t in ids:
        if t == SEP_ID:
            out.append([])
        else:
            out[-1].append(int(t))
    return [s for s in out if s]
