"""Sentence segmentation and word tokenization through stanza.

Two kinds, never swapped for one another behind the user's back (the kind and its settings go into the
manifest, and a missing model is an error):
- "neural": stanza's neural tokenizer, from English models downloaded into `stanza_dir`
  (`stanza.download('en', model_dir=...)` on a machine with hub access).
- "spacy": stanza's `tokenize` processor with its spaCy variant (spaCy's English rules + sentencizer).
  It needs no model, so it runs offline: stanza only needs a `dir` holding a minimal resources.json.
  With `fast` (default) the paragraphs go through the spaCy Language object that stanza's variant builds,
  batched with `nlp.pipe`, instead of being wrapped token by token into stanza Documents: the same
  sentences and tokens (tests/test_data_prep_segment.py checks it against the full stanza pipeline), several
  times faster (benchmarks/bench_segment.py measures both). When the installed stanza's variant is one whose
  recipe was checked (`English()` + `sentencizer`), the fast path builds that Language itself and loads neither
  stanza nor torch (seconds less start-up per process: bench_segment.py's start-up rows); any other stanza
  version goes through `stanza.Pipeline`.
Paragraphs are segmented separately, so no sentence crosses a paragraph break. Sentence text is returned
with whitespace collapsed (one readable line); the word count is the number of tokens.
"""
from __future__ import annotations

import hashlib
import importlib.metadata as md
import importlib.util
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from hibert.config.data import SegmenterConfig
from hibert.errors import UserError

Sentence = tuple[str, int]        # (text, number of word tokens)

# The least stanza needs to build an English pipeline without downloading anything.
OFFLINE_RESOURCES = {"en": {"lang_name": "English", "packages": {"default": {}}, "tokenize": {},
                            "default_processors": {}, "default_dependencies": {}}}


class SegmenterUnavailable(RuntimeError):
    """The configured segmenter cannot run here (no silent fallback to another one)."""


def offline_resources_dir() -> Path:
    """A directory with the minimal resources.json (created once per user, atomically)."""
    d = Path(tempfile.gettempdir()) / f"hibert-stanza-offline-{os.getuid()}"
    target = d / "resources.json"
    if not target.is_file() or json.loads(target.read_text() or "{}") != OFFLINE_RESOURCES:
        d.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=d, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(OFFLINE_RESOURCES, f)
        os.replace(tmp, target)
    return d


def _clean(text: str) -> str:
    return " ".join(text.split())


class Segmenter:
    """segment(docs) with docs = list of paragraph lists -> per doc, the list of (sentence, words)."""

    info: dict[str, Any]

    def segment(self, docs: list[list[str]]) -> list[list[Sentence]]:
        raise NotImplementedError


# sha256 of stanza/pipeline/external/spacy.py in the stanza releases whose spaCy variant was read and found to
# build `spacy.lang.en.English()` + the `sentencizer` pipe (spaCy >= 3), the Language `_spacy_language` builds;
# tests/test_data_prep_segment.py checks both give equal configs and equal sentences. Releases: 1.15.0.
VERIFIED_STANZA_SPACY_VARIANT = {"f9e923dd82bc678078eb17aed3d7a8f5b8b51a66c7841131a1bf22d8e7f55579"}


def stanza_spacy_variant_sha256() -> str | None:
    """Hash of the installed stanza's spaCy variant source, found without importing stanza (which imports torch)."""
    spec = importlib.util.find_spec("stanza")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "pipeline" / "external" / "spacy.py"
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def direct_fast_path(cfg: SegmenterConfig) -> bool:
    """Whether the fast spaCy path can build stanza's variant Language itself (no stanza, no torch)."""
    return cfg.kind == "spacy" and cfg.fast and stanza_spacy_variant_sha256() in VERIFIED_STANZA_SPACY_VARIANT


