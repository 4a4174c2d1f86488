"""The decoder's cross-attention to the source memory, three variants (`CROSS_ATTENTION`): `flat` (every
memory token of the document, optionally with See et al.'s coverage), PHT ("parallel", Ma & Zong eq. 7-10)
and VHT ("vertical", eq. 11-13). Each projects the memory once per batch (`prepare` -> `CrossCache`) and
attends from queries on a [B, Q, H] grid (`modeling.decoder.QueryLayout`).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hibert.config.model import ModelConfig
from hibert.modeling.kv_cache import CrossCache
from hibert.modeling.layers import sdpa
from hibert.modeling.source_memory import SourceMemory


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
            out = sdpa(q, cache.keys, cache.values, cache.key_bias)
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
