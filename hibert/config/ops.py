"""Operational sections: run identity, experiment tracking and Slurm resources."""
import re
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from hibert.config.base import Section


class RunConfig(Section):
    name: str = Field("hibert", max_length=100, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")  # a directory name under output_dir
    output_dir: str = Field("runs", min_length=1)  # each run writes under <output_dir>/<name>
    stage: Literal["open-domain", "in-domain", "finetune", "none"] = "none"
    init: str | None = None                # models:/name@alias, a local export dir, or None (random)
    seed: int = Field(1234, ge=0)
    # a rank that waits this long in a collective (a peer hung, stopped, or its node gone) fails the job instead
    # of hanging it; seconds in tests, tens of minutes on GPU clusters (a checkpoint save is inside collectives)
    collective_timeout_s: int = Field(1800, ge=5, le=86400)


class TrackingConfig(Section):
    uri: str | None = None                 # None -> $MLFLOW_TRACKING_URI or sqlite:///<output_dir>/mlflow.db
    experiment: str = Field("hibert", min_length=1)
    registered_model: str = Field("hibert-encoder", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    register_model: bool = True
    alias: str | None = Field(None, pattern=r"^[A-Za-z][A-Za-z0-9_-]*$")  # None: the stage (pretrain), "finetuned"
    peak_tflops: float | None = Field(None, gt=0)  # per device; None -> guessed from the device name (MFU)
    # forward / backward / optimizer / data-wait ms per step in the step log; synchronizes the device around
    # each phase (CUDA), which costs some overlap: for profiling runs and benchmarks, off in production
    step_breakdown: bool = False
    # a server that goes away mid-run: what cannot be sent waits in <run dir>/tracking/outbox.jsonl and is re-sent
    # when a probe (every retry_every_s) finds it back; at the end rank 0 waits up to outage_wait_s for it before
    # exiting with TRACKING_PENDING_EXIT_CODE (the export is written either way; `hibert registry sync` finishes)
    retry_every_s: float = Field(60.0, gt=0)
    outage_wait_s: float = Field(900.0, ge=0)

    # more aliases moved to the same version, for people (`hibert submit` sets the plain stage alias here;
    # a chain itself only ever reads its own `alias`)
    also_aliases: list[str] = Field(default_factory=list)

    @field_validator("alias")
    @classmethod
    def _alias_allowed(cls, alias: str | None) -> str | None:
        if alias is not None and (alias.lower() == "latest" or re.fullmatch(r"[vV]\d+", alias)):
            raise ValueError(f"{alias!r} is reserved by MLflow (latest, v<N>); choose another alias")
        return alias

    @field_validator("also_aliases")
    @classmethod
    def _also_allowed(cls, aliases: list[str]) -> list[str]:
        for a in aliases:
            if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]*", a):
                raise ValueError(f"alias {a!r} must match [A-Za-z][A-Za-z0-9_-]*")
            cls._alias_allowed(a)
        return aliases


class SlurmResources(Section):
    """What one sbatch job asks for and how its script is set up. `slurm:` holds the defaults; a pipeline
    stage may override any of these for itself (`resources:`)."""
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time: str = "24:00:00"                 # --time (e.g. 48:00:00, 2-00:00:00, UNLIMITED)
    nodes: int = Field(1, ge=1)
    gpus_per_node: int = Field(8, ge=0)    # 0: CPU cluster, no --gpus lines
    ntasks_per_node: int | None = Field(None, ge=1)  # None: one task per GPU (1 when gpus_per_node=0)
    cpus_per_task: int = Field(8, ge=1)
    mem: str | None = None                 # --mem per node, e.g. 480G
    signal_grace_s: int = Field(120, ge=0)  # --signal=B:USR1@<grace>: seconds to checkpoint before the limit
    requeue: bool = True                   # --requeue, and requeue when the step exits with EX_TEMPFAIL (75)
    # a step that fails (a rank or node lost, an OOM kill, the tracking server still away) requeues the job this many
    # times; it resumes from the newest complete checkpoint. Preemptions (75) do not count. 0: fail at once
    max_restarts: int = Field(2, ge=0)
    container: str | None = None           # pyxis: srun --container-image=<container>
    srun_args: list[str] = Field(default_factory=list)    # extra srun options, e.g. --container-mounts=...
    setup: list[str] = Field(default_factory=list)        # shell lines: module loads, venv activation...
    extra_sbatch: list[str] = Field(default_factory=list)  # extra #SBATCH options, e.g. --exclusive
    env: dict[str, str] = Field(default_factory=dict)     # exported last (may override NCCL_DEBUG...)

    @field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, str]) -> dict[str, str]:
        bad = [k for k in env if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k)]
        if bad:
            raise ValueError(f"not shell variable names: {bad}")
        return env

    @property
    def tasks_per_node(self) -> int:
        return self.ntasks_per_node or max(1, self.gpus_per_node)


