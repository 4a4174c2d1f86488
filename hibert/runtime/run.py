"""The runtime API every training command builds on (pretraining, extractive, abstractive, multi-document).

A task is a `Task` (hibert/runtime/task.py: model, micro-batches, loss, metrics, export extras, optimizer
groups) plus a few lines of command code (pretrain/cli.py; finetune/cli.py gets the task from the head registry):

    inputs = prepare_run(cfg)                 # ranks, logging, train/valid data, run.init resolved + checked
    task = MyTask(cfg, inputs.model_cfg)      # the model it builds: the init encoder's size, or the configured one
    return run_task(cfg, inputs, task, "finetune")   # Trainer.fit(); exit code 75 when preempted

A task never sees `run.init`'s weights: the Trainer loads them into the model `Task.build_model` made
(`Task.init_from`: the encoder; a task that takes more of the export overrides it).

`relaunch(cfg, command, nproc)` starts the same command on N local ranks (`--nproc`). Everything else —
DeepSpeed engine, token-budget batches, checkpoints and exact resume, preemption, evaluation cadence,
model selection, MLflow, export and registry — is the `Trainer`'s, identical for every task.
"""
from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch.distributed as dist

from hibert.config import Config
from hibert.config.model import ModelConfig
from hibert.data_prep import DocumentDataset
from hibert.data_prep.tokenizer import vocab_size
from hibert.errors import DiskFull, UserError, disk_full, free_mb
from hibert.hashing import file_hash
from hibert.logs import setup_logging
from hibert.redact import redact_uri
from hibert.registry import check_reachable, check_store_location, resolve_model, tracking_uri
from hibert.runtime.dist_env import REQUEUE_EXIT_CODE, TRACKING_PENDING_EXIT_CODE
from hibert.runtime.engine import init_distributed
from hibert.runtime.export import InitModel, read_export
from hibert.runtime.global_batch import resolve_global_batch, saved_global_batch
from hibert.runtime.launch import relaunch
from hibert.runtime.outbox import OUTBOX
from hibert.runtime.preemption import preemption_flag
from hibert.runtime.publish import NothingTrained, PeerFailed
from hibert.runtime.task import LoaderItem, ParamGroup, Task
from hibert.runtime.trainer import Trainer
from hibert.runtime.writer_lock import claim_run_dir

__all__ = ["InitModel", "LoaderItem", "ParamGroup", "RunInputs", "Task", "prepare_run", "relaunch", "run_task",
           "load_init", "check_init_compatible"]

log = logging.getLogger("hibert")


@dataclass
class RunInputs:
    """What every training command sets up the same way before building its task."""
    rt: Any                          # hibert.runtime.engine.Runtime
    train: Any                       # data_prep.DocumentDataset
    valid: Any
    init: InitModel | None           # the Trainer loads it into the model (Task.init_from)
    vocab_size: int
    model_cfg: ModelConfig           # the model a head builds (`run_model_config`)
    writer_lock: Any = None          # rank 0's claim on the run directory, held until the process ends


def load_init(cfg: Config, rank: int = 0) -> InitModel | None:
    """run.init -> the export it names, or None (random init).

    Only rank 0 talks to the registry (concurrent first access to an sqlite store races on MLflow's
    schema check); the other ranks read the same local copy, as the run directory is on a shared
    filesystem (checkpoints need that too)."""
    if not cfg.run.init:
        return None


    box: list[Any] = [None]
    if rank == 0:
        try:
            box = [str(resolve_model(cfg.run.init, tracking_uri(cfg.tracking.uri, cfg.run.output_dir),
                                     cfg.run_dir / "init"))]
        except (UserError, FileNotFoundError) as e:  # sent to the peers too: they would die in the broadcast
            box = [UserError(str(e))]
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(box, src=0)
    if isinstance(box[0], UserError):
        raise box[0]
    local = Path(box[0])
    return InitModel(*read_export(local), local)


def run_model_config(cfg: Config, init: InitModel | None, vocab: int) -> ModelConfig:
    """The model a head builds: the init encoder's own size and vocabulary with this run's dropout, or the
    configured model with the dataset's vocabulary (a random start)."""
    if init is not None:
        return init.model_cfg.model_copy(update={"dropout": cfg.model.dropout})
    return cfg.model.model_copy(update={"vocab_size": vocab})


def check_init_compatible(cfg: Config, init: InitModel, dataset_tokenizer: Path,
                          keys: tuple[str, ...] = ("hidden", "layers", "heads", "ffn_dim", "num_decoder_layers")) -> None:
    """Refuse an init encoder of another size or tokenizer than this run's (a silent mismatch would train
    on garbage ids or fail deep inside load_state_dict). Every export carries the tokenizer its encoder was
    trained with; one without it is damaged (or hand-made), and nothing would show which ids it reads."""
    for k in keys:
        if getattr(init.model_cfg, k) != getattr(cfg.model, k):
            raise ValueError(f"run.init={cfg.run.init}: its model.{k}={getattr(init.model_cfg, k)} differs from "
                             f"the configured model.{k}={getattr(cfg.model, k)}")
    tok = Path(init.local_dir) / "tokenizer.model"
    if not tok.is_file():
        raise ValueError(f"run.init={cfg.run.init}: the export has no tokenizer.model (every export carries the "
                         "tokenizer its encoder was trained with): it is incomplete; use a complete export, or copy "
                         "the tokenizer.model of the dataset it was trained on next to its encoder.safetensors")
    if file_hash(tok) != file_hash(dataset_tokenizer):
        raise ValueError(f"run.init={cfg.run.init} was trained with another tokenizer than the dataset "
                         f"{cfg.data.dataset_dir}; prepare the data with data.tokenizer.model={tok}")


