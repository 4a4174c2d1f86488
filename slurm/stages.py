"""From a recipe's `slurm:` section to the planned chain of jobs (one `JobSpec` per stage).

A stage is `hibert <command> <recipe> [overrides]` with per-command resource defaults: prep is a
CPU job array with one shard per task, merge and evaluate are single tasks, pretrain and finetune
take the section's nodes x GPUs. Stages hand encoders to each other through the registry, which is
plain config: the in-domain stage runs with `run.init=models:/<registered_model>@open-domain`.
"""
from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hibert.config import load_config
from hibert.config.load import configs_root
from hibert.config.ops import SlurmConfig, SlurmResources, SlurmStage
from hibert.config.schema import Config
from slurm.render import JobSpec, Raw

# Per-command resources applied before the stage's own `resources:`.
COMMAND_RESOURCES: dict[str, dict[str, Any]] = {
    "prep": {"nodes": 1, "gpus_per_node": 0, "ntasks_per_node": 1},
    "prep-merge": {"nodes": 1, "gpus_per_node": 0, "ntasks_per_node": 1},
    "pretrain": {},
    "finetune": {},
    "evaluate": {"nodes": 1, "ntasks_per_node": 1},
}


@dataclass(frozen=True)
class PlannedJob:
    stage: SlurmStage
    spec: JobSpec
    after: list[str]          # names of selected stages this one waits for (afterok)


def default_pipeline(cfg: Config) -> list[SlurmStage]:
    """The paper's chain from one recipe. Each training stage gets its own run name, so that it does
    not resume from the previous stage's checkpoints, and starts from the previous stage's encoder."""
    name, model = cfg.run.name, cfg.tracking.registered_model
    stages = [
        ("prep", "prep", []),
        ("prep-merge", "prep-merge", []),
        ("pretrain-open", "pretrain", ["run.stage=open-domain", f"run.name={name}-open-domain"]),
        ("pretrain-in", "pretrain", ["run.stage=in-domain", f"run.name={name}-in-domain",
                                     f"run.init=models:/{model}@open-domain"]),
        ("finetune", "finetune", ["run.stage=finetune", f"run.name={name}-finetune",
                                  f"run.init=models:/{model}@in-domain", "objective.kind=extractive"]),
        ("evaluate", "evaluate", ["run.stage=finetune", f"run.name={name}-finetune",
                                  "objective.kind=extractive"]),
    ]
    return [SlurmStage(name=n, command=c, overrides=o) for n, c, o in stages]


def stage_resources(slurm: SlurmConfig, stage: SlurmStage) -> SlurmResources:
    base = slurm.model_dump(include=set(SlurmResources.model_fields))
    merged = {**base, **COMMAND_RESOURCES[stage.command], **stage.resources}
    if stage.command == "evaluate" and "gpus_per_node" not in stage.resources:
        merged["gpus_per_node"] = min(1, slurm.gpus_per_node)
    return SlurmResources.model_validate(merged)


def find_recipe(ref: str, base_dir: Path | None = None) -> Path:
    """A recipe path or shipped name -> absolute path (the scripts run from any directory)."""
    for cand in ([base_dir / ref] if base_dir else []) + [Path(ref), configs_root() / "recipes" / f"{ref}.yaml"]:
        if cand.is_file():
            return cand.resolve()
    raise FileNotFoundError(f"recipe {ref!r} not found (looked next to the submitted recipe, in the "
                            f"working directory and in {configs_root() / 'recipes'})")


def cli_words(slurm: SlurmConfig) -> list[str]:
    # The submitting interpreter by absolute path: right for a venv on a shared filesystem, and it
    # execs Python directly so srun's signals reach the training process.
    return shlex.split(slurm.cli) if slurm.cli else [sys.executable, "-m", "hibert.cli"]


def stage_command(cli: list[str], stage: SlurmStage, recipe: Path | None, overrides: list[str],
                  shards: int) -> list[str]:
    sub = "prep" if stage.command == "prep-merge" else stage.command
    words = [*cli, sub, *([str(recipe)] if recipe else []), *overrides]
    if stage.command == "prep":
        words += ["--num-shards", str(shards), "--shard-index", Raw('"$SLURM_ARRAY_TASK_ID"')]
    elif stage.command == "prep-merge":
        words += ["--merge", "--num-shards", str(shards)]
    return words


def plan(cfg: Config, recipe: str | None, user_overrides: list[str], out_dir: Path, workdir: Path,
         only: list[str] | None = None) -> list[PlannedJob]:
    """The jobs to submit, in order. `only` picks stages by name; a dependency on a stage left out
    is dropped (that stage is taken as done). Every stage's config is loaded here, so a bad override
    fails before anything is submitted."""
    slurm = cfg.slurm
    stages = slurm.pipeline or default_pipeline(cfg)
    names = [s.name for s in stages]
    unknown = [n for n in only or [] if n not in names]
    if unknown:
        raise ValueError(f"unknown stages {unknown}; this recipe's stages: {names}")
    selected = [s for s in stages if only is None or s.name in only]
    recipe_path = find_recipe(recipe) if recipe else None
    cli = cli_words(slurm)
    jobs: list[PlannedJob] = []
    for stage in selected:
        i = names.index(stage.name)
        if stage.recipe:
            path = find_recipe(stage.recipe, recipe_path.parent if recipe_path else None)
            overrides = list(stage.overrides)  # the submit line's overrides belong to the submitted recipe
        else:
            path, overrides = recipe_path, [*user_overrides, *stage.overrides]
        stage_cfg = load_config(path, overrides)  # raises ConfigError with the stage's key and file
        shards = slurm.prep_shards or stage_cfg.data.num_shards or 1
        wanted = stage.after if stage.after is not None else names[i - 1:i]
        after = [a for a in wanted if only is None or a in only]
        res = stage_resources(slurm, stage)
        array = None
        if stage.command == "prep":
            array = f"0-{shards - 1}" + (f"%{slurm.array_parallelism}" if slurm.array_parallelism else "")
        spec = JobSpec(
            name=f"{cfg.run.name}-{stage.name}",
            command=stage_command(cli, stage, path, overrides, shards),
            resources=res, log_dir=out_dir, workdir=workdir, array=array,
            description=f"stage {stage.name}: hibert {stage.command} {path or '(defaults)'}")
        jobs.append(PlannedJob(stage, spec, after))
    return jobs