def _spacy_language() -> Any:
    """What stanza's spaCy variant builds: spaCy's English tokenizer rules plus the rule-based sentencizer."""
    from hibert.data_prep.spacy_light import English  # lazy: spaCy, ~0.6 s, paid by the fast spaCy segmenter only

    nlp = English()
    nlp.add_pipe("sentencizer")
    return nlp


def built_by(cfg: SegmenterConfig) -> str:
    """How the spaCy variant's Language is built with the stanza installed here (the manifest says it, as
    judged where the merge runs; the output is the same either way)."""
    if direct_fast_path(cfg):
        return "stanza's spacy variant recipe (verified stanza source), built without loading stanza"
    if importlib.util.find_spec("stanza") is None:
        return "not built: stanza is not installed here (PTB-tokenized sources need no segmenter)"
    return "stanza.Pipeline"


def preload_modules(cfg: SegmenterConfig) -> list[str]:
    """The heavy modules a worker process should import before it forks (what its segmenter will load)."""
    return ["hibert.data_prep.spacy_light"] if direct_fast_path(cfg) else ["stanza", "spacy"]


class SpacySegmenter(Segmenter):
    def __init__(self, cfg: SegmenterConfig):
        self.fast = cfg.fast
        self.batch_size = max(1, cfg.batch_size)
        self.pipeline: Any = None
        built = built_by(cfg)
        if direct_fast_path(cfg):
            self.nlp = _spacy_language()
        else:
            import stanza  # lazy: ~1.4 s (torch), paid only without the verified direct fast path

            self.pipeline = stanza.Pipeline(lang="en", processors={"tokenize": "spacy"},
                                            dir=str(offline_resources_dir()), download_method=None,
                                            logging_level="WARN")
            # The spaCy Language stanza's variant built (English() + sentencizer), used directly in fast mode.
            self.nlp = self.pipeline.processors["tokenize"]._variant.nlp
        self.info = {"library": "stanza", "stanza_version": md.version("stanza"), "processor": "tokenize",
                     "kind": "spacy", "variant": "spacy", "spacy_version": md.version("spacy"),
                     "spacy_pipeline": "spacy.lang.en.English() + sentencizer (stanza's spacy variant)",
                     "built_by": built, "fast_path": self.fast, "offline": True,
                     "paragraphs": "segmented separately"}

    def _paragraphs(self, paragraphs: list[str]) -> list[list[Sentence]]:
        out = []
        if self.fast:
            from spacy.attrs import IDX, LENGTH, SENT_START  # loaded already by self.nlp; at the top: ~1.5 s

            for d in self.nlp.pipe(paragraphs, batch_size=self.batch_size):
                if not len(d):
                    out.append([])
                    continue
                # sentence spans from token arrays, without a Python object per token; paragraphs arrive
                # whitespace-collapsed, so spaCy makes no whitespace tokens and a span's length is its words
                a = d.to_array([IDX, LENGTH, SENT_START])
                a[0, 2] = 1  # the first token always starts a sentence
                starts = np.flatnonzero(a[:, 2] == 1).tolist()
                ends = starts[1:] + [len(d)]
                text = d.text
                out.append([(_clean(text[a[b, 0]:a[e - 1, 0] + a[e - 1, 1]]), e - b) for b, e in zip(starts, ends)])
        else:
            for d in self.pipeline.bulk_process(paragraphs):
                out.append([(_clean(s.text), sum(not t.text.isspace() for t in s.tokens)) for s in d.sentences])
        return out

    def segment(self, docs: list[list[str]]) -> list[list[Sentence]]:
        flat = [_clean(p) for paragraphs in docs for p in paragraphs]  # readers collapse already; callers may not
        per_paragraph = iter(self._paragraphs(flat))
        return [[s for _ in paragraphs for s in next(per_paragraph) if s[0]] for paragraphs in docs]


