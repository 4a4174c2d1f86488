"""The abstractive decoder: `DecoderLayer`s (causal self-attention, cross-attention to the memory, FFN) and
`AbstractiveDecoder` (target embeddings, the layers, the vocabulary head and the pointer-generator copy
mixture). Self-attention is injected (`SelfAttention`): the flat causal stream when teacher forcing, the
`KVCache` when decoding step by step — same layers, same weights.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hibert.config.abstractive import DecoderConfig
from hibert.config.model import ModelConfig
from hibert.modeling.cross_attention import CROSS_ATTENTION
from hibert.modeling.kv_cache import CrossCache
from hibert.modeling.layers import TransformerLayer, init_weights, sinusoidal_table
from hibert.modeling.source_memory import SourceMemory
from hibert.modeling.structural import StructuralContext
from hibert.tokens import PAD_ID

SelfAttention = Callable[[Tensor], Tensor]  # qkv [N, 3H] -> attended values [N, H] (before attn_out)


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


class AbstractiveDecoder(nn.Module):
    """Transformer decoder over the target: embeddings (a token table scaled by sqrt(H) + its own sinusoidal
    positions), `DecoderLayer`s, a final LayerNorm when pre-LN, and the output head: a (tied) vocabulary
    projection, optionally mixed with a copy distribution over the source (pointer-generator)."""

    def __init__(self, enc_cfg: ModelConfig, dec_cfg: DecoderConfig, structural_context: bool = False,
                 structural_form: Literal["additive", "dot"] = "additive"):
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
        self.structure = StructuralContext(h, cfg.heads, structural_form) if structural_context else None
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
