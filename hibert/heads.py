"""The head registry: one `HeadSpec` per finetuning head, registered in one place.

`hibert finetune` (by `finetune.task`), `hibert evaluate` and `hibert summarize` (by the `task` an export's
export.json records), `hibert submit` and the local pipeline runner (registered model names) all ask this
registry; none of them names a head. A new head is one folder and one call:

    from hibert.heads import HeadSpec, register_head
    register_head(HeadSpec(name="lead-k", title="lead-k scorer", registered_model="hibert-lead-k", ...))

The built-in heads register themselves in their `spec.py` (their parts load on first use). Heads outside the
project register from a module named in `$HIBERT_HEADS` (comma-separated, imported on first use — the ranks a
command starts inherit the variable) or from an installed package's `hibert.heads` entry point (anchors: torchtitan's
`register_train_spec`/`get_train_spec`; Hugging Face's Auto classes dispatching on a config field).
"""
from __future__ import annotations

import importlib
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from hibert.errors import UserError

# the built-in heads (name -> the module that registers it), in the order an export without export.json is
# matched against their files
BUILTIN = {"extractive": "hibert.finetune.extractive.spec", "abstractive": "hibert.finetune.abstractive.spec",
           "ranker": "hibert.finetune.ranker.spec", "mds": "hibert.finetune.mds.spec"}
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
class Inference:
    """What a head's exports take at inference time (`hibert evaluate`, `hibert summarize`, the served model).

    settings: a pydantic model of the typed settings (e.g. `GenerationConfig`). A field whose
        `json_schema_extra` holds a `flag` (hibert.config.base.flag) is a command-line flag of evaluate and
        summarize (or of the commands it names) and, under the flag's name without dashes, a served param; its
        bounds are the field's.
    stored(export_dir) -> settings: the export's own settings, read without loading any weights.
    check(given, base, export_dir): rules no single field states; raises `SettingError` naming the flag. Called
        once with `base` None before any model is resolved (rules among the flags given), then with the
        export's own settings (`given`: field -> value of the flags given).
    title: the heading of its flags in `--help`.
    """
    settings: type
    stored: Callable[[Path], Any]
    check: Callable[[dict[str, Any], Any, Path | None], None] | None = None
    title: str = "model settings"


@dataclass(frozen=True)
class HeadSpec:
    """Everything the commands need to know about a head; the commands name none.

    build_task(cfg, inputs, model_cfg) -> Task: the head's `hibert.runtime.task.Task`; it may replace
        `inputs.train` / `inputs.valid` with its dataset views (first chunks, ranked clusters, ...).
    evaluate(cfg, settings, export_dir, ref, clusters, resolved) -> EvalOutcome: the evaluation of an export on
        `settings.split` (`clusters`: whether that split holds clusters; `resolved`: its inference settings,
        resolved once by the command); writes the report.
    load(export_dir, device) -> (model in eval mode, the export's settings): the head's export loader; the
        evaluation skeleton's "load" step (finetune/evaluation/skeleton.py).
    summarizer(cfg, export_dir, device, resolved, settings) -> an object whose `summarize_all(inputs,
        settings=None)` returns one `finetune.inference.text.Summary` per input (a (id, text) document, or an (id,
        [texts]) cluster when `reads == "clusters"`); `settings` replaces `resolved` for one call (a served
        request's params). None: the head does not summarize (e.g. a ranker).
    config: the config sections of its own (name -> pydantic model), merged into the one schema when the
        registry loads; a section several heads read (e.g. `mds`) is registered by each with the same model.
    check_config(cfg): rules that span its sections and the core ones; raises ValueError naming the keys.
    report_lines(name, report) -> lines: how `hibert demo` prints one of its reports whose kind is not a ROUGE
        table (e.g. a ranker's recall at L'); None: the ROUGE table.
    """
    name: str                                  # `finetune.task`, and the `task` of its exports' export.json
    title: str                                 # e.g. "extractive finetuning" (loss plots, logs)
    registered_model: str                      # the MLflow registered model its exports become versions of
    build_task: Callable[..., Any]
    evaluate: Callable[..., EvalOutcome]
    export_files: tuple[str, ...] = ()         # files the head writes next to the encoder export
    load: Callable[..., tuple[Any, dict[str, Any]]] | None = None
    config: Mapping[str, type] = field(default_factory=dict)
    check_config: Callable[[Any], None] | None = None
    summarizer: Callable[..., Any] | None = None
    inference: Inference | None = None
    reads: str = "documents"                   # what summarize reads: "documents" or "clusters"
    decodes: bool = False                      # its exports record whether their decoder writes yet (fluency)
    report_lines: Callable[[str, dict], list[str]] | None = None


def lazy(target: str) -> Callable[..., Any]:
    """`module:attribute`, imported on the first call. A head's parts import torch, the models and MLflow
    (~2.8 s for the four built-in heads): every command that loads a config loads the registry (for the heads'
    config sections), and `hibert prep` or `hibert submit` must not pay for what they never call."""
    module, _, attr = target.partition(":")
    cache: list[Callable[..., Any]] = []

    def call(*args: Any, **kwargs: Any) -> Any:
        if not cache:
            cache.append(getattr(importlib.import_module(module), attr))
        return cache[0](*args, **kwargs)

    call.__qualname__ = call.__name__ = target
    return call


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
    """Import the built-in heads and the plugins once, on first use (the first config loaded, at the latest).
    A built-in head's module holds its registration alone (its parts load through `lazy`); a plugin's module
    may import what it likes."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    for name, module in BUILTIN.items():
        importlib.import_module(module)
        if name not in _HEADS:
            raise HeadError(f"{module} did not register the head {name!r} it is listed under (hibert/heads.py)")
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
                        f"your own registers with hibert.heads.register_head, from a module named in "
                        f"${PLUGINS_ENV})")
    return _HEADS[name]


def config_sections() -> dict[str, type]:
    """The config sections the registered heads add to the one schema (hibert/config/schema.py): name -> model.
    Heads that read one section (`mds`: the ranker, the flat baseline on clusters, the summarizer) register the
    same model; two models under one name are refused."""
    _load()
    out: dict[str, type] = {}
    for spec in _HEADS.values():
        for name, model in spec.config.items():
            if out.setdefault(name, model) is not model:
                raise HeadError(f"head {spec.name!r}: config section {name!r} is already another head's "
                                f"({out[name].__name__}, not {model.__name__})")
    return out


def config_checks() -> list[Callable[[Any], None]]:
    """The registered heads' cross-section rules, each once (heads may share one)."""
    _load()
    return list(dict.fromkeys(s.check_config for s in _HEADS.values() if s.check_config is not None))


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
