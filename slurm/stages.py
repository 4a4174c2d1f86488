"""From a recipe's `slurm:` section to the planned chain of jobs (one `JobSpec` per stage).

A stage is `hibert <command> <recipe> [overrides]` with per-command resource defaults: prep is a
CPU job array with one shard per task, merge and evaluate are single tasks, pretrain and finetune
take the section's nodes x GPUs. Stages hand encoders to each other through the registry, which is
plain config: the in-domain stage runs with `run.init=models:/<registered_model>@open-domain`, which the
chain turns into its own alias (slurm/chain.py). Each job runs a snapshot of its stage's resolved config.
"""
from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hibert.config import dump_yaml, load_config
from hibert.config.load import configs_root
from hibert.config.ops import SlurmConfig, SlurmResources, SlurmStage
from hibert.config.schema import Config
from hibert.redact import redact_uri
from hibert.slurm.chain import (
    ChainError,
    Link,
    StageInput,
    check_chain_id,
    check_summaries,
    link,
    new_chain_id,
    resolve_version,
    selected_after,
    set_reads,
)
from hibert.slurm.render import JobSpec, Raw

# Per-command resources applied before the stage's own `resources:`.
COMMAND_RESOURCES: dict[str, dict[str, Any]] = {
    "prep": {"nodes": 1, "gpus_per_node": 0, "ntasks_per_node": 1},
    "prep-merge": {"nodes": 1, "gpus_per_node": 0, "ntasks_per_node": 1},
    "pretrain": {},
    "finetune": {},
    "evaluate": {"nodes": 1, "ntasks_per_node": 1},
    "summarize": {"nodes": 1, "ntasks_per_node": 1},           # one array task per shard, a GPU each if any
    "summarize-merge": {"nodes": 1, "gpus_per_node": 0, "ntasks_per_node": 1},
}


@dataclass(frozen=True)
class PlannedJob:
    stage: SlurmStage
    spec: JobSpec
    after: list[str]          # names of selected stages this one waits for (afterok)
    config: Config            # the stage's resolved config: what its snapshot holds and its job runs
    snapshot: Path            # where the job reads it (`hibert <command> <snapshot>`)
    source: list[str]         # `hibert <command> <recipe> [overrides]` as the recipe gave it
    link: Link                # the chain's aliases: what the stage registers and reads


@dataclass(frozen=True)
class Chain:
    id: str
    jobs: list[PlannedJob]
    snapshot_dir: Path

    def notes(self) -> list[str]:
        """One line per stage that registers or reads an encoder."""
        lines = []
        for j in self.jobs:
            ln, parts = j.link, []
            if ln.reads:
                if ln.pinned_from:
                    how = f"{ln.pinned_from} pinned at submit time"
                elif ln.pin:
                    how = ("registered by stage " + ln.reads_from + " of this chain, not submitted now"
                           if ln.reads_from else "not pinned (--no-pin): resolved when the job starts")
                else:
                    how = f"registered by stage {ln.reads_from}" if ln.reads_from else ""
                parts.append(f"reads {ln.reads}" + (f" ({how})" if how else ""))
            if ln.registers:
                parts.append(f"registers {ln.registers}")
            if parts:
                lines.append(f"{j.stage.name:<16} " + "; ".join(parts))
        return lines


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
                                  f"run.init=models:/{model}@in-domain"]),
        ("evaluate", "evaluate", ["run.stage=finetune", f"run.name={name}-finetune"]),
    ]
    return [SlurmStage(name=n, command=c, overrides=o) for n, c, o in stages]


SEEDED = ("finetune", "evaluate")   # the stages `slurm.seeds` repeats: pretraining stays one run


