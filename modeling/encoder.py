"""The hierarchical document encoder HIBERT (Zhang et al. 2019, §3.1, eq. 1–2)."""
from __future__ import annotations

import math
from dataclasses import dataclass

from torch import Tensor, nn

from hibert.config.model import ModelConfig
from hibert.modeling.layers import Layout, TransformerStack, init_weights, sinusoidal_table
from hibert.modeling.packing import PackedDocuments
from hibert.tokens import PAD_ID


@dataclass
class EncoderOutput:
    """Both levels of the encoding, for heads and for decoders that attend to words."""

    token_flat: Tensor        # [N, H] sentence-level states of the computed token slots (stream order)
    sentence_states: Tensor   # [S, H] document-level, context-sensitive sentence states, rows of docs.tokens
    docs: PackedDocuments
    structure: Tensor | None = None  # [S, H] structure-infused vectors of the same rows (mds structural attention)

    @property
    def token_states(self) -> Tensor:
        """[S, T, H] sentence-level encoder outputs on the token grid (zeros at padding)."""
        s, t = self.docs.tokens.shape
        flat = self.token_flat
        if self.docs.token_index is not None:
            flat = flat.new_zeros(s * t, flat.shape[1]).index_copy_(0, self.docs.token_index, flat)
        return flat.view(s, t, -1)

    def sentences_by_document(self, rows: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """`[B, D, H]` sentence states (or other per-sentence `rows [S, H]`) per document (zeros at padding) and
        the `[B, D]` mask of real ones."""
        d = self.docs
        b, width = d.doc_mask.shape
        flat = self.sentence_states if rows is None else rows
        if d.sent_slot is not None:
            flat = flat.new_zeros(b * width, flat.shape[1]).index_copy_(0, d.sent_slot, flat)
        return flat.view(b, width, -1), d.doc_mask


class HibertEncoder(nn.Module):
    """HIBERT §3.1. Sentence encoder: a Transformer over each sentence's words, input = word embedding +
    sinusoidal position (eq. 1); the sentence vector is the hidden state at its EOS token plus the
    embedding of the sentence's position, from the same sinusoidal table (eq. 2). Document encoder: a
    Transformer over the sentence vectors, giving context-sensitive sentence representations."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.token_embedding = nn.Embedding(cfg.vocab_size, cfg.hidden, padding_idx=PAD_ID)
        self.register_buffer("positions", sinusoidal_table(cfg.max_positions, cfg.hidden), persistent=False)
        self.embed_scale = math.sqrt(cfg.hidden)
        self.dropout = nn.Dropout(cfg.dropout)
        self.sentence_encoder = TransformerStack(cfg, cfg.layers)
        self.document_encoder = TransformerStack(cfg, cfg.layers)
        self.apply(init_weights)

    def position_embedding(self, positions: Tensor) -> Tensor:
        return self.positions[positions].to(self.token_embedding.weight.dtype)

    def embed(self, ids: Tensor, positions: Tensor) -> Tensor:
        """Word embedding (scaled by sqrt(H)) + sinusoidal position, eq. 1; shared with the decoder."""
        return self.dropout(self.token_embedding(ids) * self.embed_scale + self.position_embedding(positions))

    def forward(self, docs: PackedDocuments) -> EncoderOutput:
        num_rows, width = docs.tokens.shape
        if max(width, docs.max_doc_len) > self.cfg.max_positions:
            raise ValueError(f"positions up to {max(width, docs.max_doc_len)} exceed max_positions "
                             f"{self.cfg.max_positions}")
        ids = docs.tokens.reshape(-1)
        if docs.token_index is not None:
            ids = ids.index_select(0, docs.token_index)
        words = self.sentence_encoder(
            self.embed(ids, docs.token_pos),
            Layout(num_rows, width, docs.token_index, docs.token_mask, cu_seqlens=docs.token_cu),
        )
        sentences = words.index_select(0, docs.eos_index) + self.position_embedding(docs.sent_pos)
        sentences = self.document_encoder(
            self.dropout(sentences),
            Layout(docs.num_docs, docs.max_doc_len, docs.sent_slot, docs.doc_mask, cu_seqlens=docs.doc_cu),
        )
        return EncoderOutput(token_flat=words, sentence_states=sentences, docs=docs)