def neural_models(cfg: SegmenterConfig) -> list[Path]:
    """The stanza English tokenizer models in stanza_dir; SegmenterUnavailable when there are none."""
    d = Path(cfg.stanza_dir) if cfg.stanza_dir else None
    models = sorted((d / "en" / "tokenize").glob("*.pt")) if d else []
    if d is None or not (d / "resources.json").is_file() or not models:
        raise SegmenterUnavailable(
            f"data.segmenter.kind=neural needs stanza's English models in data.segmenter.stanza_dir "
            f"(--stanza-dir; now {cfg.stanza_dir!r}): run stanza.download('en', model_dir=DIR) where the hub "
            f"is reachable. To prepare without them, choose data.segmenter.kind=spacy explicitly "
            f"(recorded in the manifest).")
    return models


def check_available(cfg: SegmenterConfig) -> None:
    """Fail before any work when the configured segmenter cannot run here: its packages, its models."""
    missing = [name for name in ("stanza", "spacy") if importlib.util.find_spec(name) is None
               and (name == "stanza" and not direct_fast_path(cfg) or name == "spacy" and cfg.kind == "spacy")]
    if missing:
        raise UserError(f"data.segmenter.kind={cfg.kind} needs {' and '.join(missing)}, which this Python lacks "
                        f"(pip install {' '.join(missing)}); sources with ptb_tokenized: true need no segmenter")
    if cfg.kind == "neural":
        neural_models(cfg)


class NeuralSegmenter(Segmenter):
    def __init__(self, cfg: SegmenterConfig):
        import stanza  # lazy: ~1.4 s (torch), paid only by the neural segmenter

        models = neural_models(cfg)
        d = Path(cfg.stanza_dir)
        self.pipeline = stanza.Pipeline(lang="en", processors="tokenize", dir=str(d), download_method=None,
                                        use_gpu=cfg.use_gpu, logging_level="WARN")
        self.info = {"library": "stanza", "stanza_version": stanza.__version__, "processor": "tokenize",
                     "kind": "neural", "variant": "neural", "model_dir": str(d),
                     "models": [m.name for m in models], "use_gpu": cfg.use_gpu,
                     "paragraphs": "segmented separately (joined with blank lines)"}

    def segment(self, docs: list[list[str]]) -> list[list[Sentence]]:
        texts = ["\n\n".join(paragraphs) for paragraphs in docs]
        out = []
        for d in self.pipeline.bulk_process(texts):
            out.append([(t, len(s.tokens)) for s in d.sentences if (t := _clean(s.text))])
        return out


_CACHE: dict[str, Segmenter] = {}


def make_segmenter(cfg: SegmenterConfig) -> Segmenter:
    """One segmenter per setting and process (they hold no per-document state; loading takes seconds). Loaded
    only when a document needs one: PTB-tokenized sources are split at their tokens."""
    key = cfg.model_dump_json()
    if key not in _CACHE:
        check_available(cfg)
        _CACHE[key] = NeuralSegmenter(cfg) if cfg.kind == "neural" else SpacySegmenter(cfg)
    return _CACHE[key]


def installed_version(name: str) -> str:
    """A distribution's version, or "not installed" (a machine that only reads PTB-tokenized sources, such as a
    bare GPU node, needs neither stanza nor spaCy)."""
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return "not installed"


def segmenter_info(cfg: SegmenterConfig) -> dict[str, Any]:
    """What `make_segmenter(cfg).info` will say, without loading anything heavy."""
    info: dict[str, Any] = {"library": "stanza", "stanza_version": installed_version("stanza"),
                            "processor": "tokenize", "kind": cfg.kind}
    if cfg.kind == "spacy":
        info.update(variant="spacy", spacy_version=installed_version("spacy"), fast_path=cfg.fast, offline=True,
                    built_by=built_by(cfg))
    else:
        models = neural_models(cfg)
        info.update(variant="neural", model_dir=cfg.stanza_dir, use_gpu=cfg.use_gpu, models=[m.name for m in models],
                    model_sha256={m.name: hashlib.sha256(m.read_bytes()).hexdigest() for m in models})
    return info
