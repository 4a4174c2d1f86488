"""Masked-sentence pretraining of HIBERT (Zhang et al. 2019, §3.2): the encoder reads the masked document,
a Transformer decoder rebuilds each selected sentence word by word from its document-level vector."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hibert.config.model import ModelConfig
from hibert.modeling.encoder import HibertEncoder
from hibert.modeling.layers import Layout, TransformerStack, init_weights
from hibert.modeling.packing import (
    Document,
    PackedDocuments,
    Sentence,
    TensorBundle,
    check_doc_lens,
    cumulative,
    flatten_documents,
    pack_flat,
    pad_documents,
    ragged_slots,
    round_up,
)
from hibert.tokens import BOS_ID, EOS_ID, PAD_ID

IGNORE_INDEX = -100  # label of decoder slots that are padding (padded reference layout only)


@dataclass
class PretrainBatch(TensorBundle):
    """Masked documents plus the M selected sentences to rebuild, flat: decoder input BOS + words,
    labels words + EOS (teacher forcing), Nd computed decoder slots in all (real ones when packed)."""

    docs: PackedDocuments         # the masked documents (after the 80/10/10 transformation)
    dec_tokens: Tensor            # [Nd] decoder input ids
    dec_labels: Tensor            # [Nd] next-token targets; IGNORE_INDEX at padding slots
    dec_pos: Tensor               # [Nd] position in its target sentence
    dec_rows: Tensor              # [Nd] row of docs (sentence state) whose vector feeds each slot (eq. 4)
    dec_index: Tensor | None      # [Nd] slot in the flat M*Td grid; None = every slot
    dec_cu: Tensor | None         # [M + 1] int32 start of each target in the stream (packed only)
    target_rows: Tensor           # [M] row of docs each target sentence was selected at
    target_lens: Tensor           # [M] decoder length of each target: words + 1
    num_targets: int              # M
    max_target_len: int           # Td
    num_target_tokens: int        # real predicted tokens (words + EOS of every target)


def _check_targets(masked_docs: Sequence[Document], target_positions: Sequence[Sequence[int]],
                   target_sentences: Sequence[Sequence[Sentence]]) -> None:
    if not len(masked_docs) == len(target_positions) == len(target_sentences):
        raise ValueError("masked_docs, target_positions and target_sentences need one entry per document")
    for b, (doc, pos, sents) in enumerate(zip(masked_docs, target_positions, target_sentences)):
        if len(pos) != len(sents):
            raise ValueError(f"document {b}: {len(pos)} target positions but {len(sents)} target sentences")
        if any(not 0 <= p < len(doc) for p in pos):
            raise ValueError(f"document {b}: target position out of range 0..{len(doc) - 1}: {list(pos)}")


def decoder_fields(target_sentences: Sequence[Sequence[Sentence]], row_of: np.ndarray,
                   width: int | None, pad_to_multiple: int) -> dict:
    """`_decoder_stream` of target sentences given as arrays (one list of sentences per document)."""
    flat_words, word_lens, _ = flatten_documents(target_sentences)
    return _decoder_stream(flat_words, word_lens, row_of, width, pad_to_multiple)


def _decoder_stream(flat_words: np.ndarray, word_lens: np.ndarray, row_of: np.ndarray,
                    width: int | None, pad_to_multiple: int) -> dict:
    """Flat decoder stream from the targets' words back to back and their lengths. `row_of[m]` is the
    docs row of target m; `width` None = packed (Td rounded up from the longest target), else the padded
    reference with every slot computed."""
    lens = word_lens + 1
    m = len(word_lens)
    padded = width is not None
    if not padded:
        width = round_up(int(lens.max(initial=1)), pad_to_multiple)
    elif word_lens.max(initial=0) >= width:
        raise ValueError(f"target sentences must be cut to {width - 1} tokens first")
    slot, pos = ragged_slots(lens, width)
    inputs = np.full(len(slot), BOS_ID, dtype=np.int64)
    inputs[pos > 0] = flat_words
    labels = np.full(len(slot), EOS_ID, dtype=np.int64)
    labels[pos < np.repeat(word_lens, lens)] = flat_words
    target_of = np.repeat(np.arange(m, dtype=np.int64), lens)
    if padded:  # every slot of the [M, Td] grid is computed; padding slots are PAD in, ignored out
        grid_in = np.full(m * width, PAD_ID, dtype=np.int64)
        grid_out = np.full(m * width, IGNORE_INDEX, dtype=np.int64)
        grid_in[slot], grid_out[slot] = inputs, labels
        inputs, labels = grid_in, grid_out
        pos = np.tile(np.arange(width, dtype=np.int64), m)
        target_of = np.repeat(np.arange(m, dtype=np.int64), width)
    t = torch.from_numpy
    return dict(
        dec_tokens=t(inputs), dec_labels=t(labels), dec_pos=t(pos), dec_rows=t(row_of[target_of]),
        dec_index=None if padded else t(slot), dec_cu=None if padded else cumulative(lens),
        target_rows=t(row_of), target_lens=t(lens),
        num_targets=m, max_target_len=width, num_target_tokens=int(lens.sum()),
    )


def make_pretrain_batch(masked_docs: Sequence[Document], target_positions: Sequence[Sequence[int]],
                        target_sentences: Sequence[Sequence[Sentence]], pad_to_multiple: int = 8) -> PretrainBatch:
    """Padding-free pretraining batch. `masked_docs`: documents after masking (no specials);
    `target_positions[b]`: indices of the selected sentences of document b; `target_sentences[b]`: their
    ORIGINAL token ids (no specials), in the same order."""
    _check_targets(masked_docs, target_positions, target_sentences)
    words, word_lens, doc_lens = flatten_documents(masked_docs)
    check_doc_lens(doc_lens)  # before the concatenations below, so an empty batch gets the packing's message
    first_row = np.cumsum(doc_lens) - doc_lens
    row_of = np.concatenate([first_row[b] + np.asarray(p, dtype=np.int64) for b, p in enumerate(target_positions)])
    target_words, target_word_lens, _ = flatten_documents(target_sentences)
    return make_pretrain_batch_flat(words, word_lens, doc_lens, row_of, target_words, target_word_lens,
                                    pad_to_multiple)


def make_pretrain_batch_flat(words: np.ndarray, word_lens: np.ndarray, doc_lens: np.ndarray,
                             target_rows: np.ndarray, target_words: np.ndarray, target_word_lens: np.ndarray,
                             pad_to_multiple: int = 8) -> PretrainBatch:
    """`make_pretrain_batch` from flat arrays (what DataLoader workers build, no per-sentence arrays):
    the masked documents as `pack_flat` takes them, `target_rows[m]` = the row (sentence index over the
    whole batch) target m was selected at, its ORIGINAL words back to back in `target_words`."""
    docs = pack_flat(words, word_lens, doc_lens, pad_to_multiple)
    target_rows = np.asarray(target_rows, dtype=np.int64)
    target_word_lens = np.asarray(target_word_lens, dtype=np.int64)
    if len(target_rows) != len(target_word_lens) or int(target_word_lens.sum()) != len(target_words):
        raise ValueError(f"{len(target_rows)} target rows, {len(target_word_lens)} target lengths summing to "
                         f"{int(target_word_lens.sum())}, {len(target_words)} target words")
    if len(target_rows) and not (0 <= target_rows.min() and target_rows.max() < docs.num_sentences):
        raise ValueError(f"target rows must lie in 0..{docs.num_sentences - 1}")
    return PretrainBatch(docs=docs, **_decoder_stream(np.asarray(target_words, dtype=np.int64), target_word_lens,
                                                      target_rows, None, pad_to_multiple))


def make_padded_pretrain_batch(masked_docs: Sequence[Document], target_positions: Sequence[Sequence[int]],
                               target_sentences: Sequence[Sequence[Sentence]], max_sentences: int = 30,
                               max_tokens: int = 50) -> PretrainBatch:
    """The same batch in the padded reference layout (`pad_documents`; targets padded to max_tokens + 1
    and projected to the vocabulary at every slot), for benchmarks and equivalence tests."""
    _check_targets(masked_docs, target_positions, target_sentences)
    docs = pad_documents(masked_docs, max_sentences, max_tokens)
    row_of = np.concatenate([b * max_sentences + np.asarray(p, dtype=np.int64) for b, p in enumerate(target_positions)])
    return PretrainBatch(docs=docs, **decoder_fields(target_sentences, row_of, max_tokens + 1, 1))


@dataclass
class PretrainOutput:
    loss: Tensor               # mean per target token, label-smoothed if asked: what is backpropagated
    nll_sum: Tensor            # summed NLL without smoothing (detached), for exact perplexity across ranks
    num_target_tokens: int     # the count nll_sum is summed over
    logits: Tensor | None = None  # [Nd, V] when asked for


class SentenceDecoder(nn.Module):
    """HIBERT §3.2, eq. 3–6: a Transformer decoder with causal self-attention only (no cross-attention);
    after the self-attention sub-layer of every layer the masked sentence's document-level vector is
    added (eq. 4). Input embeddings come from the encoder's table; the vocabulary projection (eq. 6) is
    tied to it unless cfg.tie_output_embeddings is False."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.layers = TransformerStack(cfg, cfg.num_decoder_layers)
        self.output = None if cfg.tie_output_embeddings else nn.Linear(cfg.hidden, cfg.vocab_size, bias=False)
        self.apply(init_weights)

    def forward(self, x: Tensor, layout: Layout, context: Tensor) -> Tensor:
        return self.layers(x, layout, context)


