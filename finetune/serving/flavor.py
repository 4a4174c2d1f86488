"""The MLflow pyfunc flavor of a finetuned export: an `MLmodel` (signature, params with the model's own
defaults, an input example) and its environment files, written into the export directory itself, so the one
registered model version is both a HIBERT export and a pyfunc model. Nothing is pickled: the flavor names
a loader module (`hibert.finetune.serving.pyfunc`) that reads the safetensors weights and the tokenizer
already in the directory, which is why the project must be installed where the model is served
(`mlflow models serve --env-manager local`)."""
from __future__ import annotations

import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from hibert.finetune.inference.flags import all_flags, resolve_settings, served_params
from hibert.heads import HeadSpec, head_of_export

LOADER_MODULE = "hibert.finetune.serving.pyfunc"
# the settings a loader may give (pyfunc._load_pyfunc): MLflow passes a load-time model_config (or
# MLFLOW_PYFUNC_INFERENCE_CONFIG's) on only for keys the MLmodel declares; None means the default
MODEL_CONFIG: dict[str, Any] = {"stanza_dir": None, "device": None, "max_batch_size": None}
PACKAGE = "hibert-platform"
_PARAM_TYPES = {bool: "boolean", int: "long", float: "double", str: "string"}
# a short news paragraph: what the served model reads (no corpus text is copied into the model)
EXAMPLE_TEXT = ("The city council approved a new budget on Tuesday after months of debate. The plan raises "
                "spending on schools and roads. Opponents said the tax increase would hurt small businesses.")


def param_defaults(head: HeadSpec, export_dir: Path) -> dict[str, Any]:
    """The params a head's pyfunc takes (its inference settings' flags without dashes), with the export's own
    settings as defaults: a request that gives none is served exactly as `hibert summarize` without flags."""
    return served_params(head, resolve_settings(head, export_dir, {}))


def signature(head: HeadSpec, export_dir: Path):
    # lazy (here and below): MLflow ~1 s, pandas; a training rank imports this module and calls them once, at export
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, ParamSchema, ParamSpec, Schema
    from mlflow.types.schema import Array

    if head.reads == "clusters":
        inputs = Schema([ColSpec(Array("string"), "documents"), ColSpec("string", "id", required=False)])
    else:
        inputs = Schema([ColSpec("string", "text"), ColSpec("string", "id", required=False)])
    outputs = Schema([ColSpec("string", "id"), ColSpec(Array("string"), "summary"),
                      ColSpec("long", "num_sentences"), ColSpec("string", "note")])
    own = param_defaults(head, export_dir)
    # every head's params: the model's own with its defaults, another head's with None, so that MLflow hands
    # them to predict (which refuses them in the body of a 400) instead of dropping them with a log warning
    every = {f.dest: f.type for f in all_flags().values()}
    params = ParamSchema([ParamSpec(name, _PARAM_TYPES[type(v)], v) for name, v in own.items()]
                         + [ParamSpec(name, _PARAM_TYPES[t], None) for name, t in sorted(every.items())
                            if name not in own])
    return ModelSignature(inputs=inputs, outputs=outputs, params=params)


def input_example(head: HeadSpec):
    import pandas as pd  # lazy: ~0.3 s; a training rank imports this module, only an export writes its example

    if head.reads == "clusters":
        return pd.DataFrame({"id": ["example"], "documents": [[EXAMPLE_TEXT, EXAMPLE_TEXT.split(". ", 1)[1]]]})
    return pd.DataFrame({"id": ["example"], "text": [EXAMPLE_TEXT]})


def _project_version() -> str:
    try:
        return version(PACKAGE)
    except PackageNotFoundError:
        return "0.1.0"


def write_pyfunc_flavor(export_dir: Path) -> bool:
    """MLmodel + environment files into `export_dir`, for a head that summarizes; False for one that does not
    (an encoder, a ranker)."""
    import mlflow  # lazy, with torch: MLflow ~1 s; the registry and serving import this module, a rank calls this once
    import torch
    from mlflow.models import Model
    from mlflow.models.utils import _save_example  # the example files MLflow's own save_model writes

    export_dir = Path(export_dir)
    head = head_of_export(export_dir)
    if head.summarizer is None:
        return False
    requirements = [f"{PACKAGE}>={_project_version()}", f"mlflow>={mlflow.__version__.split('+')[0]}",
                    f"torch>={torch.__version__.split('+')[0]}"]
    (export_dir / "requirements.txt").write_text("\n".join(requirements) + "\n")
    py = ".".join(map(str, sys.version_info[:3]))
    (export_dir / "python_env.yaml").write_text(
        f"python: {py}\nbuild_dependencies:\n- pip\ndependencies:\n- -r requirements.txt\n")
    (export_dir / "conda.yaml").write_text(
        f"name: hibert-{head.name}\nchannels:\n- conda-forge\ndependencies:\n- python={py}\n- pip\n- pip:\n"
        + "".join(f"  - {r}\n" for r in requirements))
    model = Model(signature=signature(head, export_dir),
                  metadata={"hibert_head": head.name, "hibert_reads": head.reads})
    mlflow.pyfunc.add_to_model(model, loader_module=LOADER_MODULE, python_env="python_env.yaml",
                               conda_env="conda.yaml", model_config=dict(MODEL_CONFIG))
    _save_example(model, input_example(head), str(export_dir))
    model.save(str(export_dir / "MLmodel"))
    return True
