"""The hierarchical multi-document summarizer (Liu & Lapata 2019) on HIBERT: local layers = the HIBERT
encoder over each unit (as a document), global layers across the units of a cluster (modeling/hierarchical.py),
and the abstractive decoder of modeling/decoder.py unchanged.

The decoder memory is every token of every unit of the cluster (its state after the global layers), laid out
as one "document" per cluster whose "sentences" are the units (`PackedClusters.memory_docs`); the unit vector
(the mean of its tokens) stands where a sentence vector would. So `flat` cross-attention reads all tokens,
`pht` normalises token attention within each unit and scales it by unit attention (Ma & Zong eq. 7-10 over
paragraphs), `vht` attends over per-unit context vectors, and the copy mixture scatters onto source ids — all
with the single-document code, as do teacher forcing, the KV cache and the batched beam search
(`modeling.generate.generate(model, pack_clusters(...), gen)`). The order of the units in a cluster is their
rank (PHT's ranking encoding R and the global layers' rank embedding both read it).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from hibert.config.abstractive import DecoderConfig
from hibert.config.mds import MDSConfig
from hibert.config.model import ModelConfig
from hibert.modeling.abstractive import AbstractiveBatch, HibertAbstractive
from hibert.modeling.clusters import PackedClusters
from hibert.modeling.decoder import AbstractiveDecoder
from hibert.modeling.encoder import EncoderOutput, HibertEncoder
from hibert.modeling.hierarchical import GlobalEncoder
from hibert.modeling.kv_cache import CrossCache
from hibert.modeling.source_memory import SourceMemory, source_memory


@dataclass
class MDSBatch(AbstractiveBatch):
    """An `AbstractiveBatch` whose "documents" are clusters: `docs` is a `PackedClusters` (built by
    `hibert.finetune.abstractive.data.make_mds_batch`)."""

    docs: PackedClusters  # type: ignore[assignment]


def cluster_states(encoder: HibertEncoder, global_encoder: GlobalEncoder, packed: PackedClusters,
                   add_sentence_vectors: bool = True) -> EncoderOutput:
    """Every unit token's state after the global layers, on the memory layout (`packed.memory_docs`), with the
    unit vectors where sentence vectors would be. A token enters the global layers as its sentence-level
    state plus (if `add_sentence_vectors`) the document-level vector of its sentence within its unit — what
    `source_memory` gives a single document."""
    units = packed.units
    enc = encoder(units)
    x = enc.token_flat
    if add_sentence_vectors:
        rows = torch.repeat_interleave(torch.arange(units.tokens.shape[0], device=x.device), units.sent_lens,
                                       output_size=units.num_real_tokens)
        x = x + enc.sentence_states.index_select(0, rows)
    layout = packed.layout
    x, structure = global_encoder.forward_with_structure(x, layout, packed.graph)
    # unit vector = mean of its tokens (the unit stream is the memory stream: same tokens, same order)
    n_units = layout.num_units
    count = torch.zeros(n_units, 1, dtype=torch.float32, device=x.device).index_add_(
        0, layout.token_unit, torch.ones(x.shape[0], 1, dtype=torch.float32, device=x.device))
    unit_sum = torch.zeros(n_units, x.shape[1], dtype=torch.float32, device=x.device).index_add(
        0, layout.token_unit, x.float())                          # fp32 sums (bf16 runs)
    unit_vec = (unit_sum / count).to(x.dtype)
    return EncoderOutput(token_flat=x, sentence_states=unit_vec, docs=packed.memory_docs, structure=structure)


def cluster_memory(encoder: HibertEncoder, global_encoder: GlobalEncoder, packed: PackedClusters,
                   add_sentence_vectors: bool = True) -> SourceMemory:
    """The decoder memory of C clusters: one "document" per cluster, its units as the "sentences"."""
    return source_memory(cluster_states(encoder, global_encoder, packed, add_sentence_vectors),
                         add_sentence_vectors=False)  # already added, per sentence within its unit


class HibertMDS(HibertAbstractive):
    """`.encoder` (HibertEncoder: registered encoders load strictly), `.global_encoder`, `.decoder`. Teacher
    forcing (`forward(MDSBatch)`), `start_decoding(PackedClusters, beams, max_len)` and `decode_step` are
    HibertAbstractive's: only `encode` differs."""

    def __init__(self, enc_cfg: ModelConfig, dec_cfg: DecoderConfig, mds_cfg: MDSConfig):
        torch.nn.Module.__init__(self)
        self.cfg, self.dec_cfg, self.mds_cfg = enc_cfg, dec_cfg, mds_cfg
        self.encoder = HibertEncoder(enc_cfg)
        self.global_encoder = GlobalEncoder(
            enc_cfg.hidden, mds_cfg.global_heads or enc_cfg.heads, enc_cfg.ffn_dim, enc_cfg.dropout,
            mds_cfg.global_layers, mds_cfg.graph_attention, mds_cfg.structural_attention, mds_cfg.max_units,
            mds_cfg.rank_embedding, mds_cfg.global_layer, mds_cfg.structural_split, mds_cfg.structural_root)
        structural_context = mds_cfg.structural_attention and mds_cfg.structural_decoder and mds_cfg.global_layers > 0
        self.decoder = AbstractiveDecoder(enc_cfg, dec_cfg, structural_context)

    def memory(self, packed: PackedClusters) -> EncoderOutput:
        """Token states after the global layers, on the memory layout, with the unit vectors."""
        return cluster_states(self.encoder, self.global_encoder, packed, self.dec_cfg.add_sentence_vectors)

    def cluster_memory(self, packed: PackedClusters) -> SourceMemory:
        return cluster_memory(self.encoder, self.global_encoder, packed, self.dec_cfg.add_sentence_vectors)

    def encode(self, docs: PackedClusters) -> list[CrossCache]:  # type: ignore[override]
        """Local + global encoders, memory and every decoder layer's projected memory, once per batch."""
        return self.decoder.prepare(self.cluster_memory(docs))

    def load_pretraining_decoder(self, state):  # the same decoder: same mapping
        return HibertAbstractive.load_pretraining_decoder(self, state)