class HibertForPretraining(nn.Module):
    """Encoder + masked-sentence decoder; loss = NLL of the original words of every selected sentence
    (HIBERT §3.2, eq. 7)."""

    def __init__(self, cfg: ModelConfig, label_smoothing: float = 0.0):
        super().__init__()
        self.cfg = cfg
        self.label_smoothing = label_smoothing
        self.encoder = HibertEncoder(cfg)
        self.decoder = SentenceDecoder(cfg)

    def output_weight(self) -> Tensor:
        out = self.decoder.output
        return self.encoder.token_embedding.weight if out is None else out.weight

    def forward(self, batch: PretrainBatch, label_smoothing: float | None = None,
                return_logits: bool = False) -> PretrainOutput:
        smoothing = self.label_smoothing if label_smoothing is None else label_smoothing
        encoded = self.encoder(batch.docs)
        if batch.num_targets == 0:  # nothing selected in this batch: a zero loss that keeps the graph
            zero = encoded.sentence_states.sum() * 0.0
            return PretrainOutput(zero, zero.detach(), 0)
        context = encoded.sentence_states.index_select(0, batch.dec_rows)
        layout = Layout(batch.num_targets, batch.max_target_len, batch.dec_index, causal=True,
                        cu_seqlens=batch.dec_cu)
        hidden = self.decoder(self.encoder.embed(batch.dec_tokens, batch.dec_pos), layout, context)
        # Packed: every decoder slot is a real target token, so only those reach the vocabulary projection.
        logits = F.linear(hidden, self.output_weight())
        loss, nll_sum = token_losses(logits, batch.dec_labels, batch.num_target_tokens, smoothing)
        return PretrainOutput(loss, nll_sum, batch.num_target_tokens, logits if return_logits else None)


def token_losses(logits: Tensor, labels: Tensor, num_tokens: int, smoothing: float) -> tuple[Tensor, Tensor]:
    """(mean smoothed loss, summed plain NLL) over labels != IGNORE_INDEX, from one fp32 log-softmax.
    Smoothing as torch's cross_entropy: (1 - eps) * nll + eps * mean over the vocabulary of -log p."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    valid = labels != IGNORE_INDEX
    nll = -logp.gather(1, labels.clamp_min(0)[:, None]).squeeze(1) * valid
    loss = nll if smoothing == 0 else (1 - smoothing) * nll - smoothing * logp.mean(-1) * valid
    return loss.sum() / max(num_tokens, 1), nll.detach().sum()
