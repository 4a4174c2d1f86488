"""`hibert pretrain`: masked-sentence pretraining, one stage per invocation."""
from __future__ import annotations

import argparse
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from hibert.config import Config, save_resolved


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--stage", choices=["open-domain", "in-domain"], default=None,
                   help="pretraining stage (sets run.stage; the registry alias of the exported encoder)")
    p.add_argument("--init", default=None, metavar="REF",
                   help="start from an encoder: models:/hibert-encoder@open-domain or an export dir (sets run.init)")
    p.add_argument("--nproc", type=int, default=None,
                   help="start N local ranks (CPU: gloo). Not needed under srun/torchrun/deepspeed")


def setup_logging(rank: int) -> None:
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING,
                        format=f"%(asctime)s [rank{rank}] %(name)s: %(message)s", force=True)


def apply_cli(cfg: Config, args: argparse.Namespace) -> Config:
    if getattr(args, "stage", None):
        cfg.run.stage = args.stage
    if getattr(args, "init", None):
        cfg.run.init = args.init
    return cfg


def relaunch(cfg: Config, command: str, nproc: int) -> int:
    """Re-run this command on `nproc` local ranks with the resolved config as the recipe."""
    from pretrain.launch import launch_local

    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    path = save_resolved(cfg, Path(tempfile.mkdtemp(prefix="launch-", dir=cfg.run_dir)))
    return launch_local(nproc, ["-m", "hibert.cli", command, str(path)])


def load_init(cfg: Config, rank: int = 0):
    """run.init -> (encoder state, model config, export meta, local dir) or None.

    Only rank 0 talks to the registry (concurrent first access to an sqlite store races on MLflow's
    schema check); the other ranks read the same local copy, as the run directory is on a shared
    filesystem (checkpoints need that too)."""
    if not cfg.run.init:
        return None
    import torch.distributed as dist

    from hibert.registry import resolve_model, tracking_uri
    from pretrain.export import read_export

    box = [None]
    if rank == 0:
        box = [str(resolve_model(cfg.run.init, tracking_uri(cfg.tracking.uri, cfg.run.output_dir),
                                 cfg.run_dir / "init"))]
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(box, src=0)
    local = Path(box[0])
    return (*read_export(local), local)


def check_init_compatible(cfg: Config, init, dataset_tokenizer: Path) -> None:
    from pretrain.trainer import file_hash

    _, init_cfg, _, local = init
    for k in ("hidden", "layers", "heads", "ffn_dim", "num_decoder_layers"):
        if getattr(init_cfg, k) != getattr(cfg.model, k):
            raise ValueError(f"run.init={cfg.run.init}: its model.{k}={getattr(init_cfg, k)} differs from the "
                             f"configured model.{k}={getattr(cfg.model, k)}")
    tok = Path(local) / "tokenizer.model"
    if tok.is_file() and file_hash(tok) != file_hash(dataset_tokenizer):
        raise ValueError(f"run.init={cfg.run.init} was trained with another tokenizer than the dataset "
                         f"{cfg.data.dataset_dir}; prepare the data with data.tokenizer.model={tok}")


def run(cfg: Config, args: argparse.Namespace) -> int:
    cfg = apply_cli(cfg, args)
    if args.nproc and "RANK" not in os.environ and "SLURM_PROCID" not in os.environ:
        return relaunch(cfg, "pretrain", args.nproc)
    return train(cfg)


@dataclass
class RunInputs:
    """What every training command sets up the same way before building its task."""
    rt: object                       # pretrain.engine.Runtime
    train: object                    # data_prep.DocumentDataset
    valid: object
    init: tuple | None               # load_init's (state, model config, meta, dir)
    vocab_size: int


def prepare_run(cfg: Config) -> RunInputs:
    from data_prep import DocumentDataset
    from pretrain.engine import init_distributed
    from pretrain.masked_sentence import tokenizer_vocab_size

    rt = init_distributed(cfg)
    setup_logging(rt.rank)
    train_data = DocumentDataset(cfg.data.dataset_dir, "train")
    valid_data = DocumentDataset(cfg.data.dataset_dir, "valid")
    init = load_init(cfg, rt.rank)
    if init is not None:
        check_init_compatible(cfg, init, train_data.tokenizer_path)
    return RunInputs(rt, train_data, valid_data, init, tokenizer_vocab_size(train_data.tokenizer_path))


def run_task(cfg: Config, inputs: RunInputs, task, command: str) -> int:
    """Train `task` with the shared Trainer; exit code 75 (requeue) when preempted."""
    import torch.distributed as dist

    from pretrain.dist_env import REQUEUE_EXIT_CODE
    from pretrain.trainer import Trainer

    result = Trainer(cfg, task, inputs.rt, inputs.train, inputs.valid).fit()
    if inputs.rt.is_main:
        logging.getLogger("hibert").info("%s %s at step %d; export: %s; registered version: %s; %s", command,
                                         result.status, result.step, result.export_dir,
                                         result.registered_version, result.metrics)
    if dist.is_initialized():
        dist.destroy_process_group()
    return REQUEUE_EXIT_CODE if result.status == "preempted" else 0


def train(cfg: Config) -> int:
    from pretrain.masked_sentence import MaskedSentenceTask

    if cfg.objective.kind != "masked_sentence":
        raise SystemExit(f"hibert pretrain trains objective.kind=masked_sentence, not {cfg.objective.kind}")
    inputs = prepare_run(cfg)
    task = MaskedSentenceTask(cfg, inputs.vocab_size, init_state=inputs.init[0] if inputs.init else None)
    return run_task(cfg, inputs, task, "pretrain")
