"""Run planning: each epoch's batch plan, the run's total steps, and whether any step is left — a pure reading of
the schedule, the documents' costs, the world size and where the run is (`TrainState`), kept apart from the loop
that trains (trainer.py)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hibert.config.training import ScheduleConfig
from hibert.runtime.batching import BatchPlan, plan_epoch
from hibert.runtime.train_state import TrainState

# The planned total counts every later epoch's batches exactly up to this many documents x epochs to plan
# (~1 s of start-up on one core); a Gigaword-sized run estimates the later epochs from the current one instead.
_EXACT_PLAN_DOCS = 2_000_000


@dataclass
class RunPlan:
    """What is left of a run, decided before the loop (`Trainer.plan_run`)."""
    first: BatchPlan                   # the current epoch's batches (training goes on at state.step_in_epoch)
    total_steps: int                   # optimizer steps the run will have taken at its end
    exact: bool                        # False: the later epochs' lengths are estimated from this one's


class RunPlanner:
    def __init__(self, schedule: ScheduleConfig, costs: np.ndarray, world_size: int, state: TrainState):
        self.schedule, self.costs, self.world, self.state = schedule, costs, world_size, state

    def plan(self, epoch: int) -> BatchPlan:
        s = self.schedule
        return plan_epoch(self.costs, seed=s.seed, epoch=epoch, batch_tokens=s.batch_tokens,
                          max_docs=s.max_docs_per_batch, world=self.world, accum=s.grad_accum)

    def total_steps(self, plan: BatchPlan) -> tuple[int, bool]:
        """(optimizer steps the whole run will take, whether that count is exact), capped by max_steps.

        Epochs differ in length: each plans its own shuffle into token-budget batches. The count is exact
        when the later epochs are cheap to plan (they are deterministic: seed and epoch) — at most
        `_EXACT_PLAN_DOCS` documents x epochs left; beyond that, this epoch's length stands for the rest."""
        s, m, state = self.schedule, self.schedule.max_steps, self.state
        this_epoch = state.global_step + max(0, plan.steps - state.step_in_epoch)
        if m and this_epoch >= m:
            return m, True
        epoch, left = state.epoch, max(0, s.epochs - state.epoch - 1)
        exact = len(self.costs) * left <= _EXACT_PLAN_DOCS
        later = sum(self.plan(e).steps for e in range(epoch + 1, s.epochs)) if exact else plan.steps * left
        return (min(this_epoch + later, m) if m else this_epoch + later), exact

    def horizon_reached(self) -> bool:
        m = self.schedule.max_steps
        return bool(m) and self.state.global_step >= m

    def steps_left(self) -> bool:
        return self.state.epoch < self.schedule.epochs and not self.horizon_reached()

    def nothing_left(self) -> bool:
        """No step is left to train: the last epoch or max_steps reached, or the run stopped early (started again,
        e.g. a requeue, it must not train past its stop)."""
        s, state = self.schedule, self.state
        if not self.steps_left() or state.early_stopped:
            return True
        # a run that stopped at max_steps on the last step of its last epoch has no step left either (its epoch
        # counter was not advanced): a longer max_steps does not make it train, evaluate or register again
        return state.finished and state.epoch == s.epochs - 1 and state.step_in_epoch >= self.plan(state.epoch).steps
