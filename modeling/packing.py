"""Padding-free batch layout of documents for the hierarchical encoder (HIBERT §3.1).

A batch of B documents holds S sentences in all. Every real sentence (its words + EOS) is one row of
`tokens [S, T]`; T is the longest sentence in the batch rounded up to `pad_to_multiple`, so compiled
kernels see few shapes. The encoder never computes on padding: token-wise layers (embeddings, linears,
FFN, LayerNorm) run on the flat stream of real tokens (`token_index` picks them out of `tokens`), and only
attention views the stream as the [S, T] grid with a key-padding mask. The document level works the same
way on the stream of S sentence vectors, viewed as a [B, D] grid (D = longest document, rounded up).

`pad_documents` builds the classic padded layout of the same documents ([B * 30, 51] token slots, every
slot computed) for the benchmark and the equivalence tests: same modules, same weights, only the layout
differs. Everything here is numpy on the CPU (DataLoader workers); no Python loop runs per token.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import get_worker_info

from hibert.tokens import EOS_ID, PAD_ID

Sentence = Sequence[int] | np.ndarray
Document = Sequence[Sentence]


class TensorBundle:
    """Mixin for dataclasses of tensors: move or pin every tensor field (nested bundles too)."""

    def _map(self, fn) -> Any:
        changes = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if isinstance(value, (Tensor, TensorBundle)):
                changes[f.name] = fn(value)
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]

    def to(self, device: torch.device | str, non_blocking: bool = True):
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self):
        return self._map(lambda t: t.pin_memory())

    def _layout(self, tensors: list[Tensor]) -> tuple[type, dict[str, tuple[str, Any]]]:
        """This bundle's fields as ('t', index into `tensors`) | ('b', a nested bundle's layout) | ('v', value);
        the tensors are appended to `tensors` in field order."""
        fields: dict[str, tuple[str, Any]] = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if isinstance(value, Tensor):
                fields[f.name] = ("t", len(tensors))
                tensors.append(value)
            elif isinstance(value, TensorBundle):
                fields[f.name] = ("b", value._layout(tensors))
            else:
                fields[f.name] = ("v", value)
        return type(self), fields

    def __reduce__(self):
        """Pickle every CPU tensor of the bundle, nested bundles included, as ONE byte buffer. A DataLoader
        worker hands its batch over through torch's shared-memory reduction, which costs a segment and a
        file descriptor per storage (~0.3 ms each, ~20 tensors a batch) and copies a private buffer into a
        new segment; here the buffer is allocated in shared memory and filled once (one copy, one
        segment). Views are rebuilt on arrival."""
        tensors: list[Tensor] = []
        layout = self._layout(tensors)
        if not tensors or any(t.device.type != "cpu" or t.requires_grad for t in tensors):
            return _rebuild_plain, (type(self), {f.name: getattr(self, f.name)
                                                 for f in dataclasses.fields(self)})  # type: ignore[arg-type]
        specs, offset = [], 0
        for t in tensors:
            size = t.numel() * t.element_size()
            specs.append((t.dtype, tuple(t.shape), offset, size))
            offset += size + (-size % 8)               # keep every view 8-byte aligned
        buffer = _byte_buffer(offset, shared=get_worker_info() is not None)
        for t, (dtype, shape, off, size) in zip(tensors, specs):
            buffer[off:off + size].view(dtype).view(shape).copy_(t)
        return _rebuild_bundle, (buffer, layout, specs)


def _byte_buffer(size: int, shared: bool) -> Tensor:
    """An uninitialised uint8 buffer; in shared memory when it is going to another process."""
    if not shared:
        return torch.empty(size, dtype=torch.uint8)
    return torch.empty(0, dtype=torch.uint8).set_(torch.UntypedStorage._new_shared(size))


def _rebuild_plain(cls, fields: dict[str, Any]):
    return cls(**fields)


def _rebuild_bundle(buffer: Tensor, layout: tuple, specs: list):
    views = [buffer[off:off + size].view(dtype).view(shape) for dtype, shape, off, size in specs]

    def build(cls, fields: dict[str, tuple[str, Any]]):
        return cls(**{name: views[x] if kind == "t" else build(*x) if kind == "b" else x
                      for name, (kind, x) in fields.items()})

    return build(*layout)


@dataclass
class PackedDocuments(TensorBundle):
    """B documents, S sentence rows; N computed token slots (real tokens when packed)."""

    tokens: Tensor             # [S, T] int64: words + EOS_ID per row, PAD_ID after
    sent_lens: Tensor          # [S] tokens per row incl. EOS (0 for the empty slots of the padded layout)
    doc_index: Tensor          # [S] document of each row
    sent_pos: Tensor           # [S] position of each row in its document
    doc_lens: Tensor           # [B] sentences per document
    token_index: Tensor | None  # [N] slot in the flat S*T grid of each computed token; None = every slot
    token_pos: Tensor          # [N] position in its sentence of each computed token
    token_mask: Tensor         # [S, T] bool, True = a key that attention may look at
    eos_index: Tensor          # [S] row of each sentence's EOS in the computed token stream
    sent_slot: Tensor | None   # [S] slot in the flat B*D grid of each sentence; None = every slot
    doc_mask: Tensor           # [B, D] bool, True = a real sentence
    token_cu: Tensor | None    # [S + 1] int32 start of each sentence in the token stream (packed only)
    doc_cu: Tensor | None      # [B + 1] int32 start of each document in the sentence stream (packed only)
    num_sentences: int         # real sentences
    num_real_tokens: int       # real tokens incl. EOS

    @property
    def num_docs(self) -> int:
        return self.doc_lens.shape[0]

    @property
    def max_sentence_len(self) -> int:
        return self.tokens.shape[1]

    @property
    def max_doc_len(self) -> int:
        return self.doc_mask.shape[1]

    @property
    def is_padded_layout(self) -> bool:
        return self.token_index is None

    def real_rows(self) -> Tensor:
        """Rows of `tokens` (and of the encoder's sentence states) that hold real sentences."""
        return torch.nonzero(self.sent_lens > 0).squeeze(1)


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def ragged_slots(lens: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Sequences of `lens` laid out row by row in a [len(lens), width] grid: each element's flat slot
    and its column (= position in its sequence), in stream order."""
    lens = lens.astype(np.int64, copy=False)
    n = int(lens.sum())
    starts = np.cumsum(lens) - lens
    col = np.arange(n, dtype=np.int64) - np.repeat(starts, lens)
    row = np.repeat(np.arange(len(lens), dtype=np.int64), lens)
    return row * width + col, col


def cumulative(lens: np.ndarray) -> Tensor:
    """[len + 1] int32 sequence starts for varlen attention kernels."""
    return torch.from_numpy(np.concatenate([[0], np.cumsum(lens)]).astype(np.int32))


def flatten_documents(docs: Sequence[Document]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """All words back to back (int64), words per sentence, sentences per document: the flat form
    `pack_flat` takes."""
    doc_lens = np.fromiter((len(d) for d in docs), dtype=np.int64, count=len(docs))
    sents = [s for d in docs for s in d]
    word_lens = np.fromiter((len(s) for s in sents), dtype=np.int64, count=len(sents))
    # one concatenation and one cast for the batch, not one array per sentence (DataLoader hot path)
    words = np.concatenate(sents).astype(np.int64, copy=False) if word_lens.sum() else np.empty(0, np.int64)
    return words, word_lens, doc_lens


def check_doc_lens(doc_lens: np.ndarray) -> None:
    if len(doc_lens) == 0:
        raise ValueError("a batch needs at least one document")
    if (doc_lens <= 0).any():
        raise ValueError(f"document {int(np.argmin(doc_lens))} has no sentences")


def _fill_tokens(words: np.ndarray, word_lens: np.ndarray, slots: np.ndarray, cols: np.ndarray,
                 size: int) -> np.ndarray:
    """A flat grid of `size` PADs with each sentence's words then EOS written at its slots."""
    flat = np.full(size, PAD_ID, dtype=np.int64)
    flat[slots] = EOS_ID
    is_word = cols < np.repeat(word_lens, word_lens + 1)
    flat[slots[is_word]] = words
    return flat


def pack_documents(docs: Sequence[Document], pad_to_multiple: int = 8) -> PackedDocuments:
    """Pack documents (lists of sentences of token ids, no specials) into the padding-free layout.
    EOS_ID is appended to every sentence: its hidden state is the sentence vector (HIBERT §3.1)."""
    return pack_flat(*flatten_documents(docs), pad_to_multiple=pad_to_multiple)


def pack_flat(words: np.ndarray, word_lens: np.ndarray, doc_lens: np.ndarray,
              pad_to_multiple: int = 8) -> PackedDocuments:
    """`pack_documents` from the flat form: every word back to back (int64), words per sentence,
    sentences per document (DataLoader workers build this form directly, without per-sentence arrays)."""
    word_lens, doc_lens = np.asarray(word_lens, dtype=np.int64), np.asarray(doc_lens, dtype=np.int64)
    check_doc_lens(doc_lens)
    if int(doc_lens.sum()) != len(word_lens) or int(word_lens.sum()) != len(words):
        raise ValueError(f"{len(words)} words, {int(word_lens.sum())} in the sentence lengths; {len(word_lens)} "
                         f"sentences, {int(doc_lens.sum())} in the document lengths")
    lens = word_lens + 1
    num_rows, num_docs = len(word_lens), len(doc_lens)
    width = round_up(int(lens.max()), pad_to_multiple)
    token_slot, token_pos = ragged_slots(lens, width)
    tokens = _fill_tokens(words, word_lens, token_slot, token_pos, num_rows * width)

    doc_width = round_up(int(doc_lens.max()), pad_to_multiple)
    sent_slot, sent_pos = ragged_slots(doc_lens, doc_width)
    t = torch.from_numpy
    return PackedDocuments(
        tokens=t(tokens).view(num_rows, width),
        sent_lens=t(lens),
        doc_index=t(np.repeat(np.arange(num_docs, dtype=np.int64), doc_lens)),
        sent_pos=t(sent_pos),
        doc_lens=t(doc_lens),
        token_index=t(token_slot),
        token_pos=t(token_pos),
        token_mask=t(np.arange(width) < lens[:, None]),
        eos_index=t(np.cumsum(lens) - 1),
        sent_slot=t(sent_slot),
        doc_mask=t(np.arange(doc_width) < doc_lens[:, None]),
        token_cu=cumulative(lens),
        doc_cu=cumulative(doc_lens),
        num_sentences=num_rows,
        num_real_tokens=int(lens.sum()),
    )


def pad_documents(docs: Sequence[Document], max_sentences: int = 30, max_tokens: int = 50) -> PackedDocuments:
    """The padded reference layout: every document padded to `max_sentences` rows and every sentence to
    `max_tokens` + 1 (EOS) slots, and every slot computed, as a [B, 30, 50]-style implementation would.
    Rows of document b are b * max_sentences + position. Empty rows let their PAD slot be a key so that
    no attention row is fully masked; their outputs are never looked at."""
    words, word_lens, doc_lens = flatten_documents(docs)
    check_doc_lens(doc_lens)
    if doc_lens.max() > max_sentences or word_lens.max() > max_tokens:
        raise ValueError(f"documents must be cut to {max_sentences} sentences of {max_tokens} tokens first")
    num_docs, width = len(docs), max_tokens + 1
    num_rows = num_docs * max_sentences
    row_slot, _ = ragged_slots(doc_lens, max_sentences)  # row of each real sentence
    lens = np.zeros(num_rows, dtype=np.int64)
    lens[row_slot] = word_lens + 1
    token_slot, token_pos = ragged_slots(word_lens + 1, width)
    token_slot += np.repeat(row_slot - np.arange(len(word_lens)), word_lens + 1) * width  # to the real rows
    tokens = _fill_tokens(words, word_lens, token_slot, token_pos, num_rows * width)

    token_mask = np.arange(width) < lens[:, None]
    token_mask[lens == 0, 0] = True
    t = torch.from_numpy
    return PackedDocuments(
        tokens=t(tokens).view(num_rows, width),
        sent_lens=t(lens),
        doc_index=t(np.repeat(np.arange(num_docs, dtype=np.int64), max_sentences)),
        sent_pos=t(np.tile(np.arange(max_sentences, dtype=np.int64), num_docs)),
        doc_lens=t(doc_lens),
        token_index=None,
        token_pos=t(np.tile(np.arange(width, dtype=np.int64), num_rows)),
        token_mask=t(token_mask),
        eos_index=t(np.arange(num_rows, dtype=np.int64) * width + np.maximum(lens - 1, 0)),
        sent_slot=None,
        doc_mask=t(np.arange(max_sentences) < doc_lens[:, None]),
        token_cu=None,
        doc_cu=None,
        num_sentences=len(word_lens),
        num_real_tokens=int(lens.sum()),
    )