class SlurmStage(Section):
    """One job of the chain `hibert submit` sends. Stages run in list order, each after the previous
    one succeeded (afterok), unless `after` names others ([] = no dependency)."""
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")  # job name suffix; `--stages` picks by it
    command: Literal["prep", "prep-merge", "pretrain", "finetune", "evaluate", "summarize", "summarize-merge"]
    recipe: str | None = None              # another recipe for this stage (name or path); None = the submitted one
    overrides: list[str] = Field(default_factory=list)   # dotted overrides on the stage's command line
    # flags after the overrides; summarize stages: --model, --input, --output (and --field, --beam, ...)
    args: list[str] = Field(default_factory=list)
    resources: dict[str, Any] = Field(default_factory=dict)  # SlurmResources fields for this stage only
    after: list[str] | None = None

    @model_validator(mode="after")
    def _check_resources(self) -> "SlurmStage":
        if self.command in ("summarize", "summarize-merge"):
            short = {"-i": "--input", "-o": "--output"}
            given = {short.get(a, a.split("=", 1)[0]) for a in self.args if a.startswith("-")}
            missing = [f for f in ("--input", "--output") if f not in given]
            if missing:
                raise ValueError(f"stage {self.name!r} ({self.command}): args need {' and '.join(missing)} "
                                 "(the corpus to summarize and the JSONL file to write)")
            shard_flags = given & {"--shard", "--shards", "--merge", "--nproc"}
            if shard_flags:
                raise ValueError(f"stage {self.name!r}: {', '.join(sorted(shard_flags))} in args: the chain sets "
                                 "them (slurm.summarize_shards array tasks, then a summarize-merge stage)")
        try:  # unknown keys and bad types fail at load time, not at submit time
            SlurmResources.model_validate(self.resources)
        except ValidationError as e:
            problems = "; ".join(f"{'.'.join(map(str, x['loc']))}: {x['msg']}" for x in e.errors())
            raise ValueError(f"stage {self.name!r} resources: {problems} "
                             f"(valid keys: {', '.join(SlurmResources.model_fields)})") from None
        return self


class SlurmConfig(SlurmResources):
    array_parallelism: int | None = Field(None, ge=1)  # %N on prep job arrays
    prep_shards: int | None = Field(None, ge=1)  # prep job-array size (task i: --shard-index i); None: data.num_shards or 1
    summarize_shards: int = Field(1, ge=1)  # summarize job-array size (task i: --shard i/N); summarize-merge joins them
    cli: str | None = None                 # how the nodes call hibert; None = this install's python -m hibert.cli
    pipeline: list[SlurmStage] = Field(default_factory=list)  # empty: prep, merge, pretrain x2, finetune, evaluate
    # finetune and evaluate stages run once per seed (run.seed and schedule.seed), as <stage>-seed<S> writing <run.name>-seed<S>;
    # the first seed registers its model, the others only report (hibert compare pairs them over seeds)
    seeds: list[int] = Field(default_factory=list)

    @model_validator(mode="after")
    def _check_pipeline(self) -> "SlurmConfig":
        names = [s.name for s in self.pipeline]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"slurm.pipeline: duplicate stage names {sorted(dup)}")
        for i, s in enumerate(self.pipeline):
            unknown = [a for a in s.after or [] if a not in names[:i]]
            if unknown:
                raise ValueError(f"slurm.pipeline[{i}] ({s.name}): after={unknown} must name earlier stages")
        self._check_summarize_pairs()
        return self

    def _check_summarize_pairs(self) -> None:
        """A summarize-merge stage joins the parts of a summarize stage with the same --output, and an array of
        several summarize tasks needs one: otherwise the chain could only fail (or stop short) at its end."""
        sums = {_flag(s.args, "--output", "-o"): s.name for s in self.pipeline if s.command == "summarize"}
        merges = {_flag(s.args, "--output", "-o"): s.name for s in self.pipeline if s.command == "summarize-merge"}
        for out, name in merges.items():
            if out not in sums:
                raise ValueError(f"slurm.pipeline: stage {name!r} (summarize-merge) merges --output {out}, which no "
                                 f"summarize stage writes (theirs: {', '.join(map(str, sums)) or 'none'})")
        if self.summarize_shards > 1:
            alone = [name for out, name in sums.items() if out not in merges]
            if alone:
                raise ValueError(f"slurm.pipeline: stage {alone[0]!r} runs as {self.summarize_shards} array tasks "
                                 "(slurm.summarize_shards), but no summarize-merge stage with its --output joins "
                                 "their parts: add one, or set slurm.summarize_shards: 1")


def _flag(args: list[str], name: str, short: str) -> str | None:
    """The value of `name` (or `short`) in a stage's args: `--output X` or `--output=X`."""
    for i, a in enumerate(args):
        if a in (name, short) and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None
