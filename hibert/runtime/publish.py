"""The end of a run: export the selected weights (safetensors + configs + tokenizer + provenance), log them
to MLflow and register them. Refuses a run that took no optimizer step: an untrained model must never
land in the registry under a stage alias. The export is written beside its place and renamed into it, so
`<run dir>/export` is either absent or complete (a full disk mid-export leaves no half-written model)."""
from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hibert.config import Config, config_hash
from hibert.errors import DiskFull, disk_full, free_mb
from hibert.hashing import file_hash
from hibert.redact import redact_uri
from hibert.runtime.engine import Runtime
from hibert.runtime.export import write_export
from hibert.runtime.task import Task
from hibert.runtime.tracking import Tracker, git_commit
from hibert.runtime.validation import Validator, exported_metrics

log = logging.getLogger("hibert.train")


class NothingTrained(RuntimeError):
    """The run reached its end without one optimizer step (empty data, or resumed past its horizon)."""


class PeerFailed(RuntimeError):
    """Another rank failed in a step every rank takes part in (rank 0's export): this rank stops too."""


def manifest_hash(cfg: Config) -> str:
    """The training dataset's manifest.json hash ("none" without one): which data the weights were trained on."""
    m = Path(cfg.data.dataset_dir) / "manifest.json"
    return file_hash(m) if m.is_file() else "none"


def data_settings(cfg: Config) -> dict[str, Any]:
    """How the training data was made (segmenter, limits, tokenizer): `summarize` redoes exactly this."""
    m = Path(cfg.data.dataset_dir) / "manifest.json"
    if not m.is_file():
        return {}
    manifest = json.loads(m.read_text())
    return {k: manifest[k] for k in ("segmenter", "limits", "tokenizer", "kind", "clusters", "synthetic")
            if k in manifest}


def publish(cfg: Config, task: Task, step: int, metrics: dict[str, float], *, selection: Validator,
            tracker: Tracker, rt: Runtime, train_data, encoder_prefix: str = "encoder.") -> tuple[Path, str | None]:
    """Collective. Export the weights `selection` selected (and, rank 0, log and register them with `tracker`)
    to `<run dir>/export`; returns the export dir and the registered version."""
    if step <= 0:
        raise NothingTrained(f"no optimizer step was taken ({len(train_data)} training documents, "
                             f"schedule.epochs={cfg.schedule.epochs}); nothing is exported or registered")
    out = cfg.run_dir / "export"
    selected = selection.selected_weights()  # collective under ZeRO-3
    version, verdict, error = None, [None], None
    if rt.is_main:
        try:
            full, steps = selected
            p = encoder_prefix
            encoder = {k[len(p):]: v for k, v in full.items() if k.startswith(p)}
            meta = _provenance(cfg, task, step, metrics, steps, selection.selected_metrics(step, metrics), tracker,
                               rt.world_size)
            _write(out, encoder, task, full, train_data.tokenizer_path, meta)
            version = _register(cfg, task, step, out, meta, tracker, rt.world_size)
        except Exception as e:  # safetensors' SafetensorError is neither OSError nor RuntimeError
            error = e
            if disk_full(e):
                # a copy's error names source then destination: where it was writing is the destination
                where = getattr(e, "filename2", None) or getattr(e, "filename", None) or out.parent
                verdict = [("full", f"no space left on device for the export (writing under {where}, "
                                    f"{free_mb(where)}); the final checkpoint (step {step}) is complete: free space "
                                    "and start the run again, it exports and registers without training again")]
            else:
                verdict = [("failed", f"rank 0 failed while exporting ({type(e).__name__}: "
                                      f"{str(e).splitlines()[0][:200] if str(e) else ''}); see its log")]
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(verdict, src=0)  # every rank learns how it ended: none waits for a timeout
    if verdict[0] is not None:
        kind, message = verdict[0]
        if kind == "full":
            raise DiskFull(message)
        if error is not None:
            raise error
        raise PeerFailed(message)
    return out, version


