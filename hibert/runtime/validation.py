"""Evaluation cadence, early stopping and model selection (keep the best `keep_best` evaluations' weights
and export their average). Its state lives in the run's `TrainState`, so a resumed run continues the same
patience count and candidate list. A candidate is [score, step, path, its evaluation's metrics] (checkpoints
written before the metrics were kept hold the first three only). Also the `EvalContext` a task's `evaluate`
reads: the validation split's batches, shared out over the ranks."""
from __future__ import annotations

import sys
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from hibert.runtime.batching import doc_costs, plan_epoch
from hibert.runtime.engine import Runtime
from hibert.runtime.export import gather_fp32_state_dict
from hibert.runtime.loader import make_loader
from hibert.runtime.step_log import StepLog
from hibert.runtime.task import EvalContext, Task
from hibert.runtime.tracking import Tracker
from hibert.runtime.train_state import TrainState


def all_sum(values: dict[str, float], device: torch.device) -> dict[str, float]:
    """Collective. Each value summed over the ranks (float64)."""
    keys = sorted(values)
    t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=device)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t)
    return dict(zip(keys, t.tolist()))


def split_items(task: Task, engine, rt: Runtime, schedule, data, desc: str = "eval"):
    """Yield (item, counted) over this rank's share of a split's batches (`EvalContext.items`).

    ZeRO-3's forward is collective, so every rank runs the same number of forwards; the padding
    forwards (repeats of a real batch) come with counted=False and must be ignored.
    """
    s = schedule
    costs = doc_costs(data.doc_num_tokens, data.doc_num_sentences)
    plan = plan_epoch(costs, seed=s.seed, epoch=0, batch_tokens=s.batch_tokens,
                      max_docs=s.max_docs_per_batch, world=1, accum=1)
    batches = plan.batches[: s.eval_batches] if s.eval_batches else plan.batches
    W, r = rt.world_size, rt.rank
    mine = batches[r::W]
    padded = mine + [batches[0]] * (-(-len(batches) // W) - len(mine))
    tty = sys.stderr.isatty()  # in a log file: a line every 30 s and a closing line, each ending in \n
    bar = tqdm(total=len(padded), desc=desc, unit="batch", leave=not tty, disable=not rt.is_main,
               mininterval=0.5 if tty else 30.0, ascii=not tty)
    engine.eval()
    try:
        with torch.no_grad():
            for i, item in enumerate(make_loader(task, data, padded, 0, 0)):
                yield item.to(rt.device), i < len(mine)
                bar.update()
    finally:
        bar.close()
        engine.train()


def eval_context(task: Task, engine, rt: Runtime, schedule, valid_data) -> EvalContext:
    """The context a task's `evaluate` reads: this engine on this rank's device, over `valid_data` by default."""
    def items(data=None, desc: str = "eval"):
        return split_items(task, engine, rt, schedule, valid_data if data is None else data, desc)

    return EvalContext(engine, rt.device, rt.is_main, valid_data, items, partial(all_sum, device=rt.device))


class Validator:
    """Evaluates `task` on `ctx` every `every` steps, logs to `tracker` and `step_log`, stops after `patience`
    evaluations without improvement of `task.eval_metric`, keeps the `keep_best` best weights under `best_dir`."""

    def __init__(self, task: Task, ctx: EvalContext, state: TrainState, tracker: Tracker, step_log: StepLog,
                 best_dir: Path, every: int, patience: int | None, keep_best: int):
        self.task, self.ctx, self.state, self.tracker, self.step_log = task, ctx, state, tracker, step_log
        self.best_dir, self.every, self.patience, self.keep_best = best_dir, every, patience, keep_best
        self.last: dict[str, float] = {}
        self.last_step = -1

    def due(self, step: int) -> bool:
        return bool(self.every) and step % self.every == 0

    def restore(self) -> None:
        """After a resume: the last evaluation (a run preempted right after it must not evaluate that step again at
        its end, which would count it twice among the kept best)."""
        self.last_step, self.last = self.state.last_eval_step, dict(self.state.last_eval)

    def evaluate(self) -> dict[str, float]:
        """Collective. The task's validation metrics (none without validation documents)."""
        if self.ctx.valid_data is None or len(self.ctx.valid_data) == 0:
            return {}
        return self.task.evaluate(self.ctx)

    def _evaluated(self, step: int) -> None:
        self.last, self.last_step = self.evaluate(), step
        self.state.last_eval_step, self.state.last_eval = step, dict(self.last)
        self.tracker.metrics(self.last, step)
        self.step_log.eval(step, self.last)

    def run(self, step: int) -> bool:
        """Collective. Evaluate, log, update the kept best weights; True = early stop."""
        self._evaluated(step)
        stop = self._early_stop(self.last)
        self._keep_if_best(self.last, step)
        return stop

    def final(self, step: int) -> dict[str, float]:
        """Collective. The end-of-training evaluation, unless this step was just evaluated."""
        if self.last_step != step:
            self._evaluated(step)
            self._keep_if_best(self.last, step)
        return self.last

    def _better(self, value: float, than: float) -> bool:
        return value < than if self.task.eval_mode == "min" else value > than

    def _early_stop(self, metrics: dict[str, float]) -> bool:
        key = self.task.eval_metric
        if key not in metrics:
            return False
        v, best = metrics[key], self.state.best
        if best is None or self._better(v, best):
            self.state.best, self.state.evals_without_improvement = v, 0
            return False
        self.state.evals_without_improvement += 1
        return self.patience is not None and self.state.evals_without_improvement >= self.patience

    def _keep_if_best(self, metrics: dict[str, float], step: int) -> None:
        """Collective. Save full fp32 weights when this evaluation is among the best `keep_best`."""
        n, key = self.keep_best, self.task.eval_metric
        if n <= 0 or key not in metrics:
            return
        sign = 1.0 if self.task.eval_mode == "max" else -1.0
        cands = self.state.candidates
        ranked = sorted(cands, key=lambda c: -sign * c[0])
        if any(c[1] == step for c in cands) or (len(ranked) >= n and sign * metrics[key] <= sign * ranked[n - 1][0]):
            return   # (a step already kept: one evaluation counts once)
        full = gather_fp32_state_dict(self.ctx.engine.module, "")
        path = self.best_dir / f"step_{step:09d}.safetensors"
        main = self.ctx.is_main
        if main:
            path.parent.mkdir(parents=True, exist_ok=True)
            save_file({k: v.contiguous() for k, v in full.items()}, str(path))
        ranked = sorted(cands + [[metrics[key], step, str(path), dict(metrics)]], key=lambda c: -sign * c[0])
        for c in ranked[n:]:
            if main:
                Path(c[2]).unlink(missing_ok=True)
        self.state.candidates = ranked[:n]
        if dist.is_initialized():
            dist.barrier()

    def _kept(self) -> list[list]:
        return [c for c in self.state.candidates if Path(c[2]).is_file()]

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
            return gather_fp32_state_dict(self.ctx.engine.module, ""), []
        if dist.is_initialized():
            dist.barrier()
        if not self.ctx.is_main:
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
