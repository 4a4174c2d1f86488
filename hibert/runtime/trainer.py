"""The one training loop. `Trainer.fit` reads top to bottom: resume, banner, then per step `train_step`
followed by the components that each own their cadence — the step log (`schedule.log_every`), the
validator (`schedule.eval_every`: evaluation, early stopping, model selection), the checkpointer
(`checkpoint.every_steps`) and the preemption flag — and at the end `publish` (export + registry).
Pretraining and every finetuning head run through it with their own `Task`."""
from __future__ import annotations

import json
import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hibert.config import Config, config_hash, save_resolved
from hibert.hashing import file_hash
from hibert.redact import redact_uri
from hibert.runtime.batching import BatchPlan, doc_costs, plan_epoch
from hibert.runtime.checkpoint import CheckpointManager
from hibert.runtime.engine import Runtime, build_engine
from hibert.runtime.loader import make_loader
from hibert.runtime.metrics import PhaseClock, Window, default_peak_tflops, peak_memory_gb
from hibert.runtime.preemption import preemption_flag
from hibert.runtime.publish import publish
from hibert.runtime.step_log import StepLog, banner
from hibert.runtime.task import Task
from hibert.runtime.tracking import Tracker
from hibert.runtime.validation import Validator

log = logging.getLogger("hibert.train")

# The planned total counts every later epoch's batches exactly up to this many documents x epochs to plan
# (~1 s of start-up on one core); a Gigaword-sized run estimates the later epochs from the current one instead.
_EXACT_PLAN_DOCS = 2_000_000


@dataclass
class TrainResult:
    status: str                        # finished | early_stopped | preempted
    step: int
    export_dir: Path | None
    metrics: dict[str, float]
    registered_version: str | None = None
    tracking_pending: int = 0          # operations left in the run's outbox (tracking server away)



def _gather_window(stats: dict[str, torch.Tensor]) -> list[dict[str, list]] | None:
    """Collective. Every rank's training statistics since the last logged step, as [value, dtype] per key, rank
    by rank: what a checkpoint keeps so that a resumed run logs the same window an uninterrupted one would
    (None when nothing is pending, i.e. the step was a logged one)."""
    mine = {k: [float(v), str(v.dtype).removeprefix("torch.")] for k, v in stats.items()}
    every = [mine]
    if dist.is_initialized() and dist.get_world_size() > 1:
        every = [None] * dist.get_world_size()
        dist.all_gather_object(every, mine)
    return every if any(every) else None


def _restore_window(saved: list[dict[str, list]] | None, rank: int, world: int,
                    device: torch.device) -> dict[str, torch.Tensor]:
    """This rank's pending statistics from `_gather_window`'s record: its own when the world size is the one
    they were saved with (the sums then go on bit for bit), else all of them on rank 0 (the logged totals
    are the same up to rounding)."""
    if not saved:
        return {}
    if len(saved) == world:
        mine = saved[rank]
    elif rank == 0:
        mine = {}
        for part in saved:
            for k, (v, dtype) in part.items():
                mine[k] = [mine.get(k, [0.0])[0] + v, dtype]
    else:
        return {}
    return {k: torch.tensor(v, dtype=getattr(torch, dtype), device=device) for k, (v, dtype) in mine.items()}


def _all_sum(values: dict[str, float], device: torch.device) -> dict[str, float]:
    keys = sorted(values)
    t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=device)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t)
    return dict(zip(keys, t.tolist()))


class Checkpointer:
    """Saves every `every` steps (0: only at the end and on preemption), never twice for one step."""

    def __init__(self, manager: CheckpointManager, every: int):
        self.manager, self.every, self.last_saved = manager, every, -1

    def due(self, step: int) -> bool:
        """A scheduled save at this step (the caller completes the state first, then calls `save`)."""
        return bool(self.every) and step % self.every == 0 and self.last_saved != step

    def save(self, engine, step: int, state: dict[str, Any], force: bool = False) -> None:
        """`force`: save even if this step's tag was written (or resumed from): then its weights are these, and
        only the state in its marker is replaced, atomically — rewriting the tag would leave a moment without
        it, and with keep_last 1 without any checkpoint."""
        if self.last_saved == step:
            if not force or self.manager.restate(step, state):
                return
            # forced, and the tag no longer verifies: written again below
        self.manager.save(engine, step, state)
        self.last_saved = step


