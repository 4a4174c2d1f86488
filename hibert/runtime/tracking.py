"""MLflow on rank 0: one run per training job (kept across resumes), params, metrics, artifacts, tags.

Params are the flattened config with credentials masked (`hibert.redact`): tracking URIs with
user:password, `slurm.env` tokens and `export SECRET=...` setup lines never reach the tracking server.
"""
from __future__ import annotations

import logging
import subprocess
from pathlib import Path
from typing import Any

from hibert.config import Config, config_to_dict
from hibert.redact import redact_config_dict, redact_uri
from hibert.registry import ensure_experiment, tracking_uri

log = logging.getLogger(__name__)


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
                              cwd=Path(__file__).resolve().parent).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = str(v)[:500]
    return out


def config_params(cfg: Config) -> dict[str, str]:
    """What `Tracker.start` logs as MLflow params: the flattened config, secrets masked."""
    return _flatten(redact_config_dict(config_to_dict(cfg)))


class Tracker:
    """No-op on ranks other than 0."""

    def __init__(self, cfg: Config, enabled: bool):
        self.enabled = enabled
        self.uri = tracking_uri(cfg.tracking.uri, cfg.run.output_dir)
        self.run_id: str | None = None
        self.cfg = cfg

    def start(self, run_id: str | None, tags: dict[str, str]) -> str | None:
        if not self.enabled:
            return None
        import mlflow

        ensure_experiment(self.uri, self.cfg.tracking.experiment)
        run = mlflow.start_run(run_id=run_id, run_name=None if run_id else self.cfg.run.name)
        self.run_id = run.info.run_id
        if run_id is None:
            mlflow.log_params(config_params(self.cfg))
        mlflow.set_tags({k: redact_uri(str(v)) for k, v in {**tags, "git_commit": git_commit()}.items()})
        return self.run_id

    def metrics(self, values: dict[str, float], step: int) -> None:
        if self.enabled:
            import mlflow

            mlflow.log_metrics({k: float(v) for k, v in values.items()}, step=step)

    def artifacts(self, local_dir: Path, artifact_path: str) -> None:
        if self.enabled:
            import mlflow

            mlflow.log_artifacts(str(local_dir), artifact_path=artifact_path)

    def end(self, status: str = "FINISHED") -> None:
        if self.enabled:
            import mlflow

            mlflow.end_run(status=status)
