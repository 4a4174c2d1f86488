"""The one training loop. `Trainer.fit` reads top to bottom: resume, what is left of the run (`plan_run`), banner,
then per step `train_step` followed by the components that each own their cadence — the step log
(`schedule.log_every`), the validator (`schedule.eval_every`: evaluation, early stopping, model selection), the
checkpointer (`checkpoint.every_steps`) and the preemption flag — and at the end `publish` (export + registry).
Pretraining and every finetuning head run through it with their own `Task`; the run's starting weights
(`run.init`) are loaded here, into the model the task built (`Task.init_from`)."""
from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hibert.config import Config, config_hash, save_resolved
from hibert.redact import redact_uri
from hibert.runtime.batching import BatchPlan, doc_costs
from hibert.runtime.checkpoint import CheckpointManager
from hibert.runtime.compile import compile_layers
from hibert.runtime.engine import Runtime, build_engine
from hibert.runtime.export import InitModel
from hibert.runtime.global_batch import micro_batch_seed
from hibert.runtime.loader import make_loader
from hibert.runtime.metrics import (
    PhaseClock,
    Window,
    default_peak_tflops,
    gather_window,
    peak_memory_gb,
    restore_window,
)
from hibert.runtime.preemption import preemption_flag
from hibert.runtime.publish import manifest_hash, publish
from hibert.runtime.run_plan import RunPlan, RunPlanner
from hibert.runtime.step_log import StepLog, banner
from hibert.runtime.task import Task
from hibert.runtime.tracking import Tracker
from hibert.runtime.train_state import TrainState
from hibert.runtime.validation import Validator, all_sum, eval_context

log = logging.getLogger("hibert.train")


@dataclass
class TrainResult:
    status: str                        # finished | early_stopped | preempted
    step: int
    export_dir: Path | None
    metrics: dict[str, float]
    registered_version: str | None = None
    tracking_pending: int = 0          # operations left in the run's outbox (tracking server away)


class Checkpointer:
    """Saves `engine` and `state` every `every` steps (0: only at the end and on preemption), never twice for one
    step."""

    def __init__(self, manager: CheckpointManager, every: int, engine, state: TrainState):
        self.manager, self.every, self.engine, self.state = manager, every, engine, state
        self.last_saved = -1

    def due(self, step: int) -> bool:
        """A scheduled save at this step (the caller completes the state first, then calls `save`)."""
        return bool(self.every) and step % self.every == 0 and self.last_saved != step

    def save(self, step: int, force: bool = False) -> None:
        """`force`: save even if this step's tag was written (or resumed from): then its weights are these, and
        only the state in its marker is replaced, atomically — rewriting the tag would leave a moment without
        it, and with keep_last 1 without any checkpoint."""
        if self.last_saved == step:
            if not force or self.manager.restate(step, self.state.to_dict()):
                return
            # forced, and the tag no longer verifies: written again below
        self.manager.save(self.engine, step, self.state.to_dict())
        self.last_saved = step


