"""Evaluation cadence, early stopping and model selection (keep the best `keep_best` evaluations' weights
and export their average). Its state lives in the trainer's resumable state dict, so a resumed run
continues the same patience count and candidate list. A candidate is [score, step, path, its evaluation's
metrics] (checkpoints written before the metrics were kept hold the first three only)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file

from hibert.runtime.export import gather_fp32_state_dict


class Validator:
    def __init__(self, trainer, every: int, patience: int | None, keep_best: int):
        self.trainer, self.every, self.patience, self.keep_best = trainer, every, patience, keep_best
        self.task = trainer.task
        self.last: dict[str, float] = {}
        self.last_step = -1

    @property
    def state(self) -> dict[str, Any]:
        return self.trainer.state

    def due(self, step: int) -> bool:
        return bool(self.every) and step % self.every == 0

    def restore(self) -> None:
        """After a resume: the last evaluation (a run preempted right after it must not evaluate that step again at
        its end, which would count it twice among the kept best)."""
        self.last_step, self.last = self.state.get("last_eval_step", -1), dict(self.state.get("last_eval", {}))

    def _evaluated(self, step: int) -> None:
        self.last, self.last_step = self.trainer.evaluate(), step
        self.state["last_eval_step"], self.state["last_eval"] = step, dict(self.last)

    def run(self, step: int) -> bool:
        """Collective. Evaluate, log, update the kept best weights; True = early stop."""
        self._evaluated(step)
        self.trainer.tracker.metrics(self.last, step)
        self.trainer.step_log.eval(step, self.last)
        stop = self._early_stop(self.last)
        self._keep_if_best(self.last, step)
        return stop

    def final(self, step: int) -> dict[str, float]:
        """Collective. The end-of-training evaluation, unless this step was just evaluated."""
        if self.last_step != step:
            self._evaluated(step)
            self.trainer.tracker.metrics(self.last, step)
            self.trainer.step_log.eval(step, self.last)
            self._keep_if_best(self.last, step)
        return self.last

    def _better(self, value: float, than: float) -> bool:
        return value < than if self.task.eval_mode == "min" else value > than

    def _early_stop(self, metrics: dict[str, float]) -> bool:
        key = self.task.eval_metric
        if key not in metrics:
            return False
        v, best = metrics[key], self.state["best"]
        if best is None or self._better(v, best):
            self.state["best"], self.state["evals_without_improvement"] = v, 0
            return False
        self.state["evals_without_improvement"] += 1
        return self.patience is not None and self.state["evals_without_improvement"] >= self.patience

    def _keep_if_best(self, metrics: dict[str, float], step: int) -> None:
        """Collective. Save full fp32 weights when this evaluation is among the best `keep_best`."""
        n, key = self.keep_best, self.task.eval_metric
        if n <= 0 or key not in metrics:
            return
        sign = 1.0 if self.task.eval_mode == "max" else -1.0
        cands = self.state["candidates"]
        ranked = sorted(cands, key=lambda c: -sign * c[0])
        if any(c[1] == step for c in cands) or (len(ranked) >= n and sign * metrics[key] <= sign * ranked[n - 1][0]):
            return   # (a step already kept: one evaluation counts once)
        full = gather_fp32_state_dict(self.trainer.engine.module, "")
        path = self.trainer.run_dir / "best" / f"step_{step:09d}.safetensors"
        main = self.trainer.rt.is_main
        if main:
            path.parent.mkdir(parents=True, exist_ok=True)
            save_file({k: v.contiguous() for k, v in full.items()}, str(path))
        ranked = sorted(cands + [[metrics[key], step, str(path), dict(metrics)]], key=lambda c: -sign * c[0])
        for c in ranked[n:]:
            if main:
                Path(c[2]).unlink(missing_ok=True)
        self.state["candidates"] = ranked[:n]
        if dist.is_initialized():
            dist.barrier()

    def _kept(self) -> list[list]:
        return [c for c in self.state["candidates"] if Path(c[2]).is_file()]

    def selected_metrics(self, step: int, final: dict[str, float]) -> dict[str, dict[str, float] | None]:
        """The evaluation of each step whose weights the export holds, by step: the kept ones (None for a
        checkpoint kept before candidates held their metrics), or `final` (the evaluation at `step`, the last
        one) when none were kept and the final weights are exported."""
        kept = self._kept()
        if not kept:
            return {str(step): dict(final)}
        return {str(c[1]): (c[3] if len(c) > 3 else None) for c in kept}

    def selected_weights(self) -> tuple[dict[str, torch.Tensor], list[int]]:
        """Collective. The average of the kept best weights, or the current weights when none were kept."""
        cands = self._kept()
        if not cands:
            return gather_fp32_state_dict(self.trainer.engine.module, ""), []
        if dist.is_initialized():
            dist.barrier()
        if not self.trainer.rt.is_main:
            return {}, [c[1] for c in cands]
        states = [load_file(c[2]) for c in cands]
        avg = {k: sum(st[k] for st in states) / len(states) for k in states[0]}
        return avg, [c[1] for c in cands]


def exported_metrics(selected: dict[str, dict[str, float] | None]) -> dict[str, float]:
    """What the exported weights themselves scored: the one selected step's evaluation; nothing for an average
    of several (those weights were never evaluated: each one's evaluation is in `selected_metrics`)."""
    if len(selected) == 1:
        return dict(next(iter(selected.values())) or {})
    return {}