class Trainer:
    def __init__(self, cfg: Config, task: Task, rt: Runtime, train_data, valid_data, encoder_prefix: str = "encoder."):
        self.cfg, self.task, self.rt = cfg, task, rt
        self.train_data, self.valid_data = train_data, valid_data
        self.encoder_prefix = encoder_prefix
        self.run_dir = cfg.run_dir
        torch.manual_seed(cfg.run.seed)  # identical init on every rank
        self.model = task.build_model()
        groups = [g for g in task.param_groups(self.model, cfg) if g.params]
        self.engine = build_engine(cfg, self.model, rt, groups)
        # groups with their own lr (e.g. encoder / decoder): one lr_<prefix> metric each
        self.lr_names = [g.name.split(".")[0] for g in groups]
        torch.manual_seed(cfg.run.seed + 7919 * (rt.rank + 1))  # dropout differs across ranks
        self.checkpointer = Checkpointer(
            CheckpointManager(cfg.checkpoint_dir, cfg.checkpoint.keep_last, rt.rank, rt.world_size),
            cfg.checkpoint.every_steps)
        self.tracker = Tracker(cfg, enabled=rt.is_main)
        self.flag = preemption_flag()   # installed by prepare_run already, before the start-up
        s = cfg.schedule
        self.validator = Validator(self, s.eval_every, s.early_stop_patience, cfg.checkpoint.keep_best)
        self.step_log = StepLog(0, 0, rt.is_main)
        self.last_metrics: dict[str, float] = {}
        self.costs = doc_costs(train_data.doc_num_tokens, train_data.doc_num_sentences)
        self.state: dict[str, Any] = {"global_step": 0, "epoch": 0, "step_in_epoch": 0, "best": None,
                                      "evals_without_improvement": 0, "mlflow_run_id": None,
                                      "candidates": [],  # [score, step, path, metrics] of the best evaluations
                                      "seed": s.seed, "config_hash": config_hash(cfg),
                                      "world_size": rt.world_size,
                                      "micro_per_step": rt.world_size * s.grad_accum}

    @property
    def ckpt(self) -> CheckpointManager:
        return self.checkpointer.manager

    # ---------------------------------------------------------------- planning
    def plan(self, epoch: int) -> BatchPlan:
        s = self.cfg.schedule
        return plan_epoch(self.costs, seed=s.seed, epoch=epoch, batch_tokens=s.batch_tokens,
                          max_docs=s.max_docs_per_batch, world=self.rt.world_size, accum=s.grad_accum)

    def _max_steps(self) -> int | None:
        return self.cfg.schedule.max_steps

    def total_steps(self, plan: BatchPlan) -> tuple[int, bool]:
        """(optimizer steps the whole run will take, whether that count is exact), capped by max_steps.

        Epochs differ in length: each plans its own shuffle into token-budget batches. The count is exact
        when the later epochs are cheap to plan (they are deterministic: seed and epoch) — at most
        `_EXACT_PLAN_DOCS` documents x epochs left; beyond that, this epoch's length stands for the rest."""
        s, m = self.cfg.schedule, self._max_steps()
        this_epoch = self.state["global_step"] + max(0, plan.steps - self.state["step_in_epoch"])
        if m and this_epoch >= m:
            return m, True
        epoch, left = self.state["epoch"], max(0, s.epochs - self.state["epoch"] - 1)
        exact = len(self.costs) * left <= _EXACT_PLAN_DOCS
        later = sum(self.plan(e).steps for e in range(epoch + 1, s.epochs)) if exact else plan.steps * left
        return (min(this_epoch + later, m) if m else this_epoch + later), exact

    def _horizon_reached(self) -> bool:
        m = self._max_steps()
        return bool(m) and self.state["global_step"] >= m

    # ---------------------------------------------------------------- resume
    def _resume(self) -> None:
        mode = self.cfg.checkpoint.resume
        if mode == "never":
            return
        r = self.ckpt.resume(self.engine, None if mode == "auto" else mode)
        if r is None:
            return
        s = self.cfg.schedule
        old_micro = r.state.get("micro_per_step", r.state.get("world_size", 1) * s.grad_accum)
        if r.state.get("config_hash") != self.state["config_hash"] and self.rt.is_main:
            log.warning("resuming %s written with a different config (hash %s, now %s)", r.tag,
                        r.state.get("config_hash"), self.state["config_hash"])
        keep = ("config_hash", "world_size", "micro_per_step")
        self.state.update({k: v for k, v in r.state.items() if k not in keep})
        if mode != "auto" or r.state.get("config_hash") != self.state["config_hash"]:
            # a chosen (older) tag or another config: the steps after it are a new timeline, not a replay of
            # what was logged, and are logged again
            self.tracker.new_timeline_after(r.state["global_step"])
        new_micro = self.rt.world_size * s.grad_accum
        if old_micro != new_micro:  # keep the position in the data stream, counted in micro-batches
            self.state["step_in_epoch"] = r.state["step_in_epoch"] * old_micro // new_micro
        self.validator.restore()
        self.checkpointer.last_saved = self.state["global_step"]   # this step's tag holds these weights
        if self.rt.is_main:
            log.info("resumed from %s at step %d (epoch %d, step %d of the epoch)", r.path,
                     self.state["global_step"], self.state["epoch"], self.state["step_in_epoch"])

    # ---------------------------------------------------------------- evaluation
    def valid_items(self, data=None, desc: str = "eval"):
        """Yield (item, counted) over this rank's share of a split's batches (default: validation).

        ZeRO-3's forward is collective, so every rank runs the same number of forwards; the padding
        forwards (repeats of a real batch) come with counted=False and must be ignored.
        """
        from tqdm import tqdm

        data = self.valid_data if data is None else data
        s = self.cfg.schedule
        costs = doc_costs(data.doc_num_tokens, data.doc_num_sentences)
        plan = plan_epoch(costs, seed=s.seed, epoch=0, batch_tokens=s.batch_tokens,
                          max_docs=s.max_docs_per_batch, world=1, accum=1)
        batches = plan.batches[: s.eval_batches] if s.eval_batches else plan.batches
        W, r = self.rt.world_size, self.rt.rank
        mine = batches[r::W]
        padded = mine + [batches[0]] * (-(-len(batches) // W) - len(mine))
        tty = sys.stderr.isatty()  # in a log file: a line every 30 s and a closing line, each ending in \n
        bar = tqdm(total=len(padded), desc=desc, unit="batch", leave=not tty, disable=not self.rt.is_main,
                   mininterval=0.5 if tty else 30.0, ascii=not tty)
        self.engine.eval()
        try:
            with torch.no_grad():
                for i, item in enumerate(make_loader(self.task, data, padded, 0, 0)):
                    yield item.to(self.rt.device), i < len(mine)
                    bar.update()
        finally:
            bar.close()
            self.engine.train()

    def all_sum(self, values: dict[str, float]) -> dict[str, float]:
        return _all_sum(values, self.rt.device)

    def evaluate(self) -> dict[str, float]:
        if self.valid_data is None or len(self.valid_data) == 0:
            return {}
        return self.task.evaluate(self)

    # ---------------------------------------------------------------- one step
    def train_step(self, batches, window: Window) -> dict[str, torch.Tensor]:
        """One optimizer step: `grad_accum` micro-batches forward + backward, DeepSpeed steps (it applies
        the update on the last one). Returns the task's statistics, still on the device."""
        stats: dict[str, torch.Tensor] = {}
        clock = PhaseClock(window, self.rt.device, self.cfg.tracking.step_breakdown)
        for _ in range(self.cfg.schedule.grad_accum):
            t0 = time.perf_counter()
            item = next(batches).to(self.rt.device)
            wait = time.perf_counter() - t0
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
        self.state["global_step"] += 1
        self.state["step_in_epoch"] += 1
        window.steps += 1
        return stats

    def _log_window(self, step: int, window: Window, stats: dict[str, Any], epoch: int,
                    summed: bool = False) -> None:
        """Collective. `summed`: `stats` are already the totals over all ranks."""
        # this process trained in the window (a resume with nothing left to train logs the saved statistics
        # alone: rates, memory and gradient norm of a process that did not train would read as a drop)
        trained = window.steps > 0
        m = window.flush() if trained else {}
        totals = stats if summed else _all_sum({k: float(v) for k, v in stats.items()}, self.rt.device)
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
        pending = _gather_window(stats)
        if not pending:
            return
        totals: dict[str, float] = {}
        for part in pending:
            for k, (v, _) in part.items():
                totals[k] = totals.get(k, 0.0) + v
        self._log_window(step, window, totals, epoch, summed=True)

    # ---------------------------------------------------------------- main loop
    def fit(self) -> TrainResult:
        cfg, rt, s = self.cfg, self.rt, self.cfg.schedule
        if rt.is_main:
            save_resolved(cfg, self.run_dir)
        self._resume()
        done = self.run_dir / "export" / "registry.json"
        # an early-stopped run has nothing left either: started again (a requeue), it must not train past its stop
        nothing_left = self._horizon_reached() or self.state["epoch"] >= s.epochs or self.state.get("early_stopped")
        if self.state.get("finished") and not nothing_left:
            # a run that stopped at max_steps on the last step of its last epoch has no step left either (its epoch
            # counter was not advanced): a longer max_steps does not make it train, evaluate or register again
            last = self.state["epoch"] == s.epochs - 1
            nothing_left = last and self.state["step_in_epoch"] >= self.plan(self.state["epoch"]).steps
        if self.state.get("finished") and not nothing_left:
            # a finished run given a longer schedule trains on: its final evaluation and export are redone at the
            # new end (kept, they would label the new weights with the old end's metrics)
            self.state.pop("finished")
            self.state.pop("final_metrics", None)
        if self.state.get("finished") and nothing_left and done.is_file():
            # A finished run started again (e.g. a requeue after the last step): nothing left to do.
            if rt.is_main:
                log.info("run already finished at step %d; export: %s", self.state["global_step"], done.parent)
            left = self._send_outbox()  # what an outage left behind (metrics, the registration)
            version = json.loads(done.read_text()).get("version")
            return TrainResult("finished", self.state["global_step"], done.parent, {}, version, left)
        first_plan = self.plan(self.state["epoch"])
        total, self.total_exact = self.total_steps(first_plan)
        self.step_log = StepLog(total, self.state["global_step"], rt.is_main)
        if rt.is_main:
            log.info("%s", banner(self.banner_facts(first_plan)))
        tags = {"stage": cfg.run.stage, "task": self.task.name, "world_size": str(rt.world_size),
                "dataset_manifest": self.manifest_hash(), "precision": rt.precision,
                "zero_stage": str(cfg.deepspeed.zero_stage)}
        self.state["mlflow_run_id"] = self.tracker.start(self.state["mlflow_run_id"], tags) or self.state["mlflow_run_id"]
        window = Window(default_peak_tflops(rt.device, cfg.tracking.peak_tflops), rt.world_size)
        # a run preempted at the step that stopped it early resumes stopped: it publishes, it does not train
        status, it = "early_stopped" if self.state.get("early_stopped") else "finished", None
        # the statistics of the steps since the last logged one, as the checkpoint kept them (a save off the
        # log_every cadence): the first window logged after a resume covers the same steps as without one
        train_stats = _restore_window(self.state.get("train_window"), rt.rank, rt.world_size, rt.device)
        plan, epoch = first_plan, self.state["epoch"]
        try:
            while self.state["epoch"] < s.epochs and status == "finished" and not self._horizon_reached():
                epoch = self.state["epoch"]
                plan = plan if plan is not None else self.plan(epoch)
                start = self.state["step_in_epoch"]
                self._close(it)
                it = iter(make_loader(self.task, self.train_data, plan.rank_batches(rt.rank, rt.world_size,
                          s.grad_accum, start), epoch, cfg.data.num_workers_loader,
                          pin_memory=rt.device.type == "cuda"))
                for _ in range(start, plan.steps):
                    for k, v in self.train_step(it, window).items():
                        train_stats[k] = train_stats.get(k, 0.0) + v
                    step = self.state["global_step"]
                    if step % s.log_every == 0:
                        self._log_window(step, window, train_stats, epoch)
                        train_stats = {}
                    if self.validator.due(step) and self.validator.run(step):
                        status = "early_stopped"
                        self.state["early_stopped"] = True   # in every checkpoint from here: a resume does not train
                    if self.checkpointer.due(step):
                        self.state["train_window"] = _gather_window(train_stats)
                        self.checkpointer.save(self.engine, step, self.state)
                    if self.flag.agreed(rt.device):   # even at an early stop: the resume publishes (see above)
                        status = "preempted"
                    if status != "finished" or self._horizon_reached():
                        break
                else:  # the epoch ran to its end
                    self.state["epoch"] += 1
                    self.state["step_in_epoch"] = 0
                plan = None
            self._close(it)
            step = self.state["global_step"]
            if status == "preempted":
                self.state["train_window"] = _gather_window(train_stats)
                self.checkpointer.save(self.engine, step, self.state)
                if rt.is_main:
                    log.warning("preempted by %s: checkpoint at step %d, exiting for requeue",
                                self.flag.signal_name or "a peer rank", step)
                self.tracker.end("KILLED")
                return TrainResult(status, step, None, self.validator.last)
            if self.state.get("finished") and "final_metrics" in self.state:
                # finished earlier, its export did not complete (a full disk): publish only — evaluating or
                # saving the final checkpoint again would re-count it among the best and rewrite a complete tag
                metrics = self.state["final_metrics"]
            else:
                # the steps since the last logged one (max_steps or an early stop off the log_every cadence)
                self._log_last_window(step, window, train_stats, epoch)
                metrics = self.validator.final(step)
                self.state["finished"], self.state["final_metrics"] = True, metrics
                self.state["train_window"] = None  # logged above, not an earlier save's
                self.checkpointer.save(self.engine, step, self.state, force=True)  # marks the run finished
            export_dir, version = publish(self, step, metrics)
            self.tracker.end()
            left = self._send_outbox()
            version = version or json.loads((export_dir / "registry.json").read_text()).get("version")
            return TrainResult(status, step, export_dir, metrics, version, left)
        except BaseException:
            self._close(it)
            self.tracker.end("FAILED")
            raise

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
    def banner_facts(self, plan: BatchPlan) -> dict[str, Any]:
        cfg, rt, s = self.cfg, self.rt, self.cfg.schedule
        n_params = sum(p.numel() for p in self.model.parameters())
        n_train = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
        resume = (f"step {self.state['global_step']} (epoch {self.state['epoch']}, step {self.state['step_in_epoch']} "
                  f"of the epoch)" if self.state["global_step"] else "fresh start")
        manifest = Path(cfg.data.dataset_dir) / "manifest.json"
        return {
            "run": f"{cfg.run.name} ({self.task.name}, stage {cfg.run.stage}) -> {self.run_dir}",
            "parameters": f"{n_params / 1e6:.2f}M ({n_train / 1e6:.2f}M trainable)",
            "world size": f"{rt.world_size} ({rt.device.type})",
            "ZeRO stage": cfg.deepspeed.zero_stage,
            "precision": rt.precision,
            "tokens per step": f"<= {s.batch_tokens * rt.world_size * s.grad_accum:,} "
                               f"({s.batch_tokens:,} x {rt.world_size} ranks x {s.grad_accum} accumulation)",
            "total steps": f"{'' if self.total_exact else '~'}{self.step_log.total} ({s.epochs} epochs, "
                           f"{plan.steps} steps in epoch {self.state['epoch']}'s plan"
                           f"{'' if self.total_exact else '; later epochs estimated from it'}"
                           f"{f', capped at max_steps {s.max_steps}' if s.max_steps else ''})",
            "data": f"{cfg.data.dataset_dir}: {len(self.train_data):,} train / "
                    f"{len(self.valid_data) if self.valid_data is not None else 0:,} valid documents, "
                    f"manifest {self.manifest_hash() if manifest.is_file() else 'none'}",
            "init": cfg.run.init or "random",
            "resume": resume,
            "checkpoints": f"{cfg.checkpoint_dir} every {cfg.checkpoint.every_steps or 'end-only'} steps, "
                           f"keep {cfg.checkpoint.keep_last}",
        }

    def data_settings(self) -> dict[str, Any]:
        """How the training data was made (segmenter, limits, tokenizer): `summarize` redoes exactly this."""
        m = Path(self.cfg.data.dataset_dir) / "manifest.json"
        if not m.is_file():
            return {}
        manifest = json.loads(m.read_text())
        return {k: manifest[k] for k in ("segmenter", "limits", "tokenizer", "kind", "clusters", "synthetic")
                if k in manifest}

    def manifest_hash(self) -> str:
        m = Path(self.cfg.data.dataset_dir) / "manifest.json"
        return file_hash(m) if m.is_file() else "none"