def expand_seeds(stages: list[SlurmStage], seeds: list[int], run_name: str) -> list[SlurmStage]:
    """Each finetune/evaluate stage once per seed: `<stage>-seed<S>` with run.seed=S (the head's init, dropout)
    and schedule.seed=S (the batches' order and masks) and
    run.name=<its run name>-seed<S> (so an evaluate stage finds its finetune run of the same seed); only the
    first seed's finetune registers a model (a later stage reading the alias gets that one). `after` follows:
    a seeded stage waits for the same seed's copy of a seeded stage; any other waits for every copy. A stage
    that waits for the one before it (no `after`) gets that stage named first: after the expansion "the one
    before" would be another seed's copy (evaluate seed 1 after finetune seed 3)."""
    if not seeds:
        return stages
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"slurm.seeds {seeds}: a seed is repeated")
    stages = [st.model_copy(update={"after": [stages[i - 1].name]}) if st.after is None and i > 0 else st
              for i, st in enumerate(stages)]
    seeded = {st.name for st in stages if st.command in SEEDED}
    out: list[SlurmStage] = []
    for st in stages:
        if st.command not in SEEDED:
            after = None if st.after is None else [
                c for a in st.after for c in ([f"{a}-seed{s}" for s in seeds] if a in seeded else [a])]
            out.append(st.model_copy(update={"after": after}))
            continue
        base = next((o.split("=", 1)[1] for o in reversed(st.overrides) if o.startswith("run.name=")), run_name)
        for i, s in enumerate(seeds):
            extra = [f"run.seed={s}", f"schedule.seed={s}", f"run.name={base}-seed{s}"]
            if st.command == "finetune" and i > 0:
                extra.append("tracking.register_model=false")
            after = None if st.after is None else [f"{a}-seed{s}" if a in seeded else a for a in st.after]
            out.append(st.model_copy(update={"name": f"{st.name}-seed{s}", "overrides": [*st.overrides, *extra],
                                             "after": after}))
    return out


def stage_resources(slurm: SlurmConfig, stage: SlurmStage) -> SlurmResources:
    base = slurm.model_dump(include=set(SlurmResources.model_fields))
    merged = {**base, **COMMAND_RESOURCES[stage.command], **stage.resources}
    if stage.command in ("evaluate", "summarize") and "gpus_per_node" not in stage.resources:
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


def subcommand(command: str) -> str:
    """The `hibert` subcommand a stage's command runs (the merge stages are their command with --merge)."""
    return command.removesuffix("-merge")


def stage_command(cli: list[str], stage: SlurmStage, recipe: Path | None, overrides: list[str],
                  shards: int, args: list[str] | None = None) -> list[str]:
    words = [*cli, subcommand(stage.command), *([str(recipe)] if recipe else []), *overrides,
             *stage.args, *(args or [])]
    if stage.command == "prep":
        words += ["--num-shards", str(shards), "--shard-index", Raw('"$SLURM_ARRAY_TASK_ID"')]
    elif stage.command == "prep-merge":
        words += ["--merge", "--num-shards", str(shards)]
    elif stage.command == "summarize":  # output appended window by window; a requeued task resumes its part
        words += ["--no-progress", "--shard", Raw(f'"$SLURM_ARRAY_TASK_ID/{shards}"')]
    elif stage.command == "summarize-merge":
        words += ["--merge", "--shards", str(shards)]
    return words


def snapshot_path(snapshot_dir: Path, stage: str) -> Path:
    """`<dir>/<stage>.yaml`, or `<stage>.<n>.yaml` when a continued chain already holds one: a snapshot
    a queued job may still read is never overwritten."""
    path, n = snapshot_dir / f"{stage}.yaml", 2
    while path.exists():
        path, n = snapshot_dir / f"{stage}.{n}.yaml", n + 1
    return path


