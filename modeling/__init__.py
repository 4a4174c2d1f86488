"""HIBERT models as plain nn.Modules (Zhang et al. 2019): packing, encoder, pretraining, extractive and
abstractive heads, beam search."""
from hibert.modeling.abstractive import AbstractiveBatch, AbstractiveOutput, HibertAbstractive
from hibert.modeling.accounting import count_parameters, flops_per_batch
from hibert.modeling.encoder import EncoderOutput, HibertEncoder
from hibert.modeling.extractive import HibertExtractive
from hibert.modeling.generate import Hypothesis, NgramBlocker, greedy  # beam search: modeling.generate.generate
from hibert.modeling.packing import PackedDocuments, pack_documents, pad_documents
from hibert.modeling.pretraining import (
                                  HibertForPretraining,
                                  PretrainBatch,
                                  PretrainOutput,
                                  make_padded_pretrain_batch,
                                  make_pretrain_batch,
)

__all__ = [
    "PackedDocuments", "pack_documents", "pad_documents",
    "HibertEncoder", "EncoderOutput",
    "HibertForPretraining", "PretrainBatch", "make_pretrain_batch", "make_padded_pretrain_batch", "PretrainOutput",
    "HibertExtractive", "count_parameters", "flops_per_batch",
    "HibertAbstractive", "AbstractiveBatch", "AbstractiveOutput",
    "greedy", "Hypothesis", "NgramBlocker",
]
