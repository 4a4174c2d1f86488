"""`mds:` section — multi-document summarization: the paragraph ranker and the hierarchical encoder that
sits between the HIBERT (local) encoder and the abstractive decoder (Liu & Lapata 2019; graph-informed
attention, their eq. 24; structural attention, Chowdhury et al.)."""
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field, field_validator

from hibert.config.base import Section

BUILTIN_RANKINGS = ("tfidf", "oracle", "lead")
RankingKind = Literal["tfidf", "oracle", "lead", "learned"]


def ranking_kind(value: str) -> RankingKind:
    """`mds.ranking` (or --ranking) parsed, once: a built-in ordering, or "learned" for a ranker named by a
    `models:/` reference or an export directory. A bare word that is neither (a typo) is refused here, before
    it could be taken for a directory name."""
    if value in BUILTIN_RANKINGS:
        return value  # type: ignore[return-value]
    if value.startswith("models:/") or "/" in value or Path(value).is_dir():
        return "learned"
    raise ValueError(f"ranking {value!r}: use tfidf, lead, oracle, a ranker's models:/ reference "
                     "(models:/hibert-ranker@finetuned) or its export directory")


class MDSConfig(Section):
    global_layers: int = Field(2, ge=0, le=24)          # inter-unit layers on top of the local encoder
    global_heads: int | None = Field(None, ge=1)        # None -> model.heads (must divide model.hidden)
    # liu_lapata: eq. 13-20 with per-head W_c + LayerNorm and per-head q/k/v; v0: the earlier simplification
    # (q/k shared across heads, no W_c, LayerNorm or W_v), what exports without this field were trained with
    global_layer: Literal["liu_lapata", "v0"] = "liu_lapata"
    rank_embedding: bool = True                         # sinusoidal embedding of each unit's rank
    # concat: Liu & Lapata eq. 9 [e_rank; e_pos], half-width sinusoids of the unit's rank and of the token's
    # position within its unit; full: a full-width rank sinusoid alone (what exports without this field used).
    # Either is added before the global layers (the pretrained local layers keep HIBERT's own positions)
    rank_embedding_form: Literal["concat", "full"] = "concat"
    max_units: int = Field(64, ge=1, le=4096)           # units per cluster the summarizer reads
    graph_attention: bool = False                       # one global head = the row-normalised unit graph
    graph_threshold: float = Field(0.2, ge=0.0, le=1.0)  # tf-idf cosine edges below this are dropped
    # the graph's tf-idf: eq25 = N_w log(N_d / N_dw) on the units' words (Liu & Lapata, appendix eq. 25);
    # sublinear = sublinear tf x smoothed idf on subword ids (what exports without this field were trained with)
    graph_weighting: Literal["eq25", "sublinear"] = "eq25"
    structural_attention: bool = False                  # matrix-tree marginals over units (Chowdhury et al.)
    # its parts, each switchable for ablation (all off = the earlier form, what exports without them used):
    structural_split: bool = True     # eq. 1: a structural half scores the tree, a semantic half is aggregated
    structural_root: bool = True      # the root term a^r_i e_root in each unit's parent context
    structural_decoder: bool = True   # the decoder's structural context c_struct feeds P_vocab and p_gen
    # its attention over the units: additive v^T tanh(W_g g + W_s s + b), one head (Chowdhury et al. §2.3);
    # dot: scaled dot-product, multi-head (what exports without this field used)
    structural_decoder_attention: Literal["additive", "dot"] = "additive"
    # the unit vector PHT's static Phi and the structural context's values read: attention_pooling = Ma & Zong
    # eq. 2-5 (multi-head attention pooling of the unit's tokens + FFN); mean = the mean of its tokens (what
    # exports without this field used). Built only where something reads it (pht, structural_decoder)
    unit_vector: Literal["attention_pooling", "mean"] = "attention_pooling"
    # unit vector: title = Liu & Lapata eq. 1-6 (unit tokens matched against the max-pooled title, or the cluster
    # centroid without one); mean / attention = its own sentence states pooled (no title)
    ranker_pool: Literal["title", "mean", "attention"] = "title"
    ranker_loss: Literal["regression", "listwise"] = "listwise"
    # how units are ordered before the budget cut: tfidf (to the title, else the centroid), lead (document
    # order), oracle (the ROUGE-2 recall labels: an upper bound), or a learned ranker (models:/hibert-ranker@...)
    ranking: str = "tfidf"
    budget_tokens: int = Field(800, ge=16)               # the summarizer reads the top units within this
    title_unit: bool = True    # the cluster's title (where it has one) is read first, as unit 0 (Liu & Lapata)
    top_units: int | None = Field(None, ge=1)           # and at most this many

    @field_validator("ranking")
    @classmethod
    def _ranking(cls, v: str) -> str:
        ranking_kind(v)
        return v

    @property
    def ranking_kind(self) -> RankingKind:
        return ranking_kind(self.ranking)

    # what an export written before a setting existed was trained with, for each setting added since
    LEGACY: ClassVar[dict] = {"global_layer": "v0", "graph_weighting": "sublinear", "structural_split": False,
              "structural_root": False, "structural_decoder": False, "title_unit": False,
              "ranker_pool": "attention", "rank_embedding_form": "full", "structural_decoder_attention": "dot",
              "unit_vector": "mean"}

    @classmethod
    def from_export(cls, stored: dict) -> "MDSConfig":
        """The `mds:` settings an export recorded; a setting it predates takes the value it was trained with
        (LEGACY), not today's default."""
        return cls.model_validate({**cls.LEGACY, **stored})


def check_mds(cfg) -> None:
    """The `mds:` section against the core ones (a head's `check_config`)."""
    if cfg.model.hidden % (cfg.mds.global_heads or cfg.model.heads):
        raise ValueError(f"mds.global_heads ({cfg.mds.global_heads}) must divide model.hidden ({cfg.model.hidden})")
