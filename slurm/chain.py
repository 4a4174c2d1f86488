"""Unambiguous hand-off of encoders between the stages of one chain.

Stages pass encoders through registry aliases (`run.init=models:/hibert-encoder@open-domain`), resolved
when a job starts. Two chains that share a tracking server (two users, or one chain queued behind
another) would pick up each other's encoders, so a chain gets an id when it is planned
(`<run.name>-<UTC time>-<4 hex>`) and:

* every training stage that registers a model registers it under `<its alias>-<chain id>`
  (`tracking.alias=...`; the alias is what `Task.registry_alias` would give: `tracking.alias`, else
  `run.stage` for pretraining, else "finetuned" for finetuning);
* every `run.init=models:/<name>@<alias>` of a later stage that names an alias an earlier stage of the
  chain writes (same store, same model) reads `<alias>-<chain id>` instead;
* any other `models:/<name>@<alias>` (or `/latest`) is pinned to the version it resolves to at submit
  time (`models:/<name>/<version>`); `--no-pin` leaves it to be resolved when the job starts.

This module is pure planning plus read-only registry look-ups; `slurm/stages.py` applies it to
`hibert submit` and `hibert/demo.py` to the local runner.
"""
from __future__ import annotations

import contextlib
import os
import re
import secrets
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hibert.config.ops import SlurmStage
from hibert.config.schema import Config
from hibert.heads import HeadError, get_head
from hibert.redact import redact_uri
from hibert.registry import client, parse_models_ref, sqlite_path, tracking_uri, versions_where

ALIAS_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")      # TrackingConfig.alias
CHAIN_ID_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")
MAX_ALIAS = 255                                           # MLflow's limit
TRAINING = ("pretrain", "finetune")


class ChainError(ValueError):
    """A chain whose hand-offs would be ambiguous, or a reference that cannot be pinned."""


# ---------------------------------------------------------------- ids and aliases

def _sanitise(s: str) -> str:
    s = re.sub(r"[^A-Za-z0-9_-]+", "-", s).strip("-")
    return s if s[:1].isalpha() else f"c{s}"


def new_chain_id(run_name: str, now: float | None = None) -> str:
    """`<run.name>-<UTC timestamp>-<4 random hex>`, usable inside an alias and as a directory name."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))
    return f"{_sanitise(run_name)[:40].rstrip('-_')}-{stamp}-{secrets.token_hex(2)}"


def check_chain_id(chain_id: str) -> str:
    if not CHAIN_ID_RE.fullmatch(chain_id) or len(chain_id) > 120:
        raise ChainError(f"chain id {chain_id!r} must match {CHAIN_ID_RE.pattern} (at most 120 characters)")
    return chain_id


def chain_alias(alias: str, chain_id: str) -> str:
    """The per-chain alias a stage registers under (matches ^[A-Za-z][A-Za-z0-9_-]*$)."""
    return _sanitise(f"{alias}-{chain_id}")[:MAX_ALIAS]


def written_model(command: str, cfg: Config) -> tuple[str, str] | None:
    """(registered model, alias) the stage's run registers, or None: the registered model of the head
    `finetune.task` names (hibert/heads.py), or the encoder's; tests/test_chain_handoff.py checks that this
    agrees with `Task.registry_name` / `registry_alias`."""
    if command not in TRAINING or not cfg.tracking.register_model:
        return None
    if command == "finetune":
        try:
            head = get_head(cfg.finetune.task)
        except HeadError as e:
            raise ChainError(str(e)) from None
        return head.registered_model, cfg.tracking.alias or "finetuned"
    alias = cfg.tracking.alias or (cfg.run.stage if cfg.run.stage != "none" else None)
    return (cfg.tracking.registered_model, alias) if alias else None


def store_uri(cfg: Config) -> str:
    """The registry a stage's run talks to (as the run resolves it; never creates a store)."""
    return tracking_uri(cfg.tracking.uri, cfg.run.output_dir, create=False)


# ---------------------------------------------------------------- linking the stages

@dataclass
class StageInput:
    stage: SlurmStage
    cfg: Config                       # the stage's config before any chain rewriting


