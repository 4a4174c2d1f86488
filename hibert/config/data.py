"""`data:` section — raw sources for `hibert prep` and the prepared dataset that training reads."""
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from hibert.config.base import Section


class SourceConfig(Section):
    """One raw corpus. `path` may be a file, a directory or a glob."""
    format: Literal["gigaword", "cnndm", "jsonl", "hf", "text"]
    path: str
    name: str | None = None                # defaults to the file stem
    text_field: str = "text"               # jsonl / hf
    summary_field: str | None = None
    id_field: str | None = None
    title_field: str | None = None
    sentence_field_is_list: bool = False   # jsonl/hf text given as a list of sentences
    summary_sentence_sep: str | None = None  # e.g. " . " for See et al.'s CNN/DM highlights
    hf_split: str | None = None
    split: Literal["train", "valid", "test"] | None = None  # force a split; None = hash of the doc id
    story_only: bool = True                # gigaword: keep type="story" only


class TokenizerConfig(Section):
    model: str | None = None               # reuse an existing SentencePiece model
    vocab_size: int = 32000
    model_type: Literal["bpe", "unigram"] = "unigram"
    sample_sentences: int = 1_000_000
    character_coverage: float = 0.9999
    lowercase: bool = False


class SegmenterConfig(Section):
    # "neural": stanza's neural tokenizer (needs stanza models in stanza_dir);
    # "spacy": stanza pipeline with the spacy tokenizer, runs offline (no download).
    kind: Literal["neural", "spacy"] = "spacy"
    stanza_dir: str | None = None
    pretokenized: bool = False             # input already one sentence per line / space-tokenized


class OracleConfig(Section):
    max_sentences: int = 3
    method: Literal["greedy", "beam"] = "greedy"
    beam_size: int = 5


class DataConfig(Section):
    sources: list[SourceConfig] = Field(default_factory=list)
    output: str = "runs/data"              # prep writes here
    dataset: str | None = None             # prepared dataset training reads (default: output)
    tokenizer: TokenizerConfig = Field(default_factory=TokenizerConfig)
    segmenter: SegmenterConfig = Field(default_factory=SegmenterConfig)
    oracle: OracleConfig = Field(default_factory=OracleConfig)
    max_sentence_tokens: int = 50          # HIBERT §4.1: truncate after 50 tokens
    max_doc_sentences: int = 30            # HIBERT §4.1: split longer documents into chunks
    valid_fraction: float = 0.02
    test_fraction: float = 0.02
    dedup: bool = True
    docs_per_shard: int = 50_000
    workers: int = 1
    num_workers_loader: int = 2            # DataLoader workers during training

    @model_validator(mode="after")
    def _check(self) -> "DataConfig":
        if self.valid_fraction + self.test_fraction >= 1.0:
            raise ValueError("valid_fraction + test_fraction must be < 1")
        return self

    @property
    def dataset_dir(self) -> Path:
        return Path(self.dataset or self.output)
