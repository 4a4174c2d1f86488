"""Abstractive summarization on HIBERT: a Transformer decoder with cross-attention to the encoder memory,
optionally hierarchical (Ma & Zong, PHT eq. 7-10 / VHT eq. 11-13) and with a pointer-generator copy
(See et al. 2017; Chowdhury et al. §2).

Memory. Every real source token's sentence-level state (`EncoderOutput.token_flat`), plus, by default, the
document-level vector of its sentence (`sentence_states`): one flat, padding-free stream, documents back
to back. Token-wise work (the K/V projections) runs on that stream; attention views it as a [B, L] grid
with a key mask (L = longest document in tokens), or, for VHT, as a [B, D, T] sentence grid.

Queries. Cross-attention always sees queries as a [B, Q, H] grid: Q = target positions when teacher
forcing, Q = beams when decoding one step (beams are folded into the query axis, so each document's memory
K/V is computed once and never tiled), Q = beams x prefix when recomputing a prefix (benchmarks only:
`benchmarks/recompute_decode.py`).

Self-attention runs through `modeling.layers.attention` when teacher forcing (flat causal stream, varlen
kernel on CUDA) and through `KVCache` when decoding step by step: same layers, same weights.

Where the parts live: the memory in `modeling/source_memory.py`, the cross-attention variants (flat, PHT,
VHT) in `modeling/cross_attention.py`, the decoder layers and output head in `modeling/decoder.py`, the
caches and the decoding state in `modeling/kv_cache.py`; batches are built by the head's data module
(`hibert.finetune.abstractive.data.make_abstractive_batch`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import torch
from torch import Tensor, nn

from hibert.config.abstractive import DecoderConfig
from hibert.config.model import ModelConfig
from hibert.modeling.cross_attention import coverage_loss
from hibert.modeling.decoder import AbstractiveDecoder, CoverageInput, QueryLayout
from hibert.modeling.encoder import HibertEncoder
from hibert.modeling.kv_cache import CrossCache, DecodeState, KVCache
from hibert.modeling.layers import Layout, attention
from hibert.modeling.packing import PackedDocuments, TensorBundle
from hibert.modeling.pretraining import token_losses
from hibert.modeling.source_memory import source_memory


# ---------------------------------------------------------------------------------------------- batch
@dataclass
class AbstractiveBatch(TensorBundle):
    """B documents and their B target summaries, flat: decoder input BOS + target, labels target + EOS
    (teacher forcing), Nd real decoder slots in all (the packed layout of `decoder_fields`)."""

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


@dataclass
class AbstractiveOutput:
    loss: Tensor               # mean per target token, label-smoothed if asked: what is backpropagated
    nll_sum: Tensor            # summed NLL without smoothing (detached)
    num_target_tokens: int     # the count nll_sum is summed over
    log_probs: Tensor | None = None  # [Nd, V] fp32 next-token log-probabilities (the copy mixture) when asked
    coverage_loss: Tensor | None = None  # mean per target token of sum_i min(a_i, c_i) (decoder.coverage; detached)


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

    def check_positions(self, n: int) -> None:
        """Refuse more target positions than the decoder has position embeddings for."""
        if n > self.dec_cfg.max_positions:
            raise ValueError(f"{n} target positions exceed decoder.max_positions {self.dec_cfg.max_positions}")

    # ------------------------------------------------------------------ teacher forcing
    def forward(self, batch: AbstractiveBatch, label_smoothing: float = 0.0,
                return_log_probs: bool = False) -> AbstractiveOutput:
        self.check_positions(batch.max_target_len)
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
        self.check_positions(max_len)
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