@dataclass
class Link:
    """What the chain does to one stage's command line."""
    overrides: list[str] = field(default_factory=list)  # appended last: tracking.alias / run.init
    args: list[str] = field(default_factory=list)       # appended to the flags: --model (summarize stages)
    registers: str | None = None      # "name@alias" the stage will register
    reads: str | None = None          # the run.init it reads after rewriting (models:/...)
    reads_from: str | None = None     # the stage of this chain that writes it
    pin: tuple[str, str, str] | None = None  # (uri, name, alias or "latest") to pin at submit time
    pinned_from: str | None = None    # the reference that was pinned (set by the planner)
    original_init: str | None = None  # run.init as the recipe gave it


# Commands that write (or, evaluate, read) <output_dir>/<run.name>: each chain gets its own.
RUN_DIRS = ("pretrain", "finetune", "evaluate")
SUMMARIZE = ("summarize",)   # reads the model its --model flag names (the chain rewrites it as it does run.init)


def model_arg(args: Sequence[str]) -> str | None:
    """The last --model value of a stage's flags (argparse keeps the last)."""
    value = None
    for i, a in enumerate(args):
        if a == "--model" and i + 1 < len(args):
            value = args[i + 1]
        elif a.startswith("--model="):
            value = a.split("=", 1)[1]
    return value


def read_ref(st: SlurmStage, cfg: Config) -> str | None:
    """The model reference a stage reads: run.init (training), --model (summarize)."""
    if st.command in TRAINING:
        return cfg.run.init
    if st.command in SUMMARIZE:
        return model_arg(st.args)
    return None


def set_reads(st: SlurmStage, ln: "Link") -> None:
    """Point the stage at `ln.reads`: run.init for training, --model for summarize."""
    if st.command in SUMMARIZE:
        ln.args = ["--model", ln.reads]
    else:
        ln.overrides.append(f"run.init={ln.reads}")


def dependency_closure(stages: Sequence[SlurmStage]) -> dict[str, set[str]]:
    """Every stage's transitive `after` (left out: the previous stage; [] none)."""
    names = [s.name for s in stages]
    closure: dict[str, set[str]] = {}
    for i, s in enumerate(stages):
        direct = s.after if s.after is not None else names[i - 1:i]
        closure[s.name] = set(direct).union(*(closure[d] for d in direct)) if direct else set()
    return closure


def selected_after(stages: Sequence[SlurmStage], selected: set[str]) -> dict[str, list[str]]:
    """Each selected stage's dependencies among the selected stages: a left-out stage is taken as done,
    but what it waited for still comes first (open -> [x left out] -> in: in still waits for open)."""
    names = [s.name for s in stages]
    by_name = {s.name: (i, s) for i, s in enumerate(stages)}
    out: dict[str, list[str]] = {}
    for name in selected:
        i, s = by_name[name]
        todo, seen, deps = list(s.after if s.after is not None else names[i - 1:i]), set(), []
        while todo:
            d = todo.pop(0)
            if d in seen:
                continue
            seen.add(d)
            if d in selected:
                deps.append(d)
            else:
                j, ds = by_name[d]
                todo += list(ds.after if ds.after is not None else names[j - 1:j])
        out[name] = deps
    return out


def link(inputs: Sequence[StageInput], chain_id: str, selected: set[str], continuing: bool) -> dict[str, Link]:
    """The per-chain aliases of every selected stage. `continuing`: `chain_id` names a chain submitted
    earlier (`--chain`), whose left-out stages are taken as done; otherwise reading an alias that only
    a left-out stage writes is ambiguous (which run of it?) and refused."""
    closure = dependency_closure([i.stage for i in inputs])
    writers: dict[tuple[str, str, str], str] = {}   # (store, model, plain alias) -> stage
    links: dict[str, Link] = {}
    for inp in inputs:
        st, cfg = inp.stage, inp.cfg
        uri = store_uri(cfg)
        ln = Link()
        init = read_ref(st, cfg)
        ref = parse_models_ref(init) if init else None
        if ref is not None and st.name in selected:
            name, alias, version = ref
            ln.original_init = init
            writer = writers.get((uri, name, alias)) if alias else None
            if writer is None:                      # not this chain's: pin (a number needs nothing)
                if alias or version == "latest":
                    ln.pin = (uri, name, alias or "latest")
                ln.reads = init
            else:
                ln.reads = f"models:/{name}@{chain_alias(alias, chain_id)}"
                ln.reads_from = writer
                set_reads(st, ln)
                if writer in selected:
                    if writer not in closure[st.name]:
                        raise ChainError(f"stage {st.name} reads models:/{name}@{alias}, which stage {writer} "
                                         f"of this chain registers, but does not wait for it: add {writer} "
                                         f"to its after:")
                elif not continuing:
                    raise ChainError(
                        f"stage {st.name} reads models:/{name}@{alias}, which stage {writer} registers, but "
                        f"{writer} is not submitted now: pass --chain <id> to read what {writer} of an earlier "
                        f"chain registered (ids are in jobs.json), or set the stage's run.init to a version "
                        f"(models:/{name}/<version>)")
                else:                               # taken as done in the continued chain: freeze it now
                    ln.pin = (uri, name, chain_alias(alias, chain_id))
        wrote = written_model(st.command, cfg)
        if wrote is not None:
            key = (uri, *wrote)
            if key in writers and writers[key] != st.name:
                raise ChainError(f"stages {writers[key]} and {st.name} both register {wrote[0]}@{wrote[1]}; "
                                 f"give one of them its own tracking.alias")
            writers[key] = st.name
            if st.name in selected:
                ca = chain_alias(wrote[1], chain_id)
                ln.overrides.insert(0, f"tracking.alias={ca}")
                ln.overrides.insert(1, f"tracking.also_aliases=[{wrote[1]}]")  # for people; the chain reads ca
                ln.registers = f"{wrote[0]}@{ca}"
        if st.name in selected:
            if st.command in RUN_DIRS:  # a chain's runs never resume (or "finish") another chain's run dirs
                ln.overrides.append(f"run.name={cfg.run.name}-{chain_id}")
            links[st.name] = ln
    return links