def prepare_run(cfg: Config, check_init: bool = True) -> RunInputs:
    preemption_flag()   # first: a SIGUSR1 during the start-up below is kept for the first step, not fatal
    # a tracking server that does not answer: one line on every rank now, not minutes of MLflow retries later
    uri = tracking_uri(cfg.tracking.uri, cfg.run.output_dir, create=False)
    check_reachable(uri)
    check_store_location(uri, cfg.tracking.experiment)   # a copied run directory must not log into the original
    rt = init_distributed(cfg)
    setup_logging(rt.rank)
    lock = claim_run_dir(cfg.run_dir, rt.is_main, rt.device)  # before anything is written there
    train_data = DocumentDataset(cfg.data.dataset_dir, "train")
    valid_data = DocumentDataset(cfg.data.dataset_dir, "valid")
    init = load_init(cfg, rt.rank)
    if init is not None and check_init:
        try:
            check_init_compatible(cfg, init, train_data.tokenizer_path)
        except ValueError as e:  # a configuration error, not a crash: one line, before any training
            raise UserError(f"hibert: {e}") from None
    vocab = vocab_size(train_data.tokenizer_path)
    return RunInputs(rt, train_data, valid_data, init, vocab, run_model_config(cfg, init, vocab), lock)


# What torch.distributed raises on a rank whose peer died (gloo: the socket closes; NCCL: the watchdog) or hung
# past run.collective_timeout_s: DistError subclasses on recent torch, plain RuntimeErrors from gloo's transport.
PEER_LOST = ("Connection reset by peer", "Connection closed by peer", "Broken pipe", "Timed out waiting",
             "timed out", "Watchdog caught collective operation timeout", "NCCL communicator was aborted")


def peer_lost(e: BaseException) -> bool:
    return (isinstance(e, (PeerFailed, getattr(dist, "DistError", ()))) or any(m in str(e) for m in PEER_LOST))


def run_task(cfg: Config, inputs: RunInputs, task: Task, command: str) -> int:
    """Train `task` with the shared Trainer; exit code 75 (requeue) when preempted."""
    trainer = None
    try:
        # the global batch for this world size (a resume on another one keeps the checkpoint's)
        cfg, source = resolve_global_batch(cfg, inputs.rt.world_size, saved_global_batch(cfg, inputs.rt.is_main))
        if inputs.rt.is_main:
            log.info("global batch: %d micro-batches (%s): %d accumulated on each of %d rank(s)",
                     cfg.schedule.global_batch, source, cfg.schedule.grad_accum, inputs.rt.world_size)
        trainer = Trainer(cfg, task, inputs.rt, inputs.train, inputs.valid, init=inputs.init)
        result = trainer.fit()
    except NothingTrained as e:
        log.error("%s: %s", command, e)
        if dist.is_initialized():
            dist.destroy_process_group()
        return 1
    except DiskFull as e:
        log.error("%s: %s", command, e)
        return 1
    except UserError as e:
        if trainer is not None:
            raise
        # the init export lacks what the task starts from (Task.init_from): one line, before any training
        print(e, file=sys.stderr)
        return 1
    except (OSError, RuntimeError) as e:
        if disk_full(e):  # the export, the step log, the resolved config...
            log.error("%s: no space left on device (%s, under %s; %s); checkpoints already complete are intact: free "
                      "space and start the run again", command, str(e).splitlines()[0][:200] if str(e) else "ENOSPC",
                      cfg.run_dir, free_mb(cfg.run_dir))
            return 1
        if not isinstance(e, RuntimeError) or not peer_lost(e):
            raise
        # another rank died or hung: one line here (the launcher or srun names which), not a c10d traceback
        log.debug("collective failed", exc_info=True)
        log.error("%s: rank %d lost its peers in a collective (%s); exiting: the job restarts from the newest "
                  "complete checkpoint in %s (slurm.max_restarts), or start it again", command, inputs.rt.rank,
                  str(e).splitlines()[0][:300] if str(e) else type(e).__name__, cfg.checkpoint_dir)
        return 1
    if inputs.rt.is_main:
        log.info("%s %s at step %d; export: %s; registered version: %s", command, result.status, result.step,
                 result.export_dir, result.registered_version)
        if result.tracking_pending:
            log.error("%s: trained and exported to %s, but the tracking server %s did not come back within "
                      "tracking.outage_wait_s=%.0f s: %d operation(s)%s wait in %s. When it is back: hibert registry "
                      "sync %s (or start this job again); exit %d", command, result.export_dir,
                      redact_uri(tracking_uri(cfg.tracking.uri, cfg.run.output_dir, create=False)),
                      cfg.tracking.outage_wait_s, result.tracking_pending,
                      " (the registration among them)" if result.registered_version is None
                      and cfg.tracking.register_model else "", cfg.run_dir / OUTBOX, cfg.run_dir,
                      TRACKING_PENDING_EXIT_CODE)
    if dist.is_initialized():
        dist.destroy_process_group()
    if result.status == "preempted":
        return REQUEUE_EXIT_CODE
    # only rank 0 knows; the launcher and the sbatch script take the job's status from any rank's
    return TRACKING_PENDING_EXIT_CODE if result.tracking_pending else 0
