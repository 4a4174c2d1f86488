"""`hibert pretrain`: masked-sentence pretraining, one stage per invocation.

The task and the runtime are imported in the handlers: they bring torch and DeepSpeed (~2.5 s), which
`hibert --help` (it builds this command's parser) should not pay."""
from __future__ import annotations

import argparse
import os
import sys

from hibert.config import Config
from hibert.errors import UserError
from hibert.runtime.launch import relaunch


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--stage", choices=["open-domain", "in-domain"], default=None,
                   help="pretraining stage (sets run.stage; the registry alias of the exported encoder)")
    p.add_argument("--init", default=None, metavar="REF",
                   help="start from an encoder: models:/hibert-encoder@open-domain or an export dir (sets run.init)")
    p.add_argument("--nproc", type=int, default=None,
                   help="start N local ranks (CPU: gloo). Not needed under srun/torchrun/deepspeed")


def apply_cli(cfg: Config, args: argparse.Namespace) -> Config:
    if getattr(args, "stage", None):
        cfg.run.stage = args.stage
    if getattr(args, "init", None):
        cfg.run.init = args.init
    return cfg


def run(cfg: Config, args: argparse.Namespace) -> int:
    cfg = apply_cli(cfg, args)
    if args.nproc and "RANK" not in os.environ and "SLURM_PROCID" not in os.environ:

        return relaunch(cfg, "pretrain", args.nproc)
    return train(cfg)


def train(cfg: Config) -> int:
    # lazy: the runtime and the task bring torch and DeepSpeed (~3 s), which `hibert --help`, the --nproc launcher
    # and every other command (they build this parser) do not need
    from hibert.pretrain.masked_sentence import MaskedSentenceTask
    from hibert.runtime.run import prepare_run, run_task

    try:
        inputs = prepare_run(cfg)
    except UserError as e:  # e.g. an init encoder of another size or tokenizer: one line, before any training
        print(e, file=sys.stderr)
        return 1
    task = MaskedSentenceTask(cfg, inputs.vocab_size)   # the configured model (run.init: checked to fit it)
    return run_task(cfg, inputs, task, "pretrain")
