"""Abstractive summarization on HIBERT: a Transformer decoder with cross-attention to the encoder memory,
optionally hierarchical (Ma & Zong, PHT eq. 7-10 / VHT eq. 11-13) and with a pointer-generator copy
(See et al. 2017; Chowdhury et al. §2).

Memory. Every real source token's sentence-level state (`EncoderOutput.token_flat`), plus, by default, the
document-level vector of its sentence (`sentence_states`): one flat, padding-free stream, documents back
to back. Token-wise work (the K/V projections) runs on that stream; attention views it as a [B, L] grid
with a key mask (L = longest document in tokens), or, for VHT, as a [B, D, T] sentence grid.

Queries. Cross-attention always sees queries as a [B, Q, H] grid: Q = target positions when teacher
forcing, Q = beams when decoding one step (beams are folded into the query axis, so each document's memory
K/V is computed once and never tiled), Q = beams x prefix when recomputing a prefix (benchmark only).

Self-attention runs through `modeling.layers.attention` when teacher forcing (flat causal stream, varlen
kernel on CUDA) and through `KVCache` when decoding step by step: same layers, same weights.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import sdpa_kernel

from hibert.config.abstractive import DecoderConfig
from hibert.config.model import ModelConfig
from hibert.modeling.encoder import EncoderOutput, HibertEncoder
from hibert.modeling.layers import (
    _CUDA_SDPA_BACKENDS,
    Layout,
    TransformerLayer,
    attention,
    init_weights,
    sinusoidal_table,
)
from hibert.modeling.packing import Document, PackedDocuments, Sentence, TensorBundle, pack_documents, round_up
from hibert.modeling.pretraining import _decoder_fields, token_losses
from hibert.modeling.structural import StructuralContext
from hibert.tokens import BOS_ID, EOS_ID, MASK_ID, PAD_ID, SEP_ID

SelfAttention = Callable[[Tensor], Tensor]  # qkv [N, 3H] -> attended values [N, H] (before attn_out)


# ---------------------------------------------------------------------------------------------- batch
@dataclass
class AbstractiveBatch(TensorBundle):
    """B documents and their B target summaries, flat: decoder input BOS + target, labels target + EOS
    (teacher forcing), Nd real decoder slots in all (the packed layout of `_decoder_fields`)."""

    docs: PackedDocuments
    dec_tokens: Tensor        # [Nd] decoder input ids
    dec_labels: Tensor        # [Nd] next-token targets
    dec_pos: Tensor           # [Nd] position in its target
    dec_doc: Tensor           # [Nd] document of each slot
    dec_index: Tensor         # [Nd] slot in the flat B*Td grid
    dec_cu: Tensor            # [B + 1] int32 start of each target in the stream
    target_lens: Tensor       # [B] decoder length of each target: subwords + 1
    max_target_len: int       # Td
    num_target_tokens: int    # real predicted tokens (subwords + EOS of every target)

    @property
    def num_docs(self) -> int:
        return self.target_lens.shape[0]


def make_abstractive_batch(docs: Sequence[Document], targets: Sequence[Sentence],
                           pad_to_multiple: int = 8) -> AbstractiveBatch:
    """Padding-free batch. `docs`: lists of sentences of token ids (no specials); `targets[b]`: the summary
    subwords of document b (no specials; the caller joins summary sentences with SEP_ID)."""
    if len(docs) != len(targets):
        raise ValueError(f"{len(docs)} documents but {len(targets)} targets")
    packed = pack_documents(docs, pad_to_multiple)
    fields = _decoder_fields([[t] for t in targets], np.arange(len(docs), dtype=np.int64), None, pad_to_multiple)
    return AbstractiveBatch(
        docs=packed, dec_tokens=fields["dec_tokens"], dec_labels=fields["dec_labels"], dec_pos=fields["dec_pos"],
        dec_doc=fields["dec_rows"], dec_index=fields["dec_index"], dec_cu=fields["dec_cu"],
        target_lens=fields["target_lens"], max_target_len=fields["max_target_len"],
        num_target_tokens=fields["num_target_tokens"],
    )


@dataclass
class AbstractiveOutput:
    loss: Tensor               # mean per target token, label-smoothed if asked: what is backpropagated
    nll_sum: Tensor            # summed NLL without smoothing (detached)
    num_target_tokens: int     # the count nll_sum is summed over
    log_probs: Tensor | None = None  # [Nd, V] fp32 next-token log-probabilities (the copy mixture) when asked
    coverage_loss: Tensor | None = None  # mean per target token of sum_i min(a_i, c_i) (decoder.coverage; detached)


# ---------------------------------------------------------------------------------------------- memory
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


@dataclass
class CrossCache(TensorBundle):
    """One layer's projected memory for B documents (computed once per batch); every field has the
    documents on dim 0, so dropping finished documents is one index_select per field."""

    keys: Tensor                       # [B, heads, L, d]; K^T [B, heads, d, L] when keys_t; VHT: [B, heads, D, T, d]
    values: Tensor
    key_mask: Tensor                   # [B, L]  ([B, D, T] for VHT)
    ids: Tensor                        # [B, L]  ([B, D * T] for VHT): source ids under the token attention
    segment: Tensor | None = None      # [B, L] sentence of each key (PHT)
    sent_keys: Tensor | None = None    # [B, heads, D, d] (PHT)
    sent_values: Tensor | None = None
    sent_mask: Tensor | None = None    # [B, D] (PHT, VHT)
    rank: Tensor | None = None         # [B, D, 2H] VHT: the sentence-position embeddings R (eq. 11) and `out`'s bias
                                       # through `sent_kv` (the same for every query: projected once per batch)
    key_bias: Tensor | None = None     # [B, 1, 1, L] 0 / -inf: the key mask as SDPA's cheaper additive form
    struct_keys: Tensor | None = None    # [B, heads, D, d] the decoder's structural context (last layer's cache)
    struct_values: Tensor | None = None
    struct_bias: Tensor | None = None    # [B, 1, 1, D]
    keys_t: bool = False                 # keys are stored transposed (attention by matmul: PHT, flat on CPU)

    def select(self, docs: Tensor) -> "CrossCache":
        return self._map(lambda t: t.index_select(0, docs))


def _sdpa(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
    """Fused attention; on CUDA without cuDNN attention, as in `modeling.layers.attention` (it plans
    per shape, and decoding shapes change as documents finish)."""
    if q.is_cuda:
        with sdpa_kernel(_CUDA_SDPA_BACKENDS):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _split_heads(x: Tensor, heads: int) -> Tensor:
    """[..., Q, H] -> [..., heads, Q, d]."""
    *lead, q, h = x.shape
    return x.view(*lead, q, heads, h // heads).transpose(-2, -3)


def _merge_heads(x: Tensor) -> Tensor:
    """[..., heads, Q, d] -> [..., Q, H]."""
    *lead, heads, q, d = x.shape
    return x.transpose(-2, -3).reshape(*lead, q, heads * d)


def _grid_kv(proj: Tensor, slot: Tensor, shape: tuple[int, ...], heads: int,
             keys_t: bool = False) -> tuple[Tensor, Tensor]:
    """K/V projections of the flat memory `proj [N, 2H]` placed on a zero grid `shape` (e.g. (B, L)):
    two [*shape[:1], heads, *shape[1:], d] tensors, contiguous for the attention matmuls (`keys_t`: the
    keys as K^T, [B, heads, d, L], what `q @ K^T` reads contiguously)."""
    n, width = proj.shape
    hidden = width // 2
    size = math.prod(shape)
    grid = proj.new_empty(size, width).index_copy_(0, slot, proj)
    if n < size:  # zeros where no token lands (a pass over the padding only, not the whole grid)
        covered = torch.zeros(size, dtype=torch.bool, device=slot.device).index_fill_(0, slot, True)
        grid.index_fill_(0, torch.nonzero(~covered).squeeze(1), 0.0)
    grid = grid.view(*shape, 2, heads, hidden // heads)
    k, v = grid.unbind(-3)                                   # [B, *rest, heads, d]
    order = (0, k.dim() - 2, *range(1, k.dim() - 2), k.dim() - 1)
    k_order = (0, k.dim() - 2, k.dim() - 1, *range(1, k.dim() - 2)) if keys_t else order
    return k.permute(k_order).contiguous(), v.permute(order).contiguous()


def segment_softmax(scores: Tensor, segment: Tensor, num_segments: int, weights: Tensor | None = None,
                    nonempty: Tensor | None = None) -> Tensor:
    """Softmax of `scores [B, h, Q, L]` within each segment (`segment [B, L]` in 0..num_segments-1;
    masked keys must score -inf), times `weights [B, h or 1, Q, num_segments]` of the segment if given.
    `nonempty [B, num_segments]`: which segments hold a key (derived from `segment` when not given).
    Exact for any score range: each segment is shifted by its own max (detached: softmax does not depend
    on it), so none underflows. Without autograd it works in place (`scores` may be consumed); on the CPU it
    first shifts by the row max (one cheap reduction instead of a scatter-max pass) and keeps that unless
    some segment's sum underflowed (all its scores ~70 below the row's best), which a branch checks — a
    branch that would be a device sync on CUDA, where the exact path always runs."""
    index = segment[:, None, None, :].expand_as(scores)
    shape = (*scores.shape[:-1], num_segments)
    grad = scores.requires_grad
    if not grad and not scores.is_cuda:
        e = (scores - scores.amax(-1, keepdim=True)).exp_()
        total = scores.new_zeros(shape).scatter_add_(-1, index, e)
        if nonempty is None:
            nonempty = torch.zeros(shape[0], num_segments, dtype=torch.bool, device=scores.device)
            nonempty.scatter_(-1, segment, True)
        if not bool(((total < 1e-30) & nonempty[:, None, None, :]).any()):
            return _scale_segments(e, total, index, weights, grad)
        # else: an exact per-segment shift, below
    top = scores.new_full(shape, -math.inf).scatter_reduce_(-1, index, scores.detach(), "amax", include_self=True)
    top = top.gather(-1, index)
    e = (scores - top).exp() if grad else scores.sub_(top).exp_()
    return _scale_segments(e, scores.new_zeros(shape).scatter_add(-1, index, e), index, weights, grad)


def _scale_segments(e: Tensor, total: Tensor, index: Tensor, weights: Tensor | None, grad: bool) -> Tensor:
    """e / (its segment's total) x (its segment's weight)."""
    total = torch.where(total > 0, total, 1.0)  # empty segments (padding sentences): no 0/0, not even in backward
    scale = (1 / total if weights is None else weights / total).gather(-1, index)
    return e * scale if grad else e.mul_(scale)


# ---------------------------------------------------------------------------------------------- cross-attention
class FlatCrossAttention(nn.Module):
    """Standard multi-head attention from the decoder to every memory token of its document.

    With `coverage` (See et al. 2017 §2.3, on the copy layer): the coverage vector c^t = sum_{t' < t} a^{t'}
    (the sum of the earlier attention distributions, averaged over heads) enters every head's scores as
    w_c^z c_i^t — eq. 11's w_c c_i^t, one learned scalar per head for a dot-product attention (zero at
    start: the attention is the plain one until training moves it)."""

    def __init__(self, cfg: ModelConfig, coverage: bool = False):
        super().__init__()
        h = cfg.hidden
        self.heads = cfg.heads
        self.scale = (h // cfg.heads) ** -0.5
        self.q = nn.Linear(h, h)
        self.kv = nn.Linear(h, 2 * h)
        self.out = nn.Linear(h, h)
        self.coverage = nn.Parameter(torch.zeros(cfg.heads)) if coverage else None

    def prepare(self, mem: SourceMemory) -> CrossCache:
        # the fused SDPA kernel on CUDA; on the CPU two matmuls (`forward`), which read K^T
        keys_t = self.attends_by_matmul(mem.states)
        k, v = _grid_kv(self.kv(mem.states), mem.slot, tuple(mem.key_mask.shape), self.heads, keys_t)
        bias = torch.zeros_like(mem.key_mask, dtype=k.dtype).masked_fill(~mem.key_mask, -math.inf)
        return CrossCache(keys=k, values=v, key_mask=mem.key_mask, ids=mem.ids, key_bias=bias[:, None, None, :],
                          keys_t=keys_t)

    @staticmethod
    def attends_by_matmul(x: Tensor) -> bool:
        """On the CPU, softmax(q K^T) V as two matmuls: with decoding's few queries per document (the beams)
        the flash kernel is ~20% slower (2 cores, 16 documents x 800 keys, beam 5; training shapes: equal)."""
        return not x.is_cuda

    def _scores(self, q: Tensor, cache: CrossCache) -> Tensor:
        """fp32 scores [B, h, Q, L] of scaled queries, -inf at padding (a fresh tensor)."""
        s = (q @ self._keys_t(cache)).float()
        return s.add_(cache.key_bias)

    def _keys_t(self, cache: CrossCache) -> Tensor:
        return cache.keys if cache.keys_t else cache.keys.transpose(-1, -2)

    def forward(self, x: Tensor, cache: CrossCache, want_attention: bool = False) -> tuple[Tensor, Tensor | None]:
        """`x [B, Q, H]` -> (context [B, Q, H], token attention [B, Q, L] (mean over heads) or None)."""
        q = _split_heads(self.q(x), self.heads)
        if not want_attention and not cache.keys_t:
            out = _sdpa(q, cache.keys, cache.values, cache.key_bias)
            return self.out(_merge_heads(out)), None
        p = torch.softmax(self._scores(q * self.scale, cache), dim=-1)
        out = p.to(cache.values.dtype) @ cache.values
        return self.out(_merge_heads(out)), p.mean(1) if want_attention else None

    def attend_with_coverage(self, x: Tensor, cache: CrossCache, before: Tensor | None = None,
                             period: int | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """`x [B, Q, H]` -> (context [B, Q, H], token attention a [B, Q, L] (mean over heads), the coverage
        c [B, Q, L] each query attended with). `before` given (decoding a step): every query's own coverage.
        Otherwise (teacher forcing) the recurrence c^t = sum_{t' < t} a^{t'} runs along the query axis, from
        zero at every `period`-th query (one target per row: period = Q; recomputed prefixes: their length)."""
        q = _split_heads(self.q(x), self.heads)
        s = self._scores(q * self.scale, cache)                                   # [B, h, Q, L] fp32
        w = self.coverage.float()[None, :, None]                                  # [1, h, 1]
        if before is not None:
            cov = before.float()
            p = torch.softmax(s + w[..., None] * cov[:, None], dim=-1)
        else:
            period = period or s.shape[2]
            probs, covs = [], []
            c = s.new_zeros(s.shape[0], s.shape[-1])
            for j in range(s.shape[2]):            # a^t depends on c^t, which sums the earlier a: sequential
                if j % period == 0:
                    c = torch.zeros_like(c)
                covs.append(c)
                pj = torch.softmax(s[:, :, j] + w * c[:, None], dim=-1)           # [B, h, L]
                probs.append(pj)
                c = c + pj.mean(1)
            p, cov = torch.stack(probs, 2), torch.stack(covs, 1)
        out = p.to(cache.values.dtype) @ cache.values
        return self.out(_merge_heads(out)), p.mean(1), cov


def coverage_loss(attn: Tensor, coverage: Tensor) -> Tensor:
    """See et al. 2017 eq. 12: covloss_t = sum_i min(a_i^t, c_i^t), per row `[N, L]` -> [N]."""
    return torch.minimum(attn.float(), coverage.float()).sum(-1)


class ParallelCrossAttention(FlatCrossAttention):
    """PHT (Ma & Zong §3.1.2, eq. 7-10), with HIBERT's sentences as the paragraphs.

    Reading of the paper: the sentence-level attention (eq. 7) is a multi-head attention whose query is
    the decoder state X^1 and whose keys AND values are the *static* paragraph embeddings Phi plus the
    ranking encoding R (eq. 6) — here Phi = HIBERT's document-level sentence vectors, R = the sinusoid of
    the sentence's position in its document. Its attention weights, averaged over heads (footnote 5), are
    A^para [Q, D]. The word-level attention (eq. 8) is one multi-head attention per sentence: a softmax over
    that sentence's tokens only. Eq. 9 sums the per-sentence outputs weighted by A^para, eq. 10 adds both
    contexts to the residual: X^2 = LN(X^1 + X^para + X^int).

    Computed exactly and at flat's cost: one score matmul over all memory tokens, a softmax within each
    sentence (`segment_softmax`), times A^para of the token's sentence — a distribution over tokens (per
    head it sums to sum_p A_p = 1) — then one value matmul. Because the output projection is linear and the
    A_p sum to 1, out(p @ V) = sum_p A_p X_p^word, bias included, i.e. exactly eq. 9."""

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        h = cfg.hidden
        self.sent_q = nn.Linear(h, h)
        self.sent_kv = nn.Linear(h, 2 * h)
        self.sent_out = nn.Linear(h, h)

    def prepare(self, mem: SourceMemory) -> CrossCache:
        cache = super().prepare(mem)
        phi = mem.sentences + mem.rank  # eq. 6: Phi := Phi + R
        ks, vs = (_split_heads(t, self.heads).contiguous() for t in self.sent_kv(phi).chunk(2, dim=-1))
        cache.segment, cache.sent_mask = mem.segment, mem.sentence_mask
        cache.sent_keys, cache.sent_values = ks, vs  # [B, h, D, d]
        return cache

    @staticmethod
    def attends_by_matmul(x: Tensor) -> bool:
        return True  # PHT never calls SDPA: K^T for q @ K^T on every device

    def forward(self, x: Tensor, cache: CrossCache, want_attention: bool = False) -> tuple[Tensor, Tensor | None]:
        token_p, sent_context = self.distributions(x, cache)
        out = self.out(_merge_heads(token_p.to(cache.values.dtype) @ cache.values))  # eq. 8-9
        return sent_context + out, token_p.mean(1) if want_attention else None      # eq. 10 (sum part)

    def distributions(self, x: Tensor, cache: CrossCache) -> tuple[Tensor, Tensor]:
        """(per-head token distribution [B, h, Q, L] = A^para x within-sentence softmax, X^para [B, Q, H])."""
        qs = _split_heads(self.sent_q(x), self.heads)
        s = (qs @ cache.sent_keys.transpose(-1, -2)).float() * self.scale
        a_heads = torch.softmax(s.masked_fill(~cache.sent_mask[:, None, None, :], -math.inf), dim=-1)  # eq. 7
        sent_context = self.sent_out(_merge_heads(a_heads.to(cache.sent_values.dtype) @ cache.sent_values))
        a_para = a_heads.mean(1, keepdim=True)                                    # [B, 1, Q, D], footnote 5
        q = _split_heads(self.q(x), self.heads) * self.scale
        # eq. 8's softmax within each sentence, times A^para of the sentence (eq. 9), in one pass
        p = segment_softmax(self._scores(q, cache), cache.segment, a_para.shape[-1], a_para, cache.sent_mask)
        return p, sent_context


class VerticalCrossAttention(nn.Module):
    """VHT (Ma & Zong §3.2, eq. 11-13), with HIBERT's sentences as the paragraphs.

    Reading of the paper: no static paragraph embeddings. The word-level multi-head attention (eq. 8) runs
    within every sentence, giving per query one context vector per sentence, X_t^word [D, H] — the
    *dynamic* paragraph embeddings. The ranking encoding is added (eq. 11), and a second multi-head
    attention with query X_t^1 uses them as keys AND values (eq. 12); its output alone is the cross-attention
    context (eq. 13: X^2 = LN(X^1 + X^para)). Done on the [B, D, T] sentence grid: per-sentence context
    vectors are a batched matmul per sentence (VHT's extra cost over flat/PHT is the sentence-level
    projections of D context vectors per query, which the paper also reports). Those projections are
    `sent_kv(out(words) + R)`: two linear maps, applied as one [2H, H] matrix (a third fewer multiply-adds per
    query and sentence), with R and the biases projected once per batch in `prepare`.

    Token distribution (for copy): sentence attention averaged over heads x within-sentence attention
    averaged over heads — it sums to 1 over the document's tokens."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        h = cfg.hidden
        self.heads = cfg.heads
        self.scale = (h // cfg.heads) ** -0.5
        self.q, self.kv, self.out = nn.Linear(h, h), nn.Linear(h, 2 * h), nn.Linear(h, h)
        self.sent_q, self.sent_kv, self.sent_out = nn.Linear(h, h), nn.Linear(h, 2 * h), nn.Linear(h, h)
        self._fused: tuple[tuple, Tensor] | None = None  # (weights' identity and versions, sent_kv.W @ out.W)

    def word_to_sentence_kv(self) -> Tensor:
        """sent_kv.weight @ out.weight [2H, H], fp32. Recomputed whenever gradients are on (training); without
        them (decoding) kept until either weight changes (in-place updates bump a tensor's version)."""
        w_kv, w_out = self.sent_kv.weight, self.out.weight
        key = (w_kv.data_ptr(), w_kv._version, w_out.data_ptr(), w_out._version)
        if torch.is_grad_enabled() or self._fused is None or self._fused[0] != key:
            with torch.autocast(w_kv.device.type, enabled=False):
                fused = w_kv.float() @ w_out.float()
            if torch.is_grad_enabled():
                return fused
            self._fused = (key, fused)
        return self._fused[1]

    def prepare(self, mem: SourceMemory) -> CrossCache:
        k, v = _grid_kv(self.kv(mem.states), mem.sentence_slot, tuple(mem.token_mask.shape), self.heads)
        rank = mem.rank.expand(mem.num_docs, -1, -1) + self.out.bias          # R + out's bias, through sent_kv
        return CrossCache(keys=k, values=v, key_mask=mem.token_mask, ids=mem.grid_ids, sent_mask=mem.sentence_mask,
                          rank=self.sent_kv(rank).contiguous())

    def forward(self, x: Tensor, cache: CrossCache, want_attention: bool = False) -> tuple[Tensor, Tensor | None]:
        q = _split_heads(self.q(x), self.heads) * self.scale                     # [B, h, Q, d]
        s = (q[:, :, None] @ cache.keys.transpose(-1, -2)).float()               # [B, h, D, Q, T]
        alpha = torch.softmax(s.masked_fill(~cache.key_mask[:, None, :, None, :], -math.inf), dim=-1)
        words = (alpha.to(cache.values.dtype) @ cache.values).transpose(1, 2)     # [B, D, h, Q, d]
        # eq. 8 and 11, then eq. 12's keys/values: sent_kv(out(words) + R), as one matrix (+ R's part, prepared)
        kv = F.linear(_merge_heads(words), self.word_to_sentence_kv().to(words.dtype)) + cache.rank[:, :, None, :]
        ks, vs = (_split_heads(t, self.heads).permute(0, 2, 3, 1, 4) for t in kv.chunk(2, -1))
        qs = _split_heads(self.sent_q(x), self.heads)[:, :, :, None]              # [B, h, Q, 1, d]
        sb = (qs @ ks.transpose(-1, -2)).float().squeeze(-2) * self.scale         # [B, h, Q, D]
        beta = torch.softmax(sb.masked_fill(~cache.sent_mask[:, None, None, :], -math.inf), dim=-1)  # eq. 12
        context = self.sent_out(_merge_heads((beta[..., None, :].to(vs.dtype) @ vs).squeeze(-2)))   # eq. 13
        if not want_attention:
            return context, None
        token_p = beta.mean(1)[..., None] * alpha.mean(1).transpose(1, 2)        # [B, Q, D, T]
        return context, token_p.flatten(2)


CROSS_ATTENTION = {"flat": FlatCrossAttention, "pht": ParallelCrossAttention, "vht": VerticalCrossAttention}


# ---------------------------------------------------------------------------------------------- decoder
def decoder_model_config(enc: ModelConfig, dec: DecoderConfig) -> ModelConfig:
    """The ModelConfig the decoder layers are built from: the encoder's width, vocabulary and activation;
    the decoder's depth, heads, FFN, dropout and norm placement."""
    fields = enc.model_dump()
    fields.update(heads=dec.heads or enc.heads, ffn=dec.ffn, dropout=dec.dropout, norm_first=dec.norm_first,
                  layers=dec.layers, decoder_layers=None, max_positions=dec.max_positions,
                  activation_checkpointing=False)
    if enc.hidden % fields["heads"]:
        raise ValueError(f"decoder.heads ({fields['heads']}) must divide model.hidden ({enc.hidden})")
    return ModelConfig(**fields)


@dataclass(frozen=True)
class QueryLayout:
    """Where the decoder's rows `x [N, H]` sit on the [B, Q] query grid of cross-attention."""

    num_docs: int
    width: int                  # Q
    index: Tensor | None = None  # [N] slot in the B*Q grid; None = the rows are the grid, in order

    def to_grid(self, x: Tensor) -> Tensor:
        if self.index is not None:
            x = x.new_zeros(self.num_docs * self.width, x.shape[-1]).index_copy_(0, self.index, x)
        return x.view(self.num_docs, self.width, -1)

    def from_grid(self, g: Tensor) -> Tensor:
        g = g.reshape(self.num_docs * self.width, -1)
        return g if self.index is None else g.index_select(0, self.index)


@dataclass(frozen=True)
class CoverageInput:
    """How the coverage layer gets its coverage: `before [N, L]`, each row's own (decoding one step), or,
    when None, the recurrence along each row's queries, restarted every `period` queries (teacher forcing)."""

    before: Tensor | None = None
    period: int | None = None


class DecoderLayer(TransformerLayer):
    """Causal self-attention, cross-attention to the memory, FFN; residuals and LayerNorm post (paper) or
    pre (cfg.norm_first). The self-attention and FFN parameters are a `TransformerLayer`'s (same names as
    the pretraining decoder's layers, so they can start from them); `self_attention` is injected so that
    teacher forcing (flat causal stream) and cached decoding share every weight and every line here."""

    def __init__(self, cfg: ModelConfig, cross_attention: str, coverage: bool = False):
        super().__init__(cfg)
        if coverage and cross_attention != "flat":
            raise ValueError(f"decoder.coverage needs flat cross-attention, not {cross_attention!r}")
        self.cross = CROSS_ATTENTION[cross_attention](cfg, coverage=True) if coverage else \
            CROSS_ATTENTION[cross_attention](cfg)
        self.cross_norm = nn.LayerNorm(cfg.hidden)

    def forward(self, x: Tensor, self_attention: SelfAttention, queries: QueryLayout, memory: CrossCache,
                want_attention: bool = False, coverage: "CoverageInput | None" = None
                ) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
        """-> (output [N, H], cross context [N, H], token attention [N, L] (mean over heads) or None, the
        coverage [N, L] it attended with or None). `coverage` (the coverage layer only): see CoverageInput."""
        pre = self.norm_first
        h = self.attn_norm(x) if pre else x
        x = x + self.dropout(self.attn_out(self_attention(self.qkv(h))))
        if not pre:
            x = self.attn_norm(x)
        h = self.cross_norm(x) if pre else x
        cov = None
        if coverage is not None:
            before = None if coverage.before is None else queries.to_grid(coverage.before)
            context, attn, cov = self.cross.attend_with_coverage(queries.to_grid(h), memory, before, coverage.period)
            cov = queries.from_grid(cov)
        else:
            context, attn = self.cross(queries.to_grid(h), memory, want_attention)
        context = queries.from_grid(context)
        x = x + self.dropout(context)
        if not pre:
            x = self.cross_norm(x)
        x = x + self._ffn(self.ffn_norm(x) if pre else x)
        if not pre:
            x = self.ffn_norm(x)
        return x, context, None if attn is None else queries.from_grid(attn), cov


class KVCache:
    """Self-attention keys/values of every decoder layer for R = B x K hypotheses (B documents, K beams,
    document-major rows), preallocated for `max_len` positions. A step writes each hypothesis' k/v once;
    nothing written is ever moved again.

    Layout [layers, 2, B, max_len, K, H]: a document's entries (position j, beam slot k) form one
    contiguous block. Beam search hands a beam another beam's prefix at most steps; rather than copying
    prefixes after the backpointers, each hypothesis keeps a visibility row over its document's (position,
    slot) entries — one per position, its ancestors' — and attends over all of them under that additive
    mask (0 / -inf): the same softmax over the same keys, K times the dot products, reads of one contiguous
    block per document. Following the backpointers is one index_select of the [R, max_len * K] mask.
    Measured on 2 CPU cores, H=256, 6 layers, K=5, 50 positions: attention plus prefix copies (~1/4 of
    the rows take another's prefix per step) 5.0 ms per step for 16 documents, 2.2 ms this way; one
    document: 0.23 ms either way."""

    def __init__(self, num_layers: int, rows: int, heads: int, max_len: int, beams: int = 1):
        if rows % beams:
            raise ValueError(f"{rows} hypotheses are not {beams} beams per document")
        self.num_layers, self.rows, self.heads, self.max_len, self.beams = num_layers, rows, heads, max_len, beams
        self.docs = rows // beams
        self.kv: Tensor | None = None    # allocated at the first write, in the dtype the layers produce
        self.mask: Tensor | None = None  # [R, >= max_len * K] 0 where a hypothesis sees an entry, -inf elsewhere
        self.length = 0

    def attend(self, layer: int, qkv: Tensor) -> Tensor:
        """Write this step's k/v of `layer`, attend from this step's queries to positions 0..length."""
        r, width = qkv.shape
        t, h, hidden, k, b = self.length, self.heads, width // 3, self.beams, self.docs
        d = hidden // h
        if t >= self.max_len:
            raise ValueError(f"KV cache full ({self.max_len} positions)")
        if r != self.rows:
            raise ValueError(f"{r} queries for a cache of {self.rows} hypotheses")
        if self.kv is None:
            # empty, not zeros: an entry is read only once written (every hypothesis writes at every step)
            self.kv = qkv.new_empty(self.num_layers, 2, b, self.max_len, k, hidden)
            # the row width rounded to 16 elements keeps each mask row aligned for CUDA's attention kernels
            self.mask = qkv.new_full((r, round_up(self.max_len * k, 16)), float("-inf"))
        if layer == 0:  # this step's entry of each hypothesis is its own slot at position t
            self._entries()[:, :, t].diagonal(dim1=1, dim2=2).fill_(0.0)
        cache = self.kv[layer, :, :b]
        cache[:, :, t] = qkv[:, hidden:].view(b, k, 2, hidden).permute(2, 0, 1, 3)  # k and v in one copy
        q = qkv[:, :hidden]
        n = (t + 1) * k
        view = lambda x: x[:, : t + 1].view(b, n, h, d).transpose(1, 2)  # noqa: E731  [B, h, (t+1) K, d]
        mask = None if k == 1 else self.mask[:, :n].view(b, 1, k, n)   # one beam sees all of its own entries
        out = _sdpa(q.view(b, k, h, d).transpose(1, 2), view(cache[0]), view(cache[1]), mask)  # [B, h, K, d]
        return out.transpose(1, 2).reshape(r, hidden)

    def _entries(self) -> Tensor:
        """The mask as [B, K hypotheses, max_len, K slots]."""
        b, k = self.docs, self.beams
        return self.mask[:, : self.max_len * k].view(b, k, self.max_len, k)

    def reorder(self, rows: Tensor, keep_docs: Tensor | None = None) -> None:
        """Hypothesis i becomes old hypothesis `rows[i]`, which must belong to the same document: document
        i // K, or, with `keep_docs` (the documents that stay, ascending), document keep_docs[i // K]. The
        entries of documents that leave are dropped (the kept ones move down, once per finished batch of
        documents)."""
        if keep_docs is not None and keep_docs.numel() != self.docs:
            n = keep_docs.numel()
            if self.kv is not None and self.length > 0:
                t = self.length
                for layer in range(self.num_layers):  # a layer at a time: the gathered copy is 1/layers of the cache
                    self.kv[layer, :, :n, :t] = self.kv[layer, :, keep_docs, :t]  # the right side is gathered first
            self.docs = n
        if rows.shape[0] != self.docs * self.beams:
            raise ValueError(f"{rows.shape[0]} hypotheses after reorder, expected {self.docs} x {self.beams}")
        if not rows.is_cuda:  # a mask is relative to its document; on CUDA this check would sync the host each step
            doc = torch.arange(self.docs, device=rows.device).repeat_interleave(self.beams)
            if keep_docs is not None:
                doc = keep_docs.to(rows.device)[doc]
            if not bool((rows // self.beams == doc).all()):
                raise ValueError("reorder: a hypothesis can only continue a hypothesis of its own document")
        if self.mask is not None:
            self.mask = self.mask.index_select(0, rows)
        self.rows = rows.shape[0]


@dataclass
class DecodeState:
    """Everything incremental decoding keeps between steps for R = B x K hypotheses."""

    memory: list[CrossCache]  # per decoder layer, B documents on dim 0, never tiled over beams
    cache: KVCache            # self-attention K/V, R rows
    beams: int                # K
    coverage: Tensor | None = None  # [R, L] fp32: the sum of each hypothesis' copy attentions so far

    @property
    def num_docs(self) -> int:
        return self.memory[0].keys.shape[0]

    @property
    def step(self) -> int:
        return self.cache.length

    def reorder(self, rows: Tensor, keep_docs: Tensor | None = None) -> None:
        """Follow backpointers (`rows` indexes the current R rows; K per kept document) and, if
        `keep_docs` is given, drop the other documents' memory."""
        if keep_docs is not None:
            self.memory = [m.select(keep_docs) for m in self.memory]
        self.cache.reorder(rows, keep_docs)
        if self.coverage is not None:
            self.coverage = self.coverage.index_select(0, rows)


class AbstractiveDecoder(nn.Module):
    """Transformer decoder over the target: embeddings (a token table scaled by sqrt(H) + its own sinusoidal
    positions), `DecoderLayer`s, a final LayerNorm when pre-LN, and the output head: a (tied) vocabulary
    projection, optionally mixed with a copy distribution over the source (pointer-generator)."""

    def __init__(self, enc_cfg: ModelConfig, dec_cfg: DecoderConfig, structural_context: bool = False):
        super().__init__()
        cfg = decoder_model_config(enc_cfg, dec_cfg)
        self.cfg, self.dec_cfg = cfg, dec_cfg
        h = cfg.hidden
        self.heads = cfg.heads
        self.embed_scale = math.sqrt(h)
        self.register_buffer("positions", sinusoidal_table(dec_cfg.max_positions, h), persistent=False)
        self.token_embedding = (None if dec_cfg.tie_input_embeddings
                                else nn.Embedding(cfg.vocab_size, h, padding_idx=PAD_ID))
        self.dropout = nn.Dropout(cfg.dropout)
        # coverage (See et al.) lives on the last layer: the one whose attention is the copy distribution
        self.layers = nn.ModuleList(DecoderLayer(cfg, dec_cfg.cross_attention, dec_cfg.coverage and i == dec_cfg.layers - 1)
                                    for i in range(dec_cfg.layers))
        self.final_norm = nn.LayerNorm(h) if cfg.norm_first else nn.Identity()
        self.output = None if dec_cfg.tie_output_embeddings else nn.Linear(h, cfg.vocab_size, bias=False)
        # p_gen = sigmoid(w . [context; decoder state; input embedding] + b)  (See et al. 2017, eq. 8)
        self.copy_gate = nn.Linear(3 * h, 1) if dec_cfg.copy else None
        # Chowdhury et al.: a context over the structure-infused unit vectors feeds P_vocab and p_gen (mds)
        self.structure = StructuralContext(h, cfg.heads) if structural_context else None
        self.apply(init_weights)

    def embed(self, ids: Tensor, positions: Tensor, table: Tensor) -> Tensor:
        """Target embedding before dropout: table[ids] * sqrt(H) + sinusoid(position)."""
        return F.embedding(ids, table) * self.embed_scale + self.positions[positions].to(table.dtype)

    def prepare(self, mem: SourceMemory) -> list[CrossCache]:
        """Every layer's projected memory, once per batch of documents (the last layer's cache also holds the
        structural context's keys and values)."""
        caches = [layer.cross.prepare(mem) for layer in self.layers]
        if self.structure is not None:
            if mem.structure is None:
                raise ValueError("the decoder's structural context needs structure-infused unit vectors "
                                 "(mds.structural_attention)")
            last = caches[-1]
            last.struct_keys, last.struct_values, last.struct_bias = self.structure.prepare(
                mem.structure, mem.sentences, mem.sentence_mask)
        return caches

    def vocab_logits(self, hidden: Tensor, context: Tensor, queries: QueryLayout, memory: CrossCache,
                     weight: Tensor) -> tuple[Tensor, Tensor]:
        """(vocabulary logits [N, V], the context p_gen reads). With the structural context (Chowdhury et al.),
        c_struct joins the state the vocabulary is projected from and replaces the cross context in p_gen."""
        if self.structure is None:
            return F.linear(hidden, weight), context
        c = queries.from_grid(self.structure(queries.to_grid(hidden), memory.struct_keys, memory.struct_values,
                                             memory.struct_bias))
        return F.linear(hidden + c, weight), c

    def run(self, emb: Tensor, self_attention: Callable[[int], SelfAttention], queries: QueryLayout,
            memory: list[CrossCache], coverage: CoverageInput | None = None
            ) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
        """Decoder stack on rows `emb [N, H]` -> (final states, last layer's cross context, last layer's token
        attention when copying, the coverage it attended with when `decoder.coverage`)."""
        x = self.dropout(emb)
        context, attn, cov = x, None, None
        last = len(self.layers) - 1
        if self.dec_cfg.coverage and coverage is None:
            coverage = CoverageInput()
        for i, layer in enumerate(self.layers):
            x, context, attn, cov = layer(x, self_attention(i), queries, memory[i],
                                          want_attention=self.copy_gate is not None and i == last,
                                          coverage=coverage if i == last and self.dec_cfg.coverage else None)
        return self.final_norm(x), context, attn, cov

    def log_probs(self, logits: Tensor, hidden: Tensor, context: Tensor, attn: Tensor | None, emb: Tensor,
                  queries: QueryLayout, memory: CrossCache) -> Tensor:
        """fp32 next-token log-probabilities [N, V] from the vocabulary logits of `hidden`: their log
        softmax, or the pointer-generator mixture p = p_gen p_vocab + (1 - p_gen) sum_{i: src_i = w} a_i,
        in log space."""
        logp_vocab = torch.log_softmax(logits.float(), dim=-1)
        if self.copy_gate is None:
            return logp_vocab
        return copy_mixture(logp_vocab, self.copy_gate(torch.cat([context, hidden, emb], dim=-1)).float(),
                            attn, queries, memory.ids)


def copy_mixture(logp_vocab: Tensor, gate_logit: Tensor, attn: Tensor, queries: QueryLayout, ids: Tensor) -> Tensor:
    """log(p_gen p_vocab + (1 - p_gen) p_copy), all fp32. `attn [N, L]` is a distribution over the memory
    slots of each row's document, `ids [B, L]` their source ids (padding slots carry 0 probability); the
    copy distribution scatters it onto the vocabulary (no extended vocabulary: SentencePiece has no OOV).
    logaddexp keeps tokens absent from the source (log p_copy = -inf) finite and their gradients clean."""
    grid = queries.to_grid(attn.float())                                       # [B, Q, L]
    copy = torch.zeros(*grid.shape[:2], logp_vocab.shape[-1], dtype=torch.float32, device=grid.device)
    copy.scatter_add_(-1, ids[:, None, :].expand(-1, grid.shape[1], -1), grid)
    copy = queries.from_grid(copy)                                             # [N, V]
    log_copy = torch.where(copy > 0, copy.clamp_min(1e-30).log(), -math.inf)  # clamp: no 0 * inf in backward
    return torch.logaddexp(F.logsigmoid(gate_logit) + logp_vocab, F.logsigmoid(-gate_logit) + log_copy)


# ---------------------------------------------------------------------------------------------- model
class HibertAbstractive(nn.Module):
    """HIBERT encoder + abstractive decoder. `.encoder` is the `HibertEncoder` of `HibertForPretraining` and
    `HibertExtractive` (same keys: registered encoders load into it with strict=True); `.decoder` holds
    everything else (no encoder weight is registered twice: the tied token table is read, not owned)."""

    def __init__(self, enc_cfg: ModelConfig, dec_cfg: DecoderConfig):
        super().__init__()
        self.cfg, self.dec_cfg = enc_cfg, dec_cfg
        self.encoder = HibertEncoder(enc_cfg)
        self.decoder = AbstractiveDecoder(enc_cfg, dec_cfg)

    # ------------------------------------------------------------------ parameters
    def input_table(self) -> Tensor:
        table = self.decoder.token_embedding
        return self.encoder.token_embedding.weight if table is None else table.weight

    def output_weight(self) -> Tensor:
        return self.input_table() if self.decoder.output is None else self.decoder.output.weight

    def encoder_parameters(self) -> Iterator[tuple[str, nn.Parameter]]:
        return ((n, p) for n, p in self.named_parameters() if n.startswith("encoder."))

    def decoder_parameters(self) -> Iterator[tuple[str, nn.Parameter]]:
        return ((n, p) for n, p in self.named_parameters() if not n.startswith("encoder."))

    @torch.no_grad()
    def load_pretraining_decoder(self, state: dict[str, Tensor]) -> list[str]:
        """Start the decoder's self-attention/FFN (and final LayerNorm, untied output) from a pretraining
        `SentenceDecoder` state dict (keys with or without the 'decoder.' prefix of HibertForPretraining),
        wherever names and shapes match; layers beyond the pretraining decoder's depth stay as they are.
        Returns the decoder parameter names that were loaded."""
        src = {k.removeprefix("decoder."): v for k, v in state.items() if not k.startswith("encoder.")}
        own = self.decoder.state_dict()
        loaded = []
        for name, value in src.items():
            target = name.replace("layers.layers.", "layers.", 1).replace("layers.final_norm.", "final_norm.", 1)
            if target in own and own[target].shape == value.shape:
                own[target].copy_(value)
                loaded.append(target)
        return loaded

    # ------------------------------------------------------------------ encoding
    def encode(self, docs: PackedDocuments) -> list[CrossCache]:
        """Encoder, memory and every layer's projected memory: once per batch of documents."""
        return self.decoder.prepare(source_memory(self.encoder(docs), self.dec_cfg.add_sentence_vectors))

    def _check_positions(self, n: int) -> None:
        if n > self.dec_cfg.max_positions:
            raise ValueError(f"{n} target positions exceed decoder.max_positions {self.dec_cfg.max_positions}")

    # ------------------------------------------------------------------ teacher forcing
    def forward(self, batch: AbstractiveBatch, label_smoothing: float = 0.0,
                return_log_probs: bool = False) -> AbstractiveOutput:
        self._check_positions(batch.max_target_len)
        memory = self.encode(batch.docs)
        layout = Layout(batch.num_docs, batch.max_target_len, batch.dec_index, causal=True, cu_seqlens=batch.dec_cu)
        queries = QueryLayout(batch.num_docs, batch.max_target_len, batch.dec_index)
        emb = self.decoder.embed(batch.dec_tokens, batch.dec_pos, self.input_table())
        heads = self.decoder.heads
        hidden, context, attn, cov = self.decoder.run(emb, lambda i: lambda qkv: attention(qkv, layout, heads),
                                                      queries, memory)
        logits, context = self.decoder.vocab_logits(hidden, context, queries, memory[-1], self.output_weight())
        if self.decoder.copy_gate is None:  # plain softmax: token_losses takes the logits as they are
            loss, nll_sum = token_losses(logits, batch.dec_labels, batch.num_target_tokens, label_smoothing)
            logp = torch.log_softmax(logits.float(), -1) if return_log_probs else None
        else:  # the mixture's log-probs: token_losses' log_softmax of normalised log-probs changes nothing
            logp = self.decoder.log_probs(logits, hidden, context, attn, emb, queries, memory[-1])
            loss, nll_sum = token_losses(logp, batch.dec_labels, batch.num_target_tokens, label_smoothing)
        cov_loss = None
        if cov is not None:  # eq. 13: loss_t = -log P(w*_t) + lambda sum_i min(a_i^t, c_i^t), over target tokens
            cov_loss = coverage_loss(attn, cov).sum() / max(batch.num_target_tokens, 1)
            loss = loss + self.dec_cfg.coverage_loss_weight * cov_loss
        return AbstractiveOutput(loss, nll_sum, batch.num_target_tokens, logp if return_log_probs else None,
                                 None if cov_loss is None else cov_loss.detach())

    # ------------------------------------------------------------------ incremental decoding
    def start_decoding(self, docs: PackedDocuments, beams: int, max_len: int) -> DecodeState:
        """Encode once, project the memory once per layer, preallocate the self-attention cache for
        B x `beams` hypotheses of up to `max_len` decoder inputs (BOS included)."""
        self._check_positions(max_len)
        memory = self.encode(docs)
        rows = memory[0].keys.shape[0] * beams
        cache = KVCache(len(self.decoder.layers), rows, self.decoder.heads, max_len, beams)
        coverage = None
        if self.dec_cfg.coverage:
            coverage = torch.zeros(rows, memory[-1].key_mask.shape[-1], dtype=torch.float32,
                                   device=memory[-1].key_mask.device)
        return DecodeState(memory, cache, beams, coverage)

    def decode_step(self, tokens: Tensor, state: DecodeState) -> Tensor:
        """Next-token log-probs [R, V] (fp32) of R = B x K hypotheses (document-major) given their last
        input token `tokens [R]` at position `state.step`; advances the cache by one position."""
        b, k = state.num_docs, state.beams
        pos = torch.full_like(tokens, state.step)
        emb = self.decoder.embed(tokens, pos, self.input_table())
        queries = QueryLayout(b, k)  # beams folded into the query axis of cross-attention
        cache = state.cache
        coverage = None if state.coverage is None else CoverageInput(before=state.coverage)
        hidden, context, attn, _ = self.decoder.run(emb, lambda i: lambda qkv: cache.attend(i, qkv), queries,
                                                    state.memory, coverage)
        cache.length += 1
        if state.coverage is not None:
            state.coverage = state.coverage + attn.float()
        logits, context = self.decoder.vocab_logits(hidden, context, queries, state.memory[-1], self.output_weight())
        return self.decoder.log_probs(logits, hidden, context, attn, emb, queries, state.memory[-1])

    def decode_prefix(self, prefix: Tensor, memory: list[CrossCache]) -> Tensor:
        """The same log-probs without a cache: the whole prefix `[R, t]` (BOS first) through the decoder
        again (teacher-forcing style), last position kept. For benchmarks and tests."""
        r, t = prefix.shape
        self._check_positions(t)
        b = memory[0].keys.shape[0]
        pos = torch.arange(t, device=prefix.device).repeat(r)
        emb = self.decoder.embed(prefix.reshape(-1), pos, self.input_table())
        layout = Layout(r, t, causal=True)
        queries = QueryLayout(b, r // b * t)
        heads = self.decoder.heads
        hidden, context, attn, _ = self.decoder.run(emb, lambda i: lambda qkv: attention(qkv, layout, heads),
                                                    queries, memory, CoverageInput(period=t))
        last = torch.arange(r, device=prefix.device) * t + t - 1
        pick = lambda x: None if x is None else x.index_select(0, last)  # noqa: E731
        # the copy mixture of the kept rows: one query per hypothesis on a [B, K] grid
        hidden, kept = pick(hidden), QueryLayout(b, r // b)
        logits, context = self.decoder.vocab_logits(hidden, pick(context), kept, memory[-1], self.output_weight())
        return self.decoder.log_probs(logits, hidden, context, pick(attn), pick(emb), kept, memory[-1])
