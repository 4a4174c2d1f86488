"""The hierarchical multi-document summarizer (Liu & Lapata 2019) on HIBERT: local layers = the HIBERT
encoder over each unit (as a document), global layers across the units of a cluster (modeling/hierarchical.py),
and the abstractive decoder of modeling/decoder.py unchanged.

The decoder memory is every token of every unit of the cluster (its state after the global layers), laid out
as one "document" per cluster whose "sentences" are the units (`PackedClusters.memory_docs`); the unit vector
(Ma & Zong's static paragraph embedding Phi, eq. 2-5, with `mds.unit_vector: attention_pooling`; else the mean
of its tokens) stands where a sentence vector would. So `flat` cross-attention reads all tokens,
`pht` normalises token attention within each unit and scales it by unit attention (Ma & Zong eq. 7-10 over
paragraphs), `vht` attends over per-unit context vectors, and the copy mixture scatters onto source ids — all
with the single-document code, as do teacher forcing, the KV cache and the batched beam search
(`modeling.generate.generate(model, pack_clusters(...), gen)`). The order of the units in a cluster is their
rank (PHT's ranking encoding R and the global layers' rank embedding both read it).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hibert.config.abstractive import DecoderConfig
from hibert.config.mds import MDSConfig
from hibert.config.model import ModelConfig
from hibert.modeling.abstractive import AbstractiveBatch, HibertAbstractive
from hibert.modeling.clusters import PackedClusters
from hibert.modeling.decoder import AbstractiveDecoder
from hibert.modeling.encoder import EncoderOutput, HibertEncoder
from hibert.modeling.hierarchical import GlobalEncoder, unit_softmax
from hibert.modeling.kv_cache import CrossCache
from hibert.modeling.layers import init_weights
from hibert.modeling.source_memory import SourceMemory, source_memory


@dataclass
class MDSBatch(AbstractiveBatch):
    """An `AbstractiveBatch` whose "documents" are clusters: `docs` is a `PackedClusters` (built by
    `hibert.finetune.abstractive.data.make_mds_batch`)."""

    docs: PackedClusters  # type: ignore[assignment]


class UnitPooling(nn.Module):
    """Ma & Zong's static paragraph embedding (§3.1.1, eq. 2-5) of every unit from its tokens' states C_p:
        head^i = HeadSplit(C_p W_1)                    (2)
        phi^i  = softmax(head^i W_2)^T head^i          (3)  softmax over the unit's tokens; W_2 [d_head, 1] shared
        phi    = W_3 [phi^0; phi^1; ...]               (4)
        phi   := LayerNorm(phi + FFN(phi))             (5)  FFN: two layers, ReLU
    W_1, W_2, W_3 carry no bias (the paper's matrices; a bias in W_2 would cancel in the softmax)."""

    def __init__(self, hidden: int, heads: int, ffn: int, dropout: float = 0.0):
        super().__init__()
        if hidden % heads:
            raise ValueError(f"unit pooling heads ({heads}) must divide hidden ({hidden})")
        self.heads = heads
        self.w1 = nn.Linear(hidden, hidden, bias=False)
        self.w2 = nn.Linear(hidden // heads, 1, bias=False)
        self.w3 = nn.Linear(hidden, hidden, bias=False)
        self.ffn_in, self.ffn_out = nn.Linear(hidden, ffn), nn.Linear(ffn, hidden)
        self.norm = nn.LayerNorm(hidden)
        self.dropout = nn.Dropout(dropout)
        self.apply(init_weights)

    def forward(self, x: Tensor, token_unit: Tensor, num_units: int) -> Tensor:
        """Token states x [N, H] (each unit's tokens in `token_unit`) -> unit embeddings [U, H]."""
        n, h = x.shape
        heads = self.w1(x).view(n, self.heads, h // self.heads)                          # eq. 2
        a = unit_softmax(self.w2(heads).squeeze(-1).float(), token_unit, num_units)      # [N, heads]
        phi = torch.zeros(num_units, self.heads, h // self.heads, dtype=torch.float32, device=x.device).index_add_(
            0, token_unit, (a[..., None] * heads.float()))                               # eq. 3, fp32 sums
        phi = self.w3(phi.flatten(1).to(x.dtype))                                        # eq. 4
        return self.norm(phi + self.dropout(self.ffn_out(F.relu(self.ffn_in(phi)))))   # eq. 5


def cluster_states(encoder: HibertEncoder, global_encoder: GlobalEncoder, packed: PackedClusters,
                   add_sentence_vectors: bool = True, unit_pooling: UnitPooling | None = None) -> EncoderOutput:
    """Every unit token's state after the global layers, on the memory layout (`packed.memory_docs`), with the
    unit vectors where sentence vectors would be: `unit_pooling`'s (Ma & Zong eq. 2-5), else the mean of the
    unit's tokens. A token enters the global layers as its sentence-level state plus (if
    `add_sentence_vectors`) the document-level vector of its sentence within its unit — what `source_memory`
    gives a single document."""
    units = packed.units
    enc = encoder(units)
    x = enc.token_flat
    if add_sentence_vectors:
        rows = torch.repeat_interleave(torch.arange(units.tokens.shape[0], device=x.device), units.sent_lens,
                                       output_size=units.num_real_tokens)
        x = x + enc.sentence_states.index_select(0, rows)
    layout = packed.layout
    x, structure = global_encoder.forward_with_structure(x, layout, packed.graph)
    n_units = layout.num_units
    if unit_pooling is not None:
        unit_vec = unit_pooling(x, layout.token_unit, n_units)
    else:  # the mean of its tokens (the unit stream is the memory stream: same tokens, same order)
        count = torch.zeros(n_units, 1, dtype=torch.float32, device=x.device).index_add_(
            0, layout.token_unit, torch.ones(x.shape[0], 1, dtype=torch.float32, device=x.device))
        unit_sum = torch.zeros(n_units, x.shape[1], dtype=torch.float32, device=x.device).index_add(
            0, layout.token_unit, x.float())                      # fp32 sums (bf16 runs)
        unit_vec = (unit_sum / count).to(x.dtype)
    return EncoderOutput(token_flat=x, sentence_states=unit_vec, docs=packed.memory_docs, structure=structure)


def cluster_memory(encoder: HibertEncoder, global_encoder: GlobalEncoder, packed: PackedClusters,
                   add_sentence_vectors: bool = True, unit_pooling: UnitPooling | None = None) -> SourceMemory:
    """The decoder memory of C clusters: one "document" per cluster, its units as the "sentences"."""
    return source_memory(cluster_states(encoder, global_encoder, packed, add_sentence_vectors, unit_pooling),
                         add_sentence_vectors=False)  # already added, per sentence within its unit


class HibertMDS(HibertAbstractive):
    """`.encoder` (HibertEncoder: registered encoders load strictly), `.global_encoder`, `.decoder`, and
    `.unit_pooling` (Ma & Zong eq. 2-5) where PHT or the structural context reads unit vectors. Teacher
    forcing (`forward(MDSBatch)`), `start_decoding(PackedClusters, beams, max_len)` and `decode_step` are
    HibertAbstractive's: only `encode` differs."""

    def __init__(self, enc_cfg: ModelConfig, dec_cfg: DecoderConfig, mds_cfg: MDSConfig):
        torch.nn.Module.__init__(self)
        self.cfg, self.dec_cfg, self.mds_cfg = enc_cfg, dec_cfg, mds_cfg
        self.encoder = HibertEncoder(enc_cfg)
        self.global_encoder = GlobalEncoder(
            enc_cfg.hidden, mds_cfg.global_heads or enc_cfg.heads, enc_cfg.ffn_dim, enc_cfg.dropout,
            mds_cfg.global_layers, mds_cfg.graph_attention, mds_cfg.structural_attention, mds_cfg.max_units,
            mds_cfg.rank_embedding, mds_cfg.global_layer, mds_cfg.structural_split, mds_cfg.structural_root,
            mds_cfg.rank_embedding_form)
        structural_context = mds_cfg.structural_attention and mds_cfg.structural_decoder and mds_cfg.global_layers > 0
        self.decoder = AbstractiveDecoder(enc_cfg, dec_cfg, structural_context, mds_cfg.structural_decoder_attention)
        # the unit vectors are read by PHT (static Phi) and the structural context (its values) only: no
        # parameters that nothing trains
        reads_units = dec_cfg.cross_attention == "pht" or structural_context
        self.unit_pooling = (UnitPooling(enc_cfg.hidden, enc_cfg.heads, enc_cfg.ffn_dim, enc_cfg.dropout)
                             if mds_cfg.unit_vector == "attention_pooling" and reads_units else None)

    def memory(self, packed: PackedClusters) -> EncoderOutput:
        """Token states after the global layers, on the memory layout, with the unit vectors."""
        return cluster_states(self.encoder, self.global_encoder, packed, self.dec_cfg.add_sentence_vectors,
                              self.unit_pooling)

    def cluster_memory(self, packed: PackedClusters) -> SourceMemory:
        return cluster_memory(self.encoder, self.global_encoder, packed, self.dec_cfg.add_sentence_vectors,
                              self.unit_pooling)

    def encode(self, docs: PackedClusters) -> list[CrossCache]:  # type: ignore[override]
        """Local + global encoders, memory and every decoder layer's projected memory, once per batch."""
        return self.decoder.prepare(self.cluster_memory(docs))

    def load_pretraining_decoder(self, state):  # the same decoder: same mapping
        return HibertAbstractive.load_pretraining_decoder(self, state)
