"""The encoder memory the abstractive decoder attends to, built once per batch of documents.

Every real source token's sentence-level state (`EncoderOutput.token_flat`), plus, by default, the
document-level vector of its sentence (`sentence_states`): one flat, padding-free stream, documents back
to back. Token-wise work (the K/V projections, `modeling.cross_attention`) runs on that stream; attention
views it as a [B, L] grid with a key mask (L = longest document in tokens), or, for VHT, as a [B, D, T]
sentence grid: `SourceMemory` holds the stream and both placements.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from hibert.modeling.encoder import EncoderOutput
from hibert.modeling.layers import sinusoidal_table
from hibert.modeling.packing import round_up
from hibert.tokens import BOS_ID, EOS_ID, MASK_ID, PAD_ID, SEP_ID


@dataclass
class SourceMemory:
    """The encoder memory of B documents, ready for every cross-attention variant to project."""

    states: Tensor          # [N, H] real source tokens, documents back to back (stream order)
    slot: Tensor            # [N] place of each token on the [B, L] document grid
    sentence_slot: Tensor   # [N] place of each token on the [B, D, T] sentence grid (VHT)
    key_mask: Tensor        # [B, L] bool, True = a real token
    token_mask: Tensor      # [B, D, T] bool, True = a real token (padding sentences: slot 0, never used)
    ids: Tensor             # [B, L] where copied probability goes: `copy_targets` of the source ids (PAD at padding)
    grid_ids: Tensor        # [B, D * T] the same on the sentence grid
    segment: Tensor         # [B, L] sentence of each slot within its document (0 at padding)
    sentences: Tensor       # [B, D, H] document-level sentence vectors (zeros at padding)
    sentence_mask: Tensor   # [B, D] bool
    rank: Tensor            # [D, H] sinusoidal embedding of sentence positions (Ma & Zong eq. 6, 11: R)
    structure: Tensor | None = None  # [B, D, H] structure-infused unit vectors (mds structural attention)

    @property
    def num_docs(self) -> int:
        return self.key_mask.shape[0]


def copy_targets(ids: Tensor) -> Tensor:
    """The target id that copying each source id votes for. Every source sentence ends with EOS (its state is
    the sentence vector, a natural attention sink), but a target's EOS ends the whole summary: copied, it
    would turn attention on sentence ends into probability of stopping. A source sentence marker (EOS, and
    BOS/MASK/SEP should a source carry them) copies as the target's sentence separator, SEP."""
    marker = (ids == EOS_ID) | (ids == BOS_ID) | (ids == MASK_ID)
    return ids.masked_fill(marker, SEP_ID)


def source_memory(encoded: EncoderOutput, add_sentence_vectors: bool, pad_to_multiple: int = 8) -> SourceMemory:
    """Flat memory stream and its grid placements, built on the device from the packed layout."""
    docs = encoded.docs
    if docs.token_index is None:
        raise ValueError("abstractive models read the packed layout (pack_documents), not pad_documents")
    rows = torch.repeat_interleave(torch.arange(docs.tokens.shape[0], device=docs.sent_lens.device),
                                   docs.sent_lens, output_size=docs.num_real_tokens)  # [N] row of each token
    doc = docs.doc_index[rows]
    b, d = docs.num_docs, docs.max_doc_len
    t = docs.max_sentence_len
    doc_tokens = torch.zeros(b, dtype=torch.long, device=rows.device).index_add_(0, docs.doc_index, docs.sent_lens)
    width = round_up(int(doc_tokens.max()), pad_to_multiple)
    first = doc_tokens.cumsum(0) - doc_tokens
    slot = doc * width + torch.arange(rows.shape[0], device=rows.device) - first[doc]
    sent_pos = docs.sent_pos[rows]
    sentence_slot = (doc * d + sent_pos) * t + docs.token_pos

    ids = copy_targets(docs.tokens.reshape(-1).index_select(0, docs.token_index))
    grid = lambda fill, src: src.new_full((b * width,), fill).index_copy_(0, slot, src).view(b, width)  # noqa: E731
    key_mask = grid(False, torch.ones_like(ids, dtype=torch.bool))
    token_mask = docs.tokens.new_zeros(b * d * t, dtype=torch.bool).index_fill_(0, sentence_slot, True).view(b, d, t)
    token_mask[:, :, 0] |= ~docs.doc_mask  # a padding sentence gets one (zero) key: no fully masked softmax row
    states = encoded.token_flat
    if add_sentence_vectors:
        states = states + encoded.sentence_states.index_select(0, rows)
    sentences, sentence_mask = encoded.sentences_by_document()
    structure = None if encoded.structure is None else encoded.sentences_by_document(encoded.structure)[0]
    return SourceMemory(
        states=states, slot=slot, sentence_slot=sentence_slot, key_mask=key_mask, token_mask=token_mask,
        ids=grid(PAD_ID, ids),
        grid_ids=ids.new_full((b * d * t,), PAD_ID).index_copy_(0, sentence_slot, ids).view(b, d * t),
        segment=grid(0, sent_pos), sentences=sentences, sentence_mask=sentence_mask,
        rank=sinusoidal_table(d, states.shape[1]).to(device=states.device, dtype=sentences.dtype),
        structure=structure,
    )
