"""Parameter and FLOP accounting for HIBERT models, from the config alone (nothing is built).

Used for model cards and for MFU = flops_per_batch / step time / peak FLOP/s."""
from __future__ import annotations

from typing import Literal, Sequence

import numpy as np
import torch

from hibert.config.model import ModelConfig

Lengths = Sequence[int] | np.ndarray | torch.Tensor


def _layer_params(cfg: ModelConfig) -> int:
    h, f = cfg.hidden, cfg.ffn_dim
    attention = (h * 3 * h + 3 * h) + (h * h + h)
    ffn = (h * f + f) + (f * h + h)
    norms = 2 * 2 * h
    return attention + ffn + norms


def _stack_params(cfg: ModelConfig, num_layers: int) -> int:
    return num_layers * _layer_params(cfg) + (2 * cfg.hidden if cfg.norm_first else 0)


def count_parameters(cfg: ModelConfig, num_labels: int | Literal["sigmoid"] = 2) -> dict[str, int]:
    """Exact trainable-parameter counts of the modules in this package:
    embedding (V*H, part of the encoder), encoder (embedding + sentence and document Transformers),
    decoder (its Transformer, + V*H when the output projection is untied), head (extractive linear),
    pretraining = encoder + decoder (HibertForPretraining), extractive = encoder + head (HibertExtractive),
    total = encoder + decoder + head."""
    h = cfg.hidden
    labels = 1 if num_labels == "sigmoid" else int(num_labels)
    embedding = cfg.vocab_size * h
    encoder = embedding + 2 * _stack_params(cfg, cfg.layers)
    decoder = _stack_params(cfg, cfg.num_decoder_layers) + (0 if cfg.tie_output_embeddings else embedding)
    head = h * labels + labels
    return dict(embedding=embedding, encoder=encoder, decoder=decoder, head=head,
                pretraining=encoder + decoder, extractive=encoder + head, total=encoder + decoder + head)


def _as_int64(lengths: Lengths) -> np.ndarray:
    if isinstance(lengths, torch.Tensor):
        lengths = lengths.detach().cpu().numpy()
    return np.asarray(lengths, dtype=np.int64)


def flops_per_batch(cfg: ModelConfig, sent_lens: Lengths, doc_lens: Lengths, target_lens: Lengths | None = None,
                    backward: bool = True) -> float:
    """Model FLOPs of one batch on REAL tokens only (padding, masked-out attention and elementwise work
    are not counted; a matmul of [m, k] x [k, n] is 2·m·n·k).

    With H = hidden, F = ffn_dim, V = vocab, L = layers, Ld = decoder layers and per layer and token
    lin = 2·(3H·H + H·H + 2·H·F) = 8H² + 4HF (q/k/v, output and FFN projections):
      sentence encoder  L  · Σ_s [lin·s + 4H·s²]          s = sent_lens (words + EOS)
      document encoder  L  · Σ_d [lin·n + 4H·n²]          n = doc_lens (sentences)
      decoder           Ld · Σ_t [lin·t + 2H·t·(t+1)]     t = target_lens (words + 1); causal: t(t+1)/2 pairs
                        + 2·H·V·Σ_t t                     vocabulary projection of every target token
    where 4H·l² is QKᵀ (2·l·l·H over all heads) plus attention·V (2·l·l·H). forward = the sum;
    backward = 2 × forward, so forward + backward = 3 × forward. Rows with length 0 (the empty slots of
    the padded layout) count nothing. The extractive head (2·H·labels per sentence) is left out.
    Pass lengths from the CPU batch: tensors on a GPU would make this wait for the device."""
    h, f = cfg.hidden, cfg.ffn_dim
    lin = 8 * h * h + 4 * h * f
    s, n = _as_int64(sent_lens), _as_int64(doc_lens)
    total = cfg.layers * (lin * int(s.sum()) + 4 * h * int((s * s).sum()))
    total += cfg.layers * (lin * int(n.sum()) + 4 * h * int((n * n).sum()))
    if target_lens is not None:
        t = _as_int64(target_lens)
        total += cfg.num_decoder_layers * (lin * int(t.sum()) + 2 * h * int((t * (t + 1)).sum()))
        total += 2 * h * cfg.vocab_size * int(t.sum())
    return float(total) * (3.0 if backward else 1.0)
