"""Render one sbatch script from a `JobSpec`: the #SBATCH header from the resources, then the shared
body in templates/job.sbatch (environment, rendezvous, srun in the background, signal forwarding,
requeue on REQUEUE_EXIT_CODE).

Every stage uses the same body, so preemption behaves the same for prep, pretrain and finetune.
"""
from __future__ import annotations

import re
import shlex
import string
from dataclasses import dataclass
from pathlib import Path

from hibert.config.ops import SlurmResources
from hibert.runtime.dist_env import REQUEUE_EXIT_CODE

TEMPLATE = Path(__file__).with_name("templates") / "job.sbatch"


class Raw(str):
    """A command-line word inserted unquoted, for shell expansions such as "$SLURM_ARRAY_TASK_ID"."""


class _Template(string.Template):
    delimiter = "@@"  # bash owns `$`; `@@{name}` never occurs in shell code


@dataclass(frozen=True)
class JobSpec:
    name: str                    # --job-name
    command: list[str]           # run by srun in every task; must exec Python itself so signals reach it
    resources: SlurmResources
    log_dir: Path                # %x-%j.out / .err land here (appended to across requeues)
    workdir: Path                # --chdir: relative paths in recipes resolve as at submit time
    array: str | None = None     # e.g. "0-15%4"
    description: str = ""        # one comment line at the top of the script


def _check_path(p: Path) -> str:
    s = str(p)
    if any(c.isspace() for c in s):  # #SBATCH lines are not shell-parsed: no quoting possible
        raise ValueError(f"sbatch paths cannot contain whitespace: {s!r}")
    return s


def sbatch_options(spec: JobSpec) -> list[str]:
    r = spec.resources
    log = _check_path(spec.log_dir)
    stem = "%x-%A_%a" if spec.array else "%x-%j"
    opts = [
        f"--job-name={spec.name}",
        f"--nodes={r.nodes}",
        f"--ntasks-per-node={r.tasks_per_node}",
        f"--cpus-per-task={r.cpus_per_task}",
    ]
    if r.gpus_per_node > 0:
        opts.append(f"--gpus-per-node={r.gpus_per_node}")
    for flag, value in (("partition", r.partition), ("account", r.account), ("qos", r.qos), ("mem", r.mem)):
        if value:
            opts.append(f"--{flag}={value}")
    opts.append(f"--time={r.time}")
    if spec.array:
        opts.append(f"--array={spec.array}")
    opts += [
        f"--output={log}/{stem}.out",
        f"--error={log}/{stem}.err",
        "--open-mode=append",                   # a requeued job appends to its logs
        f"--signal=B:USR1@{r.signal_grace_s}",  # B: the batch shell, which forwards it to srun
        "--requeue" if r.requeue else "--no-requeue",
        "--kill-on-invalid-dep=yes",            # a failed upstream stage cancels the rest of the chain
        f"--chdir={_check_path(spec.workdir)}",
    ]
    opts += [o if o.startswith("-") else f"--{o}" for o in r.extra_sbatch]
    return opts


def srun_options(r: SlurmResources) -> list[str]:
    # srun does not inherit --cpus-per-task from the allocation (Slurm >= 22.05): pass it again.
    # --kill-on-bad-exit=0: REQUEUE_EXIT_CODE is a non-zero exit too, and the first rank to leave after
    # a preemption checkpoint must not kill rank 0 while it still closes the MLflow run. A crashed rank
    # still ends the step: gloo peers fail on the closed sockets, NCCL ones on the watchdog
    # (TORCH_NCCL_ASYNC_ERROR_HANDLING=1). Add --kill-on-bad-exit=1 to srun_args to fail faster.
    opts = [f"--nodes={r.nodes}", f"--ntasks-per-node={r.tasks_per_node}", f"--cpus-per-task={r.cpus_per_task}",
            "--kill-on-bad-exit=0"]
    if r.container:
        opts.append(f"--container-image={r.container}")
    return opts + list(r.srun_args)


_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")   # control characters but tab


def _words(args: list[str]) -> str:
    return " ".join(a if isinstance(a, Raw) else shlex.quote(a) for a in args)


def _one_line(text: str, what: str) -> str:
    """`text` where the script holds it on one line (an #SBATCH option, the job name): a control character
    (a newline) would end that line, and what follows would run as a command."""
    if _CONTROL.search(text):
        raise ValueError(f"{what} {text[:200]!r} holds a control character (a newline?): refused, it would end "
                         "its line of the sbatch script")
    return text


def render_job(spec: JobSpec) -> str:
    r = spec.resources
    env_lines = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in r.env.items())
    setup_lines = "".join(f"{line}\n" for line in r.setup)
    return _Template(TEMPLATE.read_text()).substitute(
        sbatch_lines="\n".join(_one_line(f"#SBATCH {o}", "sbatch option") for o in sbatch_options(spec)),
        # a comment line: control characters become spaces (a newline in a value would end the comment)
        description=_CONTROL.sub(" ", spec.description or spec.name),
        setup_lines=setup_lines,
        env_lines=env_lines,
        # shell words, quoted: a name or path holding $(...), backticks or quotes is data, never a command
        job_name=shlex.quote(_one_line(spec.name, "job name")),
        srun_args=_words(srun_options(r)),
        command=_words(spec.command),
        requeue_exit_code=REQUEUE_EXIT_CODE,
        requeue=1 if r.requeue else 0,
        max_restarts=r.max_restarts,
        crash_count=shlex.quote(_one_line(str(spec.log_dir / ".restarts-"), "log directory")) + '"${SLURM_JOB_ID}"',
    )


def write_job(spec: JobSpec, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    spec.log_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(render_job(spec))
    path.chmod(0o755)
    return path
