"""`model:` section — sizes of the hierarchical encoder and the masked-sentence decoder (HIBERT §3, §4.2)."""
from typing import Literal

from pydantic import model_validator

from hibert.config.base import Section


class ModelConfig(Section):
    name: str = "hibert_s"
    vocab_size: int = 32000          # replaced by the tokenizer's size when a dataset is attached
    hidden: int = 512                # H
    layers: int = 6                  # L, for the sentence and the document encoder
    heads: int = 8                   # A
    ffn: int | None = None           # None -> 4 * hidden (paper)
    decoder_layers: int | None = None  # None -> layers (paper: decoder has the encoder's size)
    dropout: float = 0.1
    max_positions: int = 512         # rows of the shared sinusoidal table (tokens and sentence positions)
    norm_first: bool = False         # False = post-LN as in Vaswani et al. (paper); True = pre-LN
    activation: Literal["relu", "gelu"] = "relu"
    tie_output_embeddings: bool = True
    activation_checkpointing: bool = False

    @model_validator(mode="after")
    def _check(self) -> "ModelConfig":
        if self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be divisible by heads ({self.heads})")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        return self

    @property
    def ffn_dim(self) -> int:
        return self.ffn or 4 * self.hidden

    @property
    def num_decoder_layers(self) -> int:
        return self.layers if self.decoder_layers is None else self.decoder_layers