def plan(cfg: Config, recipe: str | None, user_overrides: list[str], out_dir: Path, workdir: Path,
         only: list[str] | None = None, chain_id: str | None = None, continuing: bool = False,
         pin: bool = True, snapshot_root: Path | None = None) -> Chain:
    """The chain to submit, its jobs in order. `only` picks stages by name; a dependency on a stage left
    out is replaced by what that stage waited for (it is taken as done). Every stage's config is loaded
    here, so a bad override fails before anything is submitted; the chain's aliases are applied, inits
    that are not the chain's are pinned to a registry version (`pin`), and each job runs
    `hibert <command> <snapshot>` with its resolved config in `<snapshot_root>/<chain id>/` (default root:
    `out_dir`; the caller writes the files, `write_snapshots`).

    `chain_id`: continue that chain (`continuing`, `hibert submit --chain`) or name a new one; None: a new id."""
    slurm = cfg.slurm
    stages = expand_seeds(slurm.pipeline or default_pipeline(cfg), slurm.seeds, cfg.run.name)
    names = [s.name for s in stages]
    unknown = [n for n in only or [] if n not in names]
    if unknown:
        raise ValueError(f"unknown stages {unknown}; this recipe's stages: {names}")
    selected = {s.name for s in stages if only is None or s.name in only}
    chain_id = check_chain_id(chain_id) if chain_id else new_chain_id(cfg.run.name)
    snapshot_dir = Path(snapshot_root or out_dir) / chain_id
    recipe_path = find_recipe(recipe) if recipe else None
    cli = cli_words(slurm)
    sources: dict[str, tuple[Path | None, list[str]]] = {}
    inputs: list[StageInput] = []
    for stage in stages:  # all of them: a left-out stage still tells which aliases belong to the chain
        if stage.recipe:
            path = find_recipe(stage.recipe, recipe_path.parent if recipe_path else None)
            overrides = list(stage.overrides)  # the submit line's overrides belong to the submitted recipe
        else:
            path, overrides = recipe_path, [*user_overrides, *stage.overrides]
        sources[stage.name] = (path, overrides)
        inputs.append(StageInput(stage, load_config(path, overrides)))  # ConfigError names the key and file
    links = link(inputs, chain_id, selected, continuing)
    after = selected_after(stages, selected)
    jobs: list[PlannedJob] = []
    for stage in stages:
        if stage.name not in selected:
            continue
        path, overrides = sources[stage.name]
        ln = links[stage.name]
        if ln.pin and pin:
            uri, name, alias = ln.pin
            try:
                version = resolve_version(uri, name, alias)
            except ChainError as e:
                hint = "" if ln.reads_from else " (--no-pin: leave it to be resolved when the job starts)"
                raise ChainError(f"stage {stage.name}: {e}{hint}") from None
            ln.pinned_from = f"models:/{name}@{alias}" if alias != "latest" else f"models:/{name}/latest"
            ln.reads = f"models:/{name}/{version}"
            set_reads(stage, ln)
        stage_cfg = load_config(path, [*overrides, *ln.overrides])
        check_summaries(stage, stage_cfg)
        # the job does not read the recipe's pipeline, and its run.init strings would only mislead
        stage_cfg = stage_cfg.model_copy(update={"slurm": stage_cfg.slurm.model_copy(update={"pipeline": []})})
        if stage.command.startswith("summarize"):
            shards = slurm.summarize_shards
        else:
            shards = slurm.prep_shards or stage_cfg.data.num_shards or 1
        res = stage_resources(slurm, stage)
        array = None
        if stage.command in ("prep", "summarize"):
            array = f"0-{shards - 1}" + (f"%{slurm.array_parallelism}" if slurm.array_parallelism else "")
        snapshot = snapshot_path(snapshot_dir, stage.name)
        source = ["hibert", subcommand(stage.command), *([str(path)] if path else []), *overrides, *stage.args,
                  *ln.args, *(["--merge"] if stage.command.endswith("-merge") else [])]
        spec = JobSpec(
            name=f"{cfg.run.name}-{stage.name}",
            command=stage_command(cli, stage, snapshot, [], shards, ln.args),
            resources=res, log_dir=out_dir, workdir=workdir, array=array,
            description=redact_uri(f"stage {stage.name} of chain {chain_id}: {shlex.join(source)}"))
        jobs.append(PlannedJob(stage, spec, after[stage.name], stage_cfg, snapshot, source, ln))
    return Chain(chain_id, jobs, snapshot_dir)


def write_snapshots(chain: Chain) -> None:
    """Each stage's resolved config, as its job will run it (private: it may hold tracking credentials,
    like every run's config.resolved.yaml)."""
    chain.snapshot_dir.mkdir(parents=True, exist_ok=True)
    for job in chain.jobs:
        header = (f"# hibert submit: stage {job.stage.name} of chain {chain.id}, resolved at submit time from\n"
                  f"#   {redact_uri(shlex.join(job.source))}\n"
                  "# The job runs this file: editing the recipe changes nothing here (slurm.pipeline left out).\n")
        tmp = job.snapshot.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(header + dump_yaml(job.config))
        tmp.replace(job.snapshot)
