"""The run's resumable state: where training is, what evaluation and model selection decided, how the run ended.
Every checkpoint keeps it in its marker (COMPLETE.json, "state"), one JSON key per field under the names every
earlier version wrote, so a checkpoint of any version resumes."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any


@dataclass
class TrainState:
    seed: int = 0                      # schedule.seed the run started with
    # what this process runs with (never taken from a checkpoint: it may come from another config or world size)
    config_hash: str = ""
    world_size: int = 1
    micro_per_step: int = 1            # micro-batches per optimizer step: world size x grad_accum
    # where training is
    global_step: int = 0
    epoch: int = 0
    step_in_epoch: int = 0
    mlflow_run_id: str | None = None
    # every rank's training statistics since the last logged step, when a save fell off the log_every cadence
    train_window: list[dict[str, list]] | None = None
    # evaluation, early stopping and model selection (the Validator's)
    best: float | None = None
    evals_without_improvement: int = 0
    candidates: list[list] = field(default_factory=list)  # [score, step, path, metrics] of the best evaluations
    last_eval_step: int = -1
    last_eval: dict[str, float] = field(default_factory=dict)
    # the end
    early_stopped: bool = False        # a resume does not train past the stop
    finished: bool = False             # the final evaluation and checkpoint are done
    final_metrics: dict[str, float] | None = None   # that final evaluation (publish uses it again)

    OWN = ("config_hash", "world_size", "micro_per_step")   # not a field: no annotation

    def to_dict(self) -> dict[str, Any]:
        """What a checkpoint's marker keeps: one key per field (copies: the marker never aliases the state)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, saved: dict[str, Any]) -> TrainState:
        """A checkpoint's state: a field an older checkpoint lacks takes its default, a key this version does not
        know is left out."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in saved.items() if k in names})

    def restore(self, saved: dict[str, Any]) -> None:
        """Continue from a checkpoint's state (`to_dict` of the run that wrote it): every field it holds but this
        process's own (`OWN`); the fields it lacks (an older checkpoint) keep their values."""
        for f in fields(self):
            if f.name in saved and f.name not in self.OWN:
                setattr(self, f.name, saved[f.name])
