"""`decoder:` and `generation:` sections — the abstractive head on HIBERT (Transformer decoder with
cross-attention to the encoder's token states, optional pointer-generator copy) and its beam search.

The decoder's hidden size is the encoder's (`model.hidden`); `heads`/`ffn` default to the encoder's.
`generation` is exported next to a finetuned model as generation.json, so it stays flat and plain.
"""
import warnings
from typing import Literal

from pydantic import Field, model_validator

from hibert.config.base import Section, flag

with warnings.catch_warnings():
    # `copy` shadows pydantic v1's deprecated BaseModel.copy(); the name is part of the exported config.
    warnings.filterwarnings("ignore", message='Field name "copy"', category=UserWarning)

    class DecoderConfig(Section):
        layers: int = Field(6, ge=1, le=64)
        heads: int | None = Field(None, ge=1)      # None -> model.heads (must divide model.hidden)
        ffn: int | None = Field(None, ge=1)        # None -> 4 * model.hidden
        dropout: float = Field(0.1, ge=0.0, lt=1.0)
        max_positions: int = Field(512, ge=2, le=65536)  # target positions: its own sinusoidal table
        norm_first: bool = False                  # False = post-LN (Vaswani et al.), True = pre-LN
        # cross-attention to the memory: flat multi-head over every source token of the document, or
        # Ma & Zong's parallel (PHT, eq. 7-10) / vertical (VHT, eq. 11-13) hierarchical attention
        cross_attention: Literal["flat", "pht", "vht"] = "flat"
        copy: bool = False                        # pointer-generator (See et al. 2017) over source subwords
        # See et al.'s coverage (eq. 10-13) on the copy attention: coverage vector in its scores + coverage loss
        coverage: bool = False
        coverage_loss_weight: float = Field(1.0, ge=0.0, le=100.0)  # lambda of eq. 13 (See et al.: 1)
        tie_input_embeddings: bool = True         # target embeddings = the HIBERT token table
        tie_output_embeddings: bool = True        # vocabulary projection = the (decoder's) input table
        add_sentence_vectors: bool = True         # memory token state + its sentence's document-level vector
        # (rules that involve model.hidden/heads: check_decoder below, and modeling.decoder where both are known)

        @model_validator(mode="after")
        def _coverage(self) -> "DecoderConfig":
            if self.coverage and not self.copy:
                raise ValueError("decoder.coverage is See et al.'s coverage of the copy attention: it needs "
                                 "decoder.copy: true")
            if self.coverage and self.cross_attention != "flat":
                raise ValueError(f"decoder.coverage runs on flat cross-attention, not {self.cross_attention!r}")
            return self


class GenerationConfig(Section):
    beam_size: int = Field(5, ge=1, le=256, json_schema_extra=flag("--beam", "beam size (1 = greedy)"))
    # subwords before EOS may end a summary ([SEP] counts)
    min_length: int = Field(0, ge=0, json_schema_extra=flag("--min-len", "minimum summary length in subwords"))
    # subwords; EOS is forced after this many
    max_length: int = Field(150, ge=1, json_schema_extra=flag(
        "--max-len", "maximum summary length in subwords (below the decoder's max_positions)"))
    # GNMT alpha: score = log p / ((5 + |Y|) / 6)^alpha
    length_penalty: float = Field(0.6, ge=0.0, le=10.0, json_schema_extra=flag(
        "--length-penalty", "GNMT length penalty alpha"))
    # word n-grams never repeated; 0 = off
    no_repeat_ngram: int = Field(3, ge=0, le=32, json_schema_extra=flag(
        "--no-repeat-ngram", "block repeated word n-grams (0 = off)"))
    # subwords per word at most (stops "he's's's's"); 0 = off
    max_word_pieces: int = Field(0, ge=0, le=64, json_schema_extra=flag(
        "--max-word-pieces", "at most this many subwords per word (0 = no cap)"))
    early_stopping: bool = True                # stop a document once no open beam can beat its best summary
    # documents decoded together: 16 suits a CPU, a GPU wants hundreds (docs/abstractive.md, "On a GPU"); bounded so
    # that a served request cannot ask for a batch no device holds (HIBERT_M: ~30 MB of decoding state a document)
    batch_size: int = Field(16, ge=1, le=1024, json_schema_extra=flag("--batch-size", "documents decoded together"))

    @model_validator(mode="after")
    def _check(self) -> "GenerationConfig":
        if self.min_length > self.max_length:
            raise ValueError(f"generation.min_length ({self.min_length}) must be <= generation.max_length "
                             f"({self.max_length})")
        return self


def check_decoder(cfg) -> None:
    """The `decoder:` and `generation:` sections against the core ones (a head's `check_config`)."""
    heads = cfg.decoder.heads or cfg.model.heads
    if cfg.model.hidden % heads:
        raise ValueError(f"decoder.heads ({heads}) must divide model.hidden ({cfg.model.hidden})")
    if cfg.finetune.max_target_tokens + 1 > cfg.decoder.max_positions:
        raise ValueError(f"finetune.max_target_tokens + 1 ({cfg.finetune.max_target_tokens + 1}) must fit "
                         f"decoder.max_positions ({cfg.decoder.max_positions})")
    if cfg.generation.max_length + 1 > cfg.decoder.max_positions:
        raise ValueError(f"generation.max_length + 1 ({cfg.generation.max_length + 1}) must fit "
                         f"decoder.max_positions ({cfg.decoder.max_positions})")