def _provenance(cfg: Config, task: Task, step: int, metrics: dict[str, float], steps: list[int],
                selected_metrics: dict[str, dict[str, float] | None], tracker: Tracker,
                world_size: int) -> dict[str, Any]:
    """export.json: where the exported weights come from and what they scored."""
    return {"stage": cfg.run.stage, "task": task.name, "step": step,
            "selected_steps": steps, "selection_metric": task.eval_metric,
            "init": redact_uri(cfg.run.init) if cfg.run.init else None,
            "dataset_manifest": manifest_hash(cfg),
            "config_hash": config_hash(cfg), "git_commit": git_commit(),
            "world_size": world_size,
            # what the exported weights scored (the selected step's evaluation, not the last one's), the last
            # evaluation, and each selected step's
            "metrics": exported_metrics(selected_metrics), "final_metrics": metrics,
            "selected_metrics": selected_metrics,
            "mlflow_run_id": tracker.run_id, "data": data_settings(cfg)}


def _write(out: Path, encoder: dict[str, torch.Tensor], task: Task, full: dict[str, torch.Tensor], tokenizer: Path,
           meta: dict[str, Any]) -> None:
    """The export directory, written beside its place and renamed into it."""
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)  # what a full disk or a kill left last time
    # an `export/` here was never registered (a registered run returns before publishing again): its space
    # goes to the new one rather than both having to fit
    shutil.rmtree(out, ignore_errors=True)
    try:
        write_export(partial, encoder, task.model_config(), tokenizer, meta)
        task.write_export_extras(partial, full)
        task.write_export_flavors(partial)
        partial.rename(out)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)  # give the space back; the checkpoints hold the weights
        raise


def version_description(cfg: Config, task: Task, meta: dict[str, Any], notes: list[str]) -> str:
    """The registered version's description (Markdown, shown on its MLflow page): what it is, what it was
    trained on, what it scored, and what a user must know first."""
    scored = ", ".join(f"{k} {v:.4g}" for k, v in sorted((meta.get("metrics") or {}).items())
                       if isinstance(v, (int, float)))
    lines = [*(f"**Note:** {n}" for n in notes),
             f"{task.name} model, stage `{cfg.run.stage}`, run `{cfg.run.name}` (MLflow run {meta['mlflow_run_id']}).",
             f"Trained {meta['step']} optimizer steps on `{redact_uri(str(cfg.data.dataset_dir))}` (manifest "
             f"{meta['dataset_manifest'][:12]}), from {meta['init'] or 'random init'}; commit {meta['git_commit']}.",
             f"Exported weights: steps {meta['selected_steps']} selected by {meta['selection_metric']}"
             + (f"; validation: {scored}." if scored else ".")]
    return "\n\n".join(lines)


def _register(cfg: Config, task: Task, step: int, out: Path, meta: dict[str, Any], tracker: Tracker,
              world_size: int) -> str | None:
    """The export as the run's MLflow artifacts and a registered version (registry.json says which)."""
    tracker.artifacts(out, "export")
    version, pending = None, False
    if cfg.tracking.register_model and tracker.run_id:
        notes, note_tags = task.registry_notes(out)
        version = tracker.register(
            "export", task.registry_name(cfg), task.registry_alias(cfg),
            tags={"stage": cfg.run.stage, "task": task.name, "dataset_manifest": meta["dataset_manifest"],
                  "git_commit": meta["git_commit"], "world_size": str(world_size), "step": str(step), **note_tags},
            also=cfg.tracking.also_aliases, registry_json=out / "registry.json",
            description=version_description(cfg, task, meta, notes))
        pending = version is None  # waits in the run's outbox (tracking server away)
    (out / "registry.json").write_text(json.dumps({"version": version, "uri": redact_uri(tracker.uri),
                                                   **({"pending": True} if pending else {})}))
    return version
