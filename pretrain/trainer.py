"""The one training loop: DeepSpeed engine, token-budget batches, checkpoints, preemption, evaluation,
MLflow metrics, export and registry. Pretraining and finetuning both run through `Trainer.fit`."""
from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hibert.config import Config, config_hash, save_resolved
from hibert.registry import register_artifact_dir
from pretrain.batching import BatchPlan, doc_costs, plan_epoch
from pretrain.checkpoint import CheckpointManager
from pretrain.engine import Runtime, build_engine
from pretrain.export import gather_fp32_state_dict, write_export
from safetensors.torch import load_file, save_file
from pretrain.loader import make_loader
from pretrain.metrics import Window, default_peak_tflops, peak_memory_gb
from pretrain.preemption import PreemptionFlag
from pretrain.task import Task
from pretrain.tracking import Tracker

log = logging.getLogger(__name__)


@dataclass
class TrainResult:
    status: str                        # finished | early_stopped | preempted
    step: int
    export_dir: Path | None
    metrics: dict[str, float]
    registered_version: str | None = None


def file_hash(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:16]


def _all_sum(values: dict[str, float], device: torch.device) -> dict[str, float]:
    keys = sorted(values)
    t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=device)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t)
    return dict(zip(keys, t.tolist()))


class Trainer:
    def __init__(self, cfg: Config, task: Task, rt: Runtime, train_data, valid_data, encoder_prefix: str = "encoder."):
        self.cfg, self.task, self.rt = cfg, task, rt
        self.train_data, self.valid_data = train_data, valid_data
        self.encoder_prefix = encoder_prefix
        self.run_dir = cfg.run_dir
        torch.manual_seed(cfg.run.seed)  # identical init on every rank
        self.model = task.build_model()
        self.engine = build_engine(cfg, self.model, rt)
        torch.manual_seed(cfg.run.seed + 7919 * (rt.rank + 1))  # dropout differs across ranks
        self.ckpt = CheckpointManager(cfg.checkpoint_dir, cfg.checkpoint.keep_last, rt.rank, rt.world_size)
        self.tracker = Tracker(cfg, enabled=rt.is_main)
        self.flag = PreemptionFlag().install()
        self.last_metrics: dict[str, float] = {}
        self.costs = doc_costs(train_data.doc_num_tokens, train_data.doc_num_sentences)
        self.state: dict[str, Any] = {"global_step": 0, "epoch": 0, "step_in_epoch": 0, "best": None,
                                      "evals_without_improvement": 0, "mlflow_run_id": None,
                                      "candidates": [],  # [score, step, path] of the best evaluations
                                      "seed": cfg.schedule.seed, "config_hash": config_hash(cfg),
                                      "world_size": rt.world_size,
                                      "micro_per_step": rt.world_size * cfg.schedule.grad_accum}

    # ---------------------------------------------------------------- planning
    def plan(self, epoch: int) -> BatchPlan:
        s = self.cfg.schedule
        return plan_epoch(self.costs, seed=s.seed, epoch=epoch, batch_tokens=s.batch_tokens,
                          max_docs=s.max_docs_per_batch, world=self.rt.world_size, accum=s.grad_accum)

    def _max_steps(self) -> int | None:
        return self.cfg.schedule.max_steps

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
        new_micro = self.rt.world_size * s.grad_accum
        if old_micro != new_micro:  # keep the position in the data stream, counted in micro-batches
            self.state["step_in_epoch"] = r.state["step_in_epoch"] * old_micro // new_micro
        if self.rt.is_main:
            log.info("resumed from %s at step %d (epoch %d, step %d of the epoch)", r.path,
                     self.state["global_step"], self.state["epoch"], self.state["step_in_epoch"])

    # ---------------------------------------------------------------- evaluation
    def valid_items(self, data=None):
        """Yield (item, counted) over this rank's share of a split's batches (default: validation).

        ZeRO-3's forward is collective, so every rank runs the same number of forwards; the padding
        forwards (repeats of a real batch) come with counted=False and must be ignored.
        """
        data = self.valid_data if data is None else data
        s = self.cfg.schedule
        costs = doc_costs(data.doc_num_tokens, data.doc_num_sentences)
        plan = plan_epoch(costs, seed=s.seed, epoch=0, batch_tokens=s.batch_tokens,
                          max_docs=s.max_docs_per_batch, world=1, accum=1)
        batches = plan.batches[: s.eval_batches] if s.eval_batches else plan.batches
        W, r = self.rt.world_size, self.rt.rank
        mine = batches[r::W]
        padded = mine + [batches[0]] * (-(-len(batches) // W) - len(mine))
        self.engine.eval()
        try:
            with torch.no_grad():
                for i, item in enumerate(make_loader(self.task, data, padded, 0, 0)):
                    yield item.to(self.rt.device), i < len(mine)
        finally:
            self.engine.train()

    def all_sum(self, values: dict[str, float]) -> dict[str, float]:
        return _all_sum(values, self.rt.device)

    def evaluate(self) -> dict[str, float]:
        if self.valid_data is None or len(self.valid_data) == 0:
            return {}
        return self.task.evaluate(self)

    # ---------------------------------------------------------------- main loop
    def fit(self) -> TrainResult:
        cfg, rt, s = self.cfg, self.rt, self.cfg.schedule
        if rt.is_main:
            save_resolved(cfg, self.run_dir)
        self._resume()
        done = self.run_dir / "export" / "registry.json"
        max_steps = self._max_steps()
        nothing_left = (max_steps and self.state["global_step"] >= max_steps) or self.state["epoch"] >= s.epochs
        if self.state.get("finished") and nothing_left and done.is_file():
            # A finished run started again (e.g. a requeue after the last step): nothing left to do.
            if rt.is_main:
                log.info("run already finished at step %d; export: %s", self.state["global_step"], done.parent)
            version = json.loads(done.read_text()).get("version")
            return TrainResult("finished", self.state["global_step"], done.parent, {}, version)
        tags = {"stage": cfg.run.stage, "task": self.task.name, "world_size": str(rt.world_size),
                "dataset_manifest": self.manifest_hash(), "precision": rt.precision,
                "zero_stage": str(cfg.deepspeed.zero_stage)}
        self.state["mlflow_run_id"] = self.tracker.start(self.state["mlflow_run_id"], tags) or self.state["mlflow_run_id"]
        window = Window(default_peak_tflops(rt.device, cfg.tracking.peak_tflops), rt.world_size)
        status, last_eval, last_saved = "finished", {}, -1
        it = None
        train_stats: dict[str, float] = {}
        try:
            while self.state["epoch"] < s.epochs:
                epoch = self.state["epoch"]
                plan = self.plan(epoch)
                start = self.state["step_in_epoch"]
                mine = plan.rank_batches(rt.rank, rt.world_size, s.grad_accum, start)
                self._close(it)
                it = iter(make_loader(self.task, self.train_data, mine, epoch, cfg.data.num_workers_loader))
                for _ in range(start, plan.steps):
                    for _a in range(s.grad_accum):
                        t0 = time.perf_counter()
                        item = next(it).to(rt.device)
                        wait = time.perf_counter() - t0
                        loss, stats = self.task.loss(self.engine, item)
                        self.engine.backward(loss)
                        self.engine.step()
                        window.add(item.real_tokens, item.flops, wait)
                        for k, v in stats.items():  # stays on device: no sync until the log step
                            train_stats[k] = train_stats.get(k, 0.0) + v.detach()
                    self.state["global_step"] += 1
                    self.state["step_in_epoch"] += 1
                    window.steps += 1
                    step = self.state["global_step"]
                    if step % s.log_every == 0:
                        m = window.flush()
                        totals = _all_sum({k: float(v) for k, v in train_stats.items()}, rt.device)
                        m.update(self.task.summarize(totals, "train_"))
                        m["lr"] = self.engine.get_lr()[0]
                        gn = self.engine.get_global_grad_norm()
                        if gn is not None:
                            m["grad_norm"] = float(gn)
                        m["peak_memory_gb"] = peak_memory_gb(rt.device)
                        m["epoch"] = epoch
                        self.tracker.metrics(m, step)
                        self.last_metrics = m
                        if rt.is_main:
                            log.info("step %d %s", step, " ".join(f"{k}={v:.4g}" for k, v in sorted(m.items())))
                        train_stats = {}
                    if s.eval_every and step % s.eval_every == 0:
                        last_eval = self.evaluate()
                        self.tracker.metrics(last_eval, step)
                        if rt.is_main and last_eval:
                            log.info("step %d %s", step, " ".join(f"{k}={v:.4g}" for k, v in sorted(last_eval.items())))
                        if self._early_stop(last_eval):
                            status = "early_stopped"
                        self._keep_if_best(last_eval, step)
                    if cfg.checkpoint.every_steps and step % cfg.checkpoint.every_steps == 0:
                        self.ckpt.save(self.engine, step, self.state)
                        last_saved = step
                    if self.flag.agreed(rt.device):
                        status = "preempted"
                    if status != "finished" or (self._max_steps() and step >= self._max_steps()):
                        break
                if status != "finished" or (self._max_steps() and self.state["global_step"] >= self._max_steps()):
                    break
                self.state["epoch"] += 1
                self.state["step_in_epoch"] = 0
            self._close(it)
            step = self.state["global_step"]
            if status == "preempted":
                if last_saved != step:
                    self.ckpt.save(self.engine, step, self.state)
                if rt.is_main:
                    log.warning("preempted by %s: checkpoint at step %d, exiting for requeue",
                                self.flag.signal_name or "a peer rank", step)
                self.tracker.end("KILLED")
                return TrainResult(status, step, None, last_eval)
            if not last_eval or (s.eval_every and step % s.eval_every):
                last_eval = self.evaluate()
                self.tracker.metrics(last_eval, step)
                self._keep_if_best(last_eval, step)
            self.state["finished"] = True
            self.ckpt.save(self.engine, step, self.state)  # marks the run finished for any restart
            export_dir, version = self.export(step, last_eval)
            self.tracker.end()
            return TrainResult(status, step, export_dir, last_eval, version)
        except BaseException:
            self._close(it)
            self.tracker.end("FAILED")
            raise

    @staticmethod
    def _close(it) -> None:
        """Stop a DataLoader iterator's workers now (they ignore SIGTERM, so exit-time cleanup can't)."""
        shutdown = getattr(it, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()

    def _early_stop(self, metrics: dict[str, float]) -> bool:
        key, patience = self.task.eval_metric, self.cfg.schedule.early_stop_patience
        if key not in metrics:
            return False
        v, best = metrics[key], self.state["best"]
        better = best is None or (v < best if self.task.eval_mode == "min" else v > best)
        if better:
            self.state["best"], self.state["evals_without_improvement"] = v, 0
            return False
        self.state["evals_without_improvement"] += 1
        return patience is not None and self.state["evals_without_improvement"] >= patience

    # ---------------------------------------------------------------- export + registry
    def data_settings(self) -> dict[str, Any]:
        """How the training data was made (segmenter, limits, tokenizer): `summarize` redoes exactly this."""
        m = Path(self.cfg.data.dataset_dir) / "manifest.json"
        if not m.is_file():
            return {}
        manifest = json.loads(m.read_text())
        return {k: manifest[k] for k in ("segmenter", "limits", "tokenizer") if k in manifest}

    def manifest_hash(self) -> str:
        m = Path(self.cfg.data.dataset_dir) / "manifest.json"
        return file_hash(m) if m.is_file() else "none"

    def _keep_if_best(self, metrics: dict[str, float], step: int) -> None:
        """Collective. Save full fp32 weights when this evaluation is among the best `keep_best`."""
        n, key = self.cfg.checkpoint.keep_best, self.task.eval_metric
        if n <= 0 or key not in metrics:
            return
        sign = 1.0 if self.task.eval_mode == "max" else -1.0
        cands = self.state["candidates"]
        ranked = sorted(cands, key=lambda c: -sign * c[0])
        if len(ranked) >= n and sign * metrics[key] <= sign * ranked[n - 1][0]:
            return
        full = gather_fp32_state_dict(self.engine.module, "")
        path = self.run_dir / "best" / f"step_{step:09d}.safetensors"
        if self.rt.is_main:
            path.parent.mkdir(parents=True, exist_ok=True)
            save_file({k: v.contiguous() for k, v in full.items()}, str(path))
        ranked = sorted(cands + [[metrics[key], step, str(path)]], key=lambda c: -sign * c[0])
        for _, _, old in ranked[n:]:
            if self.rt.is_main:
                Path(old).unlink(missing_ok=True)
        self.state["candidates"] = ranked[:n]
        if dist.is_initialized():
            dist.barrier()

    def _selected_weights(self) -> tuple[dict[str, torch.Tensor], list[int]]:
        """Collective. The average of the kept best weights, or the current weights when none were kept."""
        cands = [c for c in self.state["candidates"] if Path(c[2]).is_file()]
        if not cands:
            return gather_fp32_state_dict(self.engine.module, ""), []
        if dist.is_initialized():
            dist.barrier()
        if not self.rt.is_main:
            return {}, [c[1] for c in cands]
        states = [load_file(c[2]) for c in cands]
        avg = {k: sum(st[k] for st in states) / len(states) for k in states[0]}
        return avg, [c[1] for c in cands]

    def export(self, step: int, metrics: dict[str, float]) -> tuple[Path, str | None]:
        full, steps = self._selected_weights()
        out = self.run_dir / "export"
        version = None
        if self.rt.is_main:
            from pretrain.tracking import git_commit

            p = self.encoder_prefix
            encoder = {k[len(p):]: v for k, v in full.items() if k.startswith(p)}
            meta = {"stage": self.cfg.run.stage, "task": self.task.name, "step": step,
                    "selected_steps": steps, "selection_metric": self.task.eval_metric,
                    "init": self.cfg.run.init, "dataset_manifest": self.manifest_hash(),
                    "config_hash": config_hash(self.cfg), "git_commit": git_commit(),
                    "world_size": self.rt.world_size, "metrics": metrics,
                    "mlflow_run_id": self.tracker.run_id, "data": self.data_settings()}
            write_export(out, encoder, self.task.model_config(), self.train_data.tokenizer_path, meta)
            self.task.write_export_extras(out, full)
            self.tracker.artifacts(out, "export")
            if self.cfg.tracking.register_model and self.tracker.run_id:
                alias = self.task.registry_alias(self.cfg)
                version = register_artifact_dir(
                    self.tracker.uri, self.tracker.run_id, "export", self.task.registry_name(self.cfg), alias,
                    tags={"stage": self.cfg.run.stage, "dataset_manifest": meta["dataset_manifest"],
                          "git_commit": meta["git_commit"], "world_size": str(self.rt.world_size),
                          "step": str(step)})
                log.info("registered %s version %s (alias %s)", self.task.registry_name(self.cfg), version, alias)
            (out / "registry.json").write_text(json.dumps({"version": version, "uri": self.tracker.uri}))
        if dist.is_initialized():
            dist.barrier()
        return out, version