# ---------------------------------------------------------------- pinning

@contextlib.contextmanager
def _fail_fast() -> Iterator[None]:
    """An unreachable tracking server should fail in seconds, not after MLflow's minutes of retries."""
    saved = {k: os.environ.get(k) for k in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT")}
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def resolve_version(uri: str, name: str, alias: str) -> str:
    """The version `models:/name@alias` (alias "latest": the newest version) points at now. Read-only:
    a missing local sqlite store is reported, not created. Raises ChainError."""
    shown = redact_uri(uri)
    db = sqlite_path(uri)
    if db is not None and not db.is_file():
        raise ChainError(f"cannot pin models:/{name}@{alias}: the registry {shown} does not exist (yet)")
    from mlflow.exceptions import MlflowException  # lazy: ~1.0 s, paid only when submit pins a registry alias

    with _fail_fast():
        try:
            c = client(uri)
            if alias == "latest":
                versions = [int(v.version) for v in versions_where(c, name=name)]
                if not versions:
                    raise ChainError(f"cannot pin models:/{name}/latest: {name} has no versions in {shown}")
                return str(max(versions))
            return str(c.get_model_version_by_alias(name, alias).version)
        except MlflowException as e:
            code = getattr(e, "error_code", "")
            if code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE", "NOT_FOUND"):
                raise ChainError(f"cannot pin models:/{name}@{alias}: not in the registry {shown} "
                                 f"({str(e).splitlines()[0][:200]})") from None
            raise ChainError(f"cannot pin models:/{name}@{alias}: the registry {shown} is not reachable "
                             f"({str(e).splitlines()[0][:200]})") from None
        except OSError as e:
            raise ChainError(f"cannot pin models:/{name}@{alias}: the registry {shown} is not reachable ({e})") \
                from None


# ---------------------------------------------------------------- what a stage's data can do

def has_summaries(source) -> bool:
    """cnndm .story files carry @highlight summaries; jsonl/hf have them when summary_field is set;
    gigaword and plain text never do."""
    return source.format in ("cnndm", "multinews") or (source.format in ("jsonl", "hf") and bool(source.summary_field))


def check_summaries(stage: SlurmStage, cfg: Config) -> None:
    """Finetuning (and evaluating) needs a reference summary for every document. Checked on the
    stage's resolved config; a stage that names only a prepared dataset (no sources) is not checked."""
    if stage.command not in ("finetune", "evaluate"):
        return
    d = cfg.data
    if not d.sources or (d.dataset and Path(d.dataset) != Path(d.output)):
        return
    missing = [s for s in d.sources if not has_summaries(s)]
    if missing:
        listed = ", ".join(f"{s.format}:{s.path}" + (" (no summaries)" if s in missing else "") for s in d.sources)
        raise ChainError(f"stage {stage.name} (hibert {stage.command}) needs documents with summaries, but its "
                         f"data sources are {listed}; give it data with summaries (cnndm .story files, or "
                         f"jsonl/hf with summary_field)")