class Trainer:
    def __init__(self, cfg: Config, task: Task, rt: Runtime, train_data, valid_data, init: InitModel | None = None,
                 encoder_prefix: str = "encoder."):
        self.cfg, self.task, self.rt = cfg, task, rt
        self.train_data, self.valid_data = train_data, valid_data
        self.encoder_prefix = encoder_prefix
        self.run_dir = cfg.run_dir
        s = cfg.schedule
        torch.manual_seed(cfg.run.seed)  # identical init on every rank
        self.model = task.build_model()
        task.init_from(self.model, init)   # run.init, the same way for every task
        if cfg.deepspeed.torch_compile:
            n = compile_layers(self.model)
            if rt.is_main:
                log.info("torch.compile: %d Transformer layers (compiled at their first batches)", n)
        groups = [g for g in task.param_groups(self.model, cfg) if g.params]
        self.engine = build_engine(cfg, self.model, rt, groups)
        # groups with their own lr (e.g. encoder / decoder): one lr_<prefix> metric each
        self.lr_names = [g.name.split(".")[0] for g in groups]
        torch.manual_seed(cfg.run.seed + 7919 * (rt.rank + 1))  # anything random outside a micro-batch's step
        # the accumulation is derived from the global batch for this world size (global_batch.py): not part of
        # what a resume on another world size must match
        hashed = cfg.model_copy(update={"schedule": s.model_copy(update={"grad_accum": 1})})
        self.state = TrainState(seed=s.seed, config_hash=config_hash(hashed), world_size=rt.world_size,
                                micro_per_step=rt.world_size * s.grad_accum)
        self.checkpointer = Checkpointer(
            CheckpointManager(cfg.checkpoint_dir, cfg.checkpoint.keep_last, rt.rank, rt.world_size),
            cfg.checkpoint.every_steps, self.engine, self.state)
        self.tracker = Tracker(cfg, enabled=rt.is_main)
        self.flag = preemption_flag()   # installed by prepare_run already, before the start-up
        self.step_log = StepLog(0, 0, rt.is_main)
        self.validator = Validator(task, eval_context(task, self.engine, rt, s, valid_data), self.state,
                                   self.tracker, self.step_log, self.run_dir / "best", s.eval_every,
                                   s.early_stop_patience, cfg.checkpoint.keep_best)
        self.last_metrics: dict[str, float] = {}
        self.costs = doc_costs(train_data.doc_num_tokens, train_data.doc_num_sentences)
        self.planner = RunPlanner(s, self.costs, rt.world_size, self.state)
        # training statistics of the steps since the last logged one, still on the device
        self.unlogged: dict[str, torch.Tensor] = {}

    @property
    def _registered(self) -> Path:
        return self.run_dir / "export" / "registry.json"

    def plan_run(self) -> RunPlan | None:
        """After the resume, what is left: None when the run finished and published before (started again, e.g. a
        requeue after its last step: nothing to do); else the current epoch's plan and the run's total steps.
        A finished run given a longer schedule trains on: its final evaluation and export are redone at the new
        end (kept, they would label the new weights with the old end's metrics). A finished run whose export did
        not complete publishes only (`_finish`)."""
        state, nothing_left = self.state, self.planner.nothing_left()
        if state.finished and not nothing_left:
            state.finished, state.final_metrics = False, None
        elif state.finished and self._registered.is_file():
            return None
        first = self.planner.plan(state.epoch)
        return RunPlan(first, *self.planner.total_steps(first))

    # ---------------------------------------------------------------- resume
    def _resume(self) -> None:
        mode = self.cfg.checkpoint.resume
        if mode == "never":
            return
        r = self.checkpointer.manager.resume(self.engine, None if mode == "auto" else mode)
        if r is None:
            return
        state, saved = self.state, TrainState.from_dict(r.state)
        old_micro = r.state.get("micro_per_step", saved.world_size * self.cfg.schedule.grad_accum)
        other_config = r.state.get("config_hash") != state.config_hash
        if other_config and self.rt.is_main:
            log.warning("resuming %s written with a different config (hash %s, now %s)", r.tag,
                        r.state.get("config_hash"), state.config_hash)
        state.restore(r.state)
        if mode != "auto" or other_config:
            # a chosen (older) tag or another config: the steps after it are a new timeline, not a replay of
            # what was logged, and are logged again
            self.tracker.new_timeline_after(saved.global_step)
        if old_micro != state.micro_per_step:
            # schedule.global_batch was changed for the resume: the position is kept in micro-batches, to the
            # step that holds it (any world size with the same global batch resumes exactly)
            state.step_in_epoch = saved.step_in_epoch * old_micro // state.micro_per_step
            if self.rt.is_main:
                log.warning("the global batch changed from %d to %d micro-batches: resuming at step %d of the epoch "
                            "(micro-batch %d; the checkpoint was at %d)", old_micro, state.micro_per_step,
                            state.step_in_epoch, state.step_in_epoch * state.micro_per_step,
                            saved.step_in_epoch * old_micro)
        self.validator.restore()
        self.checkpointer.last_saved = state.global_step   # this step's tag holds these weights
        if self.rt.is_main:
            log.info("resumed from %s at step %d (epoch %d, step %d of the epoch)", r.path,
                     state.global_step, state.epoch, state.step_in_epoch)

    # ---------------------------------------------------------------- one step
    def train_step(self, batches, window: Window) -> dict[str, torch.Tensor]:
        """One optimizer step: `grad_accum` micro-batches forward + backward, DeepSpeed steps (it applies
        the update on the last one). Returns the task's statistics, still on the device."""
        stats: dict[str, torch.Tensor] = {}
        clock = PhaseClock(window, self.rt.device, self.cfg.tracking.step_breakdown)
        for slot in range(self.cfg.schedule.grad_accum):
            t0 = time.perf_counter()
            item = next(batches).to(self.rt.device)
            wait = time.perf_counter() - t0
            # dropout by the micro-batch's index in the plan (BatchPlan.micro_batch), not by rank: the same
            # masks on any world size
            index = self.state.step_in_epoch * self.state.micro_per_step + slot * self.rt.world_size + self.rt.rank
            torch.manual_seed(micro_batch_seed(self.cfg.run.seed, self.state.epoch, index))
            clock.start()
            loss, item_stats = self.task.loss(self.engine, item)
            clock.lap("forward")
            self.engine.backward(loss)
            clock.lap("backward")
            self.engine.step()
            clock.lap("optimizer")
            window.add(item.real_tokens, item.flops, wait, item.collate_s)
            if clock.on:
                window.add_phase("data", wait)
            for k, v in item_stats.items():
                stats[k] = stats.get(k, 0.0) + v.detach()
        self.state.global_step += 1
        self.state.step_in_epoch += 1
        window.steps += 1
        return stats

    def _step(self, batches, window: Window, epoch: int) -> str:
        """One optimizer step, then the components that each own their cadence: the step log, the validator
        (evaluation, early stopping, model selection), the checkpointer and the preemption flag. Returns the
        run's status: "finished" (train on), "early_stopped" or "preempted"."""
        for k, v in self.train_step(batches, window).items():
            self.unlogged[k] = self.unlogged.get(k, 0.0) + v
        step, status = self.state.global_step, "finished"
        if step % self.cfg.schedule.log_every == 0:
            self._log_window(step, window, self.unlogged, epoch)
            self.unlogged = {}
        if self.validator.due(step) and self.validator.run(step):
            status = "early_stopped"
            self.state.early_stopped = True   # in every checkpoint from here: a resume does not train
        if self.checkpointer.due(step):
            self._save(step)
        if self.flag.agreed(self.rt.control_group):   # even at an early stop: the resume publishes (see fit)
            status = "preempted"
        return status

    def _save(self, step: int) -> None:
        """Collective. A checkpoint, with the statistics not yet logged (a save off the log_every cadence)."""
        self.state.train_window = gather_window(self.unlogged)
        self.checkpointer.save(step)

    def _log_window(self, step: int, window: Window, stats: dict[str, Any], epoch: int,
                    summed: bool = False) -> None:
        """Collective. `summed`: `stats` are already the totals over all ranks."""
        # this process trained in the window (a resume with nothing left to train logs the saved statistics
        # alone: rates, memory and gradient norm of a process that did not train would read as a drop)
        trained = window.steps > 0
        m = window.flush() if trained else {}
        totals = stats if summed else all_sum({k: float(v) for k, v in stats.items()}, self.rt.device)
        m.update(self.task.summarize(totals, "train_"))
        lrs = self.engine.get_lr()
        m["lr"] = lrs[0]
        if len(set(self.lr_names)) > 1:
            m.update({f"lr_{n}": lr for n, lr in zip(self.lr_names, lrs)})
        gn = self.engine.get_global_grad_norm() if trained else None
        if gn is not None:
            m["grad_norm"] = float(gn)
        if trained:
            m["peak_memory_gb"] = peak_memory_gb(self.rt.device)
        m["epoch"] = epoch
        self.tracker.metrics(m, step)
        self.last_metrics = m
        self.step_log.step(step, m)

    def _log_last_window(self, step: int, window: Window, stats: dict[str, torch.Tensor], epoch: int) -> None:
        """Collective. Log the statistics not yet logged when the run ends off the log_every cadence. Ranks can
        hold different keys (a resume on another world size restores the saved window on rank 0 alone), so
        every rank gathers them all and sums them itself."""
        pending = gather_window(stats)
        if not pending:
            return
        totals: dict[str, float] = {}
        for part in pending:
            for k, (v, _) in part.items():
                totals[k] = totals.get(k, 0.0) + v
        self._log_window(step, window, totals, epoch, summed=True)

    # ---------------------------------------------------------------- main loop
    def fit(self) -> TrainResult:
        if self.rt.is_main:
            save_resolved(self.cfg, self.run_dir)
        self._resume()
        run = self.plan_run()
        if run is None:
            return self._already_finished()
        self._start(run)
        window = Window(default_peak_tflops(self.rt.device, self.cfg.tracking.peak_tflops), self.rt.world_size)
        # the statistics of the steps since the last logged one, as the checkpoint kept them (a save off the
        # log_every cadence): the first window logged after a resume covers the same steps as without one
        self.unlogged = restore_window(self.state.train_window, self.rt.rank, self.rt.world_size, self.rt.device)
        # a run preempted at the step that stopped it early resumes stopped: it publishes, it does not train
        status = "early_stopped" if self.state.early_stopped else "finished"
        plan, epoch, it = run.first, self.state.epoch, None
        try:
            while status == "finished" and self.planner.steps_left():
                epoch = self.state.epoch
                plan = plan if plan is not None else self.planner.plan(epoch)
                self._close(it)
                it = self._batches(plan, epoch)
                for _ in range(self.state.step_in_epoch, plan.steps):
                    status = self._step(it, window, epoch)
                    if status != "finished" or self.planner.horizon_reached():
                        break
                else:  # the epoch ran to its end
                    self.state.epoch += 1
                    self.state.step_in_epoch = 0
                plan = None
            self._close(it)
            if status == "preempted":
                return self._preempted()
            return self._finish(status, window, epoch)
        except BaseException:
            self._close(it)
            self.tracker.end("FAILED")
            raise

    def _already_finished(self) -> TrainResult:
        """A finished run started again (e.g. a requeue after the last step): nothing left to do."""
        done = self._registered
        if self.rt.is_main:
            log.info("run already finished at step %d; export: %s", self.state.global_step, done.parent)
        left = self._send_outbox()  # what an outage left behind (metrics, the registration)
        version = json.loads(done.read_text()).get("version")
        return TrainResult("finished", self.state.global_step, done.parent, {}, version, left)

    def _start(self, run: RunPlan) -> None:
        """The step log's planned total, the banner, the tracking run (new, or a resumed run's again)."""
        cfg, rt = self.cfg, self.rt
        self.step_log.begin(run.total_steps, self.state.global_step)
        if rt.is_main:
            log.info("%s", banner(self.banner_facts(run)))
        tags = {"stage": cfg.run.stage, "task": self.task.name, "world_size": str(rt.world_size),
                "dataset_manifest": manifest_hash(cfg), "precision": rt.precision,
                "zero_stage": str(cfg.deepspeed.zero_stage)}
        self.state.mlflow_run_id = self.tracker.start(self.state.mlflow_run_id, tags) or self.state.mlflow_run_id

    def _batches(self, plan: BatchPlan, epoch: int):
        """This rank's micro-batches of the epoch, from the step the run is at."""
        s, rt = self.cfg.schedule, self.rt
        batches = plan.rank_batches(rt.rank, rt.world_size, s.grad_accum, self.state.step_in_epoch)
        return iter(make_loader(self.task, self.train_data, batches, epoch, self.cfg.data.num_workers_loader,
                                pin_memory=rt.device.type == "cuda"))

    def _preempted(self) -> TrainResult:
        """Collective. Checkpoint where the run is and stop, for the requeue to resume."""
        step = self.state.global_step
        self._save(step)
        if self.rt.is_main:
            log.warning("preempted by %s: checkpoint at step %d, exiting for requeue",
                        self.flag.signal_name or "a peer rank", step)
        self.tracker.end("KILLED")
        return TrainResult("preempted", step, None, self.validator.last)

    def _finish(self, status: str, window: Window, epoch: int) -> TrainResult:
        """Collective. The end: the last window, the final evaluation and checkpoint (marked finished), then
        export and registry."""
        state, step = self.state, self.state.global_step
        if state.finished and state.final_metrics is not None:
            # finished earlier, its export did not complete (a full disk): publish only — evaluating or
            # saving the final checkpoint again would re-count it among the best and rewrite a complete tag
            metrics = state.final_metrics
        else:
            # the steps since the last logged one (max_steps or an early stop off the log_every cadence)
            self._log_last_window(step, window, self.unlogged, epoch)
            metrics = self.validator.final(step)
            state.finished, state.final_metrics = True, metrics
            state.train_window = None  # logged above, not an earlier save's
            self.checkpointer.save(step, force=True)  # marks the run finished
        export_dir, version = publish(self.cfg, self.task, step, metrics, selection=self.validator,
                                      tracker=self.tracker, rt=self.rt, train_data=self.train_data,
                                      encoder_prefix=self.encoder_prefix)
        self.tracker.end()
        left = self._send_outbox()
        version = version or json.loads((export_dir / "registry.json").read_text()).get("version")
        return TrainResult(status, step, export_dir, metrics, version, left)

    def _send_outbox(self) -> int:
        """Rank 0, after the last collective: wait up to tracking.outage_wait_s for a server that went away to
        take what the run kept for it. Returns how many operations are still pending."""
        if not self.tracker.pending():
            return 0
        wait = self.cfg.tracking.outage_wait_s
        log.warning("%d tracking operation(s) wait in %s; waiting up to %.0f s for %s", self.tracker.pending(),
                    self.tracker.outbox.path, wait, redact_uri(self.tracker.uri))
        return self.tracker.sync(wait_s=wait)

    @staticmethod
    def _close(it) -> None:
        """Stop a DataLoader iterator's workers now (they ignore SIGTERM, so exit-time cleanup can't)."""
        shutdown = getattr(it, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()

    # ---------------------------------------------------------------- provenance
    def banner_facts(self, run: RunPlan) -> dict[str, Any]:
        cfg, rt, s, state = self.cfg, self.rt, self.cfg.schedule, self.state
        n_params = sum(p.numel() for p in self.model.parameters())
        n_train = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
        resume = (f"step {state.global_step} (epoch {state.epoch}, step {state.step_in_epoch} "
                  f"of the epoch)" if state.global_step else "fresh start")
        return {
            "run": f"{cfg.run.name} ({self.task.name}, stage {cfg.run.stage}) -> {self.run_dir}",
            "parameters": f"{n_params / 1e6:.2f}M ({n_train / 1e6:.2f}M trainable)",
            "world size": f"{rt.world_size} ({rt.device.type})",
            "ZeRO stage": cfg.deepspeed.zero_stage,
            "precision": rt.precision,
            "tokens per step": f"<= {s.batch_tokens * rt.world_size * s.grad_accum:,} "
                               f"({s.batch_tokens:,} x {rt.world_size} ranks x {s.grad_accum} accumulation: a global "
                               f"batch of {rt.world_size * s.grad_accum} micro-batches)",
            "total steps": f"{'' if run.exact else '~'}{run.total_steps} ({s.epochs} epochs, "
                           f"{run.first.steps} steps in epoch {state.epoch}'s plan"
                           f"{'' if run.exact else '; later epochs estimated from it'}"
                           f"{f', capped at max_steps {s.max_steps}' if s.max_steps else ''})",
            "data": f"{cfg.data.dataset_dir}: {len(self.train_data):,} train / "
                    f"{len(self.valid_data) if self.valid_data is not None else 0:,} valid documents, "
                    f"manifest {manifest_hash(cfg)}",
            "init": cfg.run.init or "random",
            "resume": resume,
            "checkpoints": f"{cfg.checkpoint_dir} every {cfg.checkpoint.every_steps or 'end-only'} steps, "
                           f"keep {cfg.checkpoint.keep_last}",
        }
