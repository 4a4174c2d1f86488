"""`model:` section — sizes of the hierarchical encoder and the masked-sentence decoder (HIBERT §3, §4.2)."""
from typing import Literal

from pydantic import Field, model_validator

from hibert.config.base import Section


class ModelConfig(Section):
    name: str = Field("hibert_s", min_length=1)
    # upper bounds far above any HIBERT (HIBERT_M: 768 / 6 / 12) that stop a mistyped or hostile model.json
    # before it allocates: a model this large is a typo, not a plan
    vocab_size: int = Field(32000, ge=8, le=1 << 21)  # replaced by the tokenizer's size when a dataset is attached
    hidden: int = Field(512, ge=2, le=1 << 15)   # H
    layers: int = Field(6, ge=1, le=256)     # L, for the sentence and the document encoder
    heads: int = Field(8, ge=1, le=1024)      # A
    ffn: int | None = Field(None, ge=1, le=1 << 17)  # None -> 4 * hidden (paper)
    decoder_layers: int | None = Field(None, ge=1, le=256)  # None -> layers (paper: decoder has the encoder's size)
    dropout: float = Field(0.1, ge=0.0, lt=1.0)
    max_positions: int = Field(512, ge=2, le=1 << 17)  # rows of the shared sinusoidal table (tokens and sentence positions)
    norm_first: bool = False         # False = post-LN as in Vaswani et al. (paper); True = pre-LN
    activation: Literal["relu", "gelu"] = "relu"
    tie_output_embeddings: bool = True
    activation_checkpointing: bool = False

    @model_validator(mode="after")
    def _check(self) -> "ModelConfig":
        if self.hidden % self.heads:
            raise ValueError(f"model.hidden ({self.hidden}) must be divisible by model.heads ({self.heads})")
        return self

    @property
    def ffn_dim(self) -> int:
        return self.ffn or 4 * self.hidden

    @property
    def num_decoder_layers(self) -> int:
        return self.layers if self.decoder_layers is None else self.decoder_layers
