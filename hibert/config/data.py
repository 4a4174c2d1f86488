"""`data:` section — raw sources for `hibert prep` and the prepared dataset that training reads."""
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from hibert.config.base import Section


class SourceConfig(Section):
    """One raw corpus. `path` may be a file, a directory or a glob (relative paths: from the working dir)."""
    format: Literal["gigaword", "cnndm", "jsonl", "hf", "text", "multinews"]
    path: str
    name: str | None = None                # prefix of the doc ids; defaults to the path's stem
    text_field: str = "text"               # jsonl / hf; a list of strings = one paragraph per item
    summary_field: str | None = None       # jsonl / hf; cnndm .story files always carry @highlight summaries
    id_field: str | None = None            # jsonl / hf; None -> <file>:<line>
    title_field: str | None = None         # jsonl / hf; used only with include_title
    include_title: bool = False            # prepend the title / Gigaword HEADLINE as the first paragraph
    summary_sentence_sep: str | None = None  # e.g. " . " for See et al.'s CNN/DM highlights
    summary_glued: bool = False            # summary sentences concatenated without a space (BBC News Summary)
    ptb_tokenized: bool = False            # See et al. CNN/DM: PTB tokens, -lrb-/-rrb-; split + detokenize
    hf_split: str | None = None            # hf DatasetDict: one split (None = every split)
    split: Literal["train", "valid", "test"] | None = None  # force a split; None = hash of the doc id
    story_only: bool = True                # gigaword: keep type="story" only
    # multi-document clusters: jsonl / hf records whose `documents_field` is a list of documents (strings, or
    # lists of paragraphs); `multinews` reads Multi-News (.src/.tgt pairs or JSONL, documents joined by |||||)
    documents_field: str | None = None
    # with documents_field: each of a record's documents is a document of its own (the cluster is not kept;
    # ids <record id>/<k>): a multi-document corpus's sources as single documents, e.g. for pretraining
    split_documents: bool = False
    # with documents_field: the record's list of 0-based indices of the documents to keep (Multi-News+'s
    # `relevant`); the others are dropped and counted per source (manifest: documents_not_relevant). A record
    # whose list is malformed is a counted skip (malformed_relevant); one that keeps none, no_relevant_documents
    relevant_field: str | None = None
    synthetic: bool = False                # clusters built by the project, not real topics: reports say so
    # A subset of the source (jsonl / hf), recorded in the manifest with the source's settings:
    # the first N records of each input file (records past it are not read), and/or a deterministic fraction
    # of the records, chosen by a hash of (sample_seed, record id) whatever the sharding; a record not drawn
    # is a counted skip ("not_sampled"), so documents in = kept + skipped still holds.
    max_records: int | None = Field(None, ge=1)
    sample_fraction: float | None = Field(None, gt=0.0, le=1.0)
    sample_seed: int = 0

    @model_validator(mode="after")
    def _check_subset(self) -> "SourceConfig":
        subset = [k for k in ("max_records", "sample_fraction") if getattr(self, k) is not None]
        if subset and self.format not in ("jsonl", "hf"):
            raise ValueError(f"{', '.join(subset)}: jsonl and hf sources only, not {self.format!r}")
        if self.split_documents and not self.documents_field:
            raise ValueError("split_documents needs documents_field (the list of documents to split)")
        if self.relevant_field and (self.format not in ("jsonl", "hf") or not self.documents_field
                                    or self.split_documents):
            raise ValueError("relevant_field filters the documents of a cluster record: jsonl and hf sources with "
                             "documents_field (without split_documents) only")
        return self

    @property
    def is_cluster(self) -> bool:
        return self.format == "multinews" or (self.documents_field is not None and not self.split_documents)


class TokenizerConfig(Section):
    model: str | None = None               # reuse an existing SentencePiece model (e.g. the open-domain one)
    vocab_size: int = Field(32000, ge=16)  # 6 special pieces + at least a few real ones
    model_type: Literal["bpe", "unigram"] = "unigram"
    hard_vocab_limit: bool = True          # false: vocab_size is an upper bound (small samples)
    sample_sentences: int = Field(1_000_000, ge=1)  # segmented train-split sentences the model is trained on
    character_coverage: float = Field(0.9999, gt=0.0, le=1.0)
    lowercase: bool = False                # nmt_nfkc_cf normalization instead of nmt_nfkc


class SegmenterConfig(Section):
    # "neural": stanza's neural tokenizer (needs `stanza.download('en')` run into stanza_dir);
    # "spacy": stanza's pipeline with its spacy tokenizer variant, runs offline (no download).
    kind: Literal["neural", "spacy"] = "spacy"
    stanza_dir: str | None = None
    use_gpu: bool = False                  # neural only
    batch_size: int = Field(256, ge=1)     # documents per segmentation batch
    # spacy kind: run the spaCy Language object stanza's variant builds instead of wrapping every token into
    # stanza Document objects (identical sentences and tokens, several times faster: benchmarks/bench_segment.py; the tests check the identity).
    fast: bool = True


class OracleConfig(Section):
    max_sentences: int = Field(3, ge=1)
    method: Literal["greedy", "beam"] = "greedy"
    beam_size: int = Field(5, ge=1)


class DataConfig(Section):
    sources: list[SourceConfig] = Field(default_factory=list)
    output: str = "runs/data"              # prep writes here
    dataset: str | None = None             # prepared dataset training reads (default: output)
    tokenizer: TokenizerConfig = Field(default_factory=TokenizerConfig)
    segmenter: SegmenterConfig = Field(default_factory=SegmenterConfig)
    oracle: OracleConfig = Field(default_factory=OracleConfig)
    max_sentence_tokens: int = Field(50, ge=1)   # HIBERT §4.1: truncate after 50 tokens
    max_doc_sentences: int = Field(30, ge=1)     # HIBERT §4.1: split longer documents into chunks
    max_doc_chars: int = Field(1_000_000, ge=1)  # longer raw documents are skipped ("too_long")
    max_unit_sentences: int = Field(5, ge=1)     # clusters: a paragraph longer than this is cut into windows
    max_cluster_units: int = Field(200, ge=1)    # clusters: units kept per cluster (the rest dropped, counted)
    valid_fraction: float = Field(0.02, ge=0.0, lt=1.0)
    test_fraction: float = Field(0.02, ge=0.0, lt=1.0)
    dedup: bool = True                     # drop exact-duplicate documents (whitespace-normalized text)
    num_shards: int | None = Field(None, ge=1)  # None -> max(workers, input size / shard_size_mb)
    shard_size_mb: float = Field(64.0, gt=0)     # input bytes on disk per shard (gzip: compressed)
    workers: int = Field(1, ge=1)
    num_workers_loader: int = Field(2, ge=0)  # DataLoader workers during training (0 = in the trainer)

    @model_validator(mode="after")
    def _check(self) -> "DataConfig":
        if self.valid_fraction + self.test_fraction >= 1.0:
            raise ValueError("valid_fraction + test_fraction must be < 1")
        kinds = {s.is_cluster for s in self.sources}
        if len(kinds) > 1:
            names = [f"{s.name or s.path} ({'clusters' if s.is_cluster else 'documents'})" for s in self.sources]
            raise ValueError(f"data.sources mix clusters and documents: {', '.join(names)}; a prepared dataset "
                             "holds one kind")
        return self

    @property
    def is_clusters(self) -> bool:
        return any(s.is_cluster for s in self.sources)

    @property
    def dataset_dir(self) -> Path:
        return Path(self.dataset or self.output)
