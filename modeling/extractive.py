"""Extractive summarization with HIBERT (Zhang et al. 2019, §3.3, eq. 8): a linear layer + softmax over
each document-level sentence vector (or a single logit + sigmoid)."""
from __future__ import annotations

from typing import Literal

import torch.nn.functional as F
from torch import Tensor, nn

from hibert.config.model import ModelConfig
from hibert.modeling.encoder import HibertEncoder
from hibert.modeling.layers import init_weights
from hibert.modeling.packing import PackedDocuments

IGNORE_LABEL = -100  # label of rows to leave out of the loss (the empty rows of the padded layout)


class HibertExtractive(nn.Module):
    """p(y_i | D) = softmax(W_S d̃_i + b_S) for every sentence (eq. 8). `num_labels="sigmoid"` gives one
    logit per sentence and a binary cross-entropy instead. `.encoder` loads the weights of
    `HibertForPretraining.encoder` as they are (same module, same keys)."""

    def __init__(self, cfg: ModelConfig, num_labels: int | Literal["sigmoid"] = 2):
        super().__init__()
        self.sigmoid = num_labels == "sigmoid"
        if not self.sigmoid and (not isinstance(num_labels, int) or num_labels < 2):
            raise ValueError(f"num_labels must be an int >= 2 or 'sigmoid', got {num_labels!r}")
        self.encoder = HibertEncoder(cfg)
        self.head = nn.Linear(cfg.hidden, 1 if self.sigmoid else num_labels)
        self.head.apply(init_weights)

    def forward(self, docs: PackedDocuments) -> Tensor:
        """Logits per sentence row of `docs.tokens`: [S, num_labels], or [S] for the sigmoid head."""
        logits = self.head(self.encoder(docs).sentence_states)
        return logits.squeeze(-1) if self.sigmoid else logits

    def loss(self, logits: Tensor, labels: Tensor) -> Tensor:
        """Mean NLL of the sentence labels [S] (rows labelled IGNORE_LABEL are left out)."""
        if not self.sigmoid:
            return F.cross_entropy(logits.float(), labels.long(), ignore_index=IGNORE_LABEL)
        valid = labels != IGNORE_LABEL
        per_row = F.binary_cross_entropy_with_logits(logits.float(), labels.float().clamp_min(0), reduction="none")
        return (per_row * valid).sum() / valid.sum().clamp_min(1)
