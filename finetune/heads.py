"""The head registry: one `HeadSpec` per finetuning head, registered in one place.

`hibert finetune` (by `finetune.task`), `hibert evaluate` and `hibert summarize` (by the `task` an export's
export.json records), `hibert submit` and the local pipeline runner (registered model names) all ask this
registry; none of them names a head. A new head is one folder and one call:

    from hibert.finetune.heads import HeadSpec, register_head
    register_head(HeadSpec(name="lead-k", title="lead-k scorer", registered_model="hibert-lead-k", ...))

The built-in heads register themselves in their `head.py`. Heads outside the project register from a module
named in `$HIBERT_HEADS` (comma-separated, imported on first use — the ranks a command starts inherit the
variable) or from an installed package's `hibert.heads` entry point (anchors: torchtitan's
`register_train_spec`/`get_train_spec`; Hugging Face's Auto classes dispatching on a config field).
"""
from __future__ import annotations

import importlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from hibert.errors import UserError

# the built-in heads (name -> the module that registers it), in the order an export without export.json is
# matched against their files
BUILTIN = {"extractive": "hibert.finetune.extractive.head", "abstractive": "hibert.finetune.abstractive.head",
           "ranker": "hibert.finetune.ranker.head", "mds": "hibert.finetune.mds.head"}
PLUGINS_ENV = "HIBERT_HEADS"
ENTRY_POINT_GROUP = "hibert.heads"


class HeadError(UserError):
    """A head that is not registered, or an export / dataset a head cannot use: one line for the user."""


@dataclass
class EvalOutcome:
    """What `hibert evaluate` prints and logs for one evaluation."""
    out: Path                                  # the report directory
    lines: list[str]                           # printed to stdout, in order
    result: dict[str, Any] | None = None       # summary scores to log to MLflow (None: not logged)
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class HeadSpec:
    """Everything the commands need to know about a head.

    build_task(cfg, inputs, model_cfg) -> Task: the head's `hibert.runtime.task.Task`; it may replace
        `inputs.train` / `inputs.valid` with its dataset views (first chunks, ranked clusters, ...).
    evaluate(cfg, settings, export_dir, ref, clusters) -> EvalOutcome: the evaluation of an export on
        `settings.split` (`clusters`: whether that split holds clusters); writes the report.
    load(export_dir, device) -> (model in eval mode, the export's settings): the head's export loader; the
        evaluation skeleton's "load" step (finetune/base/evaluation.py).
    summarizer(cfg, export_dir, device, generation, settings) -> an object whose `summarize_all(inputs)`
        returns one `finetune.base.text.Summary` per input (a (id, text) document, or an (id, [texts])
        cluster when `reads == "clusters"`). None: the head does not summarize (e.g. a ranker).
    """
    name: str                                  # `finetune.task`, and the `task` of its exports' export.json
    title: str                                 # e.g. "extractive finetuning" (loss plots, logs)
    registered_model: str                      # the MLflow registered model its exports become versions of
    build_task: Callable[..., Any]
    evaluate: Callable[..., EvalOutcome]
    export_files: tuple[str, ...] = ()         # files the head writes next to the encoder export
    load: Callable[..., tuple[Any, dict[str, Any]]] | None = None
    config_sections: tuple[str, ...] = ()      # the config sections of its own it reads (logged at start)
    summarizer: Callable[..., Any] | None = None
    reads: str = "documents"                   # what summarize reads: "documents" or "clusters"
    decodes: bool = False                      # the decoding flags (--beam, ...) apply to its exports


_HEADS: dict[str, HeadSpec] = {}
_loaded = False


def register_head(spec: HeadSpec, *, replace: bool = False) -> HeadSpec:
    """Add a head. A second head of the same name is refused unless `replace` (tests, experiments)."""
    if spec.name in _HEADS and not replace and _HEADS[spec.name] is not spec:
        raise HeadError(f"a head named {spec.name!r} is already registered")
    if spec.reads not in ("documents", "clusters"):
        raise HeadError(f"head {spec.name!r}: reads must be 'documents' or 'clusters', not {spec.reads!r}")
    _HEADS[spec.name] = spec
    return spec


def _load() -> None:
    """Import the built-in heads and the plugins once. Deferred to first use, not done at import: the heads
    import torch and the models (~2 s), which `hibert --help` and `hibert prep` do not need."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    for name, module in BUILTIN.items():
        importlib.import_module(module)
        if name not in _HEADS:
            raise HeadError(f"{module} did not register the head {name!r} it is listed under (finetune/heads.py)")
    for module in filter(None, (m.strip() for m in os.environ.get(PLUGINS_ENV, "").split(","))):
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise HeadError(f"${PLUGINS_ENV}: cannot import head module {module!r} ({e})") from None
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        ep.load()


def is_builtin(name: str) -> bool:
    """Whether `name` is a built-in head, known without importing any head (the `--nproc` launcher imports
    none: each rank does)."""
    return name in BUILTIN


def registered_heads() -> dict[str, HeadSpec]:
    _load()
    return dict(_HEADS)


def get_head(name: str) -> HeadSpec:
    _load()
    if name not in _HEADS:
        raise HeadError(f"finetune.task={name}: no such head (registered: {', '.join(sorted(_HEADS))}; a head of "
                        f"your own registers with finetune.heads.register_head, from a module named in "
                        f"${PLUGINS_ENV})")
    return _HEADS[name]


def head_of_export(export_dir: Path) -> HeadSpec:
    """The head an export belongs to: the `task` its export.json records. An export without one (hand-made,
    or a pretraining encoder) is matched by the head files it holds; one holding none is read as extractive,
    whose loader then says what is missing."""
    _load()
    export_dir = Path(export_dir)
    meta_path = export_dir / "export.json"
    try:
        task = json.loads(meta_path.read_text()).get("task") if meta_path.is_file() else None
    except (json.JSONDecodeError, AttributeError, OSError):
        task = None
    if task in _HEADS:
        return _HEADS[task]
    present = {name: sum((export_dir / f).is_file() for f in spec.export_files) for name, spec in _HEADS.items()}
    best = max(present.values(), default=0)
    if best == 0:
        return _HEADS["extractive"]
    return next(_HEADS[name] for name, n in present.items() if n == best)
