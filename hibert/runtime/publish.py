"""The end of a run: export the selected weights (safetensors + configs + tokenizer + provenance), log them
to MLflow and register them. Refuses a run that took no optimizer step: an untrained model must never
land in the registry under a stage alias."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import torch.distributed as dist

from hibert.config import config_hash
from hibert.redact import redact_uri
from hibert.runtime.export import write_export
from hibert.runtime.tracking import git_commit

log = logging.getLogger("hibert.train")


class NothingTrained(RuntimeError):
    """The run reached its end without one optimizer step (empty data, or resumed past its horizon)."""


def publish(trainer, step: int, metrics: dict[str, float]) -> tuple[Path, str | None]:
    """Collective. Export and (rank 0) register; returns the export dir and the registered version."""
    if step <= 0:
        raise NothingTrained(f"no optimizer step was taken ({len(trainer.train_data)} training documents, "
                             f"schedule.epochs={trainer.cfg.schedule.epochs}); nothing is exported or registered")
    cfg, task, rt = trainer.cfg, trainer.task, trainer.rt
    full, steps = trainer.validator.selected_weights()
    out = trainer.run_dir / "export"
    version = None
    if rt.is_main:
        p = trainer.encoder_prefix
        encoder = {k[len(p):]: v for k, v in full.items() if k.startswith(p)}
        meta = {"stage": cfg.run.stage, "task": task.name, "step": step,
                "selected_steps": steps, "selection_metric": task.eval_metric,
                "init": redact_uri(cfg.run.init) if cfg.run.init else None,
                "dataset_manifest": trainer.manifest_hash(),
                "config_hash": config_hash(cfg), "git_commit": git_commit(),
                "world_size": rt.world_size, "metrics": metrics,
                "mlflow_run_id": trainer.tracker.run_id, "data": trainer.data_settings()}
        write_export(out, encoder, task.model_config(), trainer.train_data.tokenizer_path, meta)
        task.write_export_extras(out, full)
        task.write_export_flavors(out)
        trainer.tracker.artifacts(out, "export")
        pending = False
        if cfg.tracking.register_model and trainer.tracker.run_id:
            alias = task.registry_alias(cfg)
            version = trainer.tracker.register(
                "export", task.registry_name(cfg), alias,
                tags={"stage": cfg.run.stage, "dataset_manifest": meta["dataset_manifest"],
                      "git_commit": meta["git_commit"], "world_size": str(rt.world_size), "step": str(step)},
                also=cfg.tracking.also_aliases, registry_json=out / "registry.json")
            pending = version is None  # waits in the run's outbox (tracking server away)
        (out / "registry.json").write_text(json.dumps({"version": version, "uri": redact_uri(trainer.tracker.uri),
                                                       **({"pending": True} if pending else {})}))
    if dist.is_initialized():
        dist.barrier()
    return out, version
