"""MLflow on rank 0: one run per training job (kept across resumes), params, metrics, artifacts, tags.

A server that goes away mid-run does not stop training: what cannot be sent waits, in order, in the run's
outbox (`hibert.runtime.outbox`) and is re-sent when a probe finds the server back. Calls while it is away
cost nothing (no MLflow retries per step: one probe every `tracking.retry_every_s`).

Params are the flattened config with credentials masked (`hibert.redact`): tracking URIs with
user:password, `slurm.env` tokens and `export SECRET=...` setup lines never reach the tracking server.
"""
from __future__ import annotations

import json
import logging
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

from hibert.config import Config, config_to_dict
from hibert.durable import write_atomic
from hibert.errors import UserError, disk_full
from hibert.redact import redact_config_dict, redact_uri
from hibert.registry import client, experiment_id, reachable, register_artifact_dir, tracking_uri
from hibert.runtime.outbox import Outbox, drain, refused, transient

LOGGED_STEPS = Path("tracking") / "logged_steps.json"  # under the run directory, beside the outbox

log = logging.getLogger(__name__)


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
                              cwd=Path(__file__).resolve().parent).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def code_revision() -> dict[str, Any]:
    """The commit of the code writing a results file and whether its tree was clean (`git status --porcelain`
    at the repository root; files already under docs/results are outputs, not source changes)."""
    root = Path(__file__).resolve().parents[2]

    def git(*argv: str) -> subprocess.CompletedProcess | None:
        try:
            return subprocess.run(["git", *argv], check=False, cwd=root, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            return None

    head = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--", ".", ":(exclude)docs/results")
    if head is None or head.returncode != 0 or status is None or status.returncode != 0:
        return {"commit": "unknown", "clean": None}
    return {"commit": head.stdout.strip(), "clean": not status.stdout.strip()}


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = str(v)[:500]
    return out


def config_params(cfg: Config) -> dict[str, str]:
    """What `Tracker.start` logs as MLflow params: the flattened config, secrets masked."""
    return _flatten(redact_config_dict(config_to_dict(cfg)))


class Tracker:
    """No-op on ranks other than 0."""

    def __init__(self, cfg: Config, enabled: bool, run_dir: Path | None = None):
        self.enabled = enabled
        self.uri = tracking_uri(cfg.tracking.uri, cfg.run.output_dir)
        self.run_id: str | None = None
        self.cfg = cfg
        self.outbox = Outbox(run_dir if run_dir is not None else cfg.run_dir)
        self.offline_since: float | None = None   # when the server stopped answering (None: it answers)
        self.last_probe = 0.0
        # per metric, the last step this run logged (sent or queued): a run resumed from a checkpoint older than
        # its last logged step replays those steps bit for bit and must not log them a second time
        self.logged_path = self.outbox.run_dir / LOGGED_STEPS
        self._logged: dict[str, int] | None = None
        self._replays_from: int | None = None  # set by `new_timeline_after`
        self._record_warned = False

    # ------------------------------------------------------------ the run
    def start(self, run_id: str | None, tags: dict[str, str]) -> str | None:
        """The MLflow run of this job: created, or (a resume) set RUNNING again. The server was checked before the
        ranks started but may be gone by now: a run that has its id (a resume, or created just before the server
        went) trains on and the rest of its start waits in the outbox; a new run needs its id from the server, so
        it waits for it up to `outage_wait_s`, then stops in one line."""
        if not self.enabled:
            return None
        self.sync()  # what an earlier attempt of this run left (a requeue after an outage)
        tags = {k: redact_uri(str(v)) for k, v in {**tags, "git_commit": git_commit()}.items()}
        params = None if run_id is not None else config_params(self.cfg)
        deadline = time.monotonic() + self.cfg.tracking.outage_wait_s
        while True:
            created: list[str] = []
            try:
                return self._start(run_id, tags, params, created)
            except Exception as e:  # noqa: BLE001 - MLflow raises many kinds; the status and the probe decide
                if refused(e) or not (transient(e) or not self._reachable()):
                    raise   # a refusal, or an error from a server (or local store) that answers: not an outage
                reason = redact_uri(str(e).splitlines()[0] if str(e) else type(e).__name__)[:200]
            if run_id is not None or created:
                self.run_id = run_id or created[0]
                self.outbox.append({"op": "resume", "run_id": self.run_id, "tags": tags, "params": params or {}})
                self.offline_since = self.last_probe = time.monotonic()
                log.warning("tracking server %s stopped answering (%s); training goes on, logging to %s until it "
                            "is back", redact_uri(self.uri), reason, self.outbox.path)
                return self.run_id
            while time.monotonic() < deadline:   # probe every retry_every_s; try again once it answers
                time.sleep(min(self.cfg.tracking.retry_every_s, max(0.0, deadline - time.monotonic())))
                if self._reachable():
                    break
            else:
                raise UserError(f"tracking server {redact_uri(self.uri)} stopped answering before the run started "
                                f"({reason}; waited {self.cfg.tracking.outage_wait_s:.0f} s, "
                                "tracking.outage_wait_s): start it and rerun, or requeue; nothing was trained")

    def _start(self, run_id: str | None, tags: dict[str, str], params: dict[str, str] | None,
               created: list[str]) -> str:
        """`created` receives a new run's id as soon as the server made it (the calls after it may still fail)."""
        from mlflow.entities import Param, RunTag  # lazy: MLflow ~1 s, only where a run is sent

        c = client(self.uri)
        if run_id is None:
            run_id = c.create_run(experiment_id(self.uri, self.cfg.tracking.experiment),
                                  run_name=self.cfg.run.name).info.run_id
            created.append(run_id)
            c.log_batch(run_id, params=[Param(k, v) for k, v in (params or {}).items()])
        else:
            c.update_run(run_id, status="RUNNING")
        c.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()])
        self.run_id = run_id
        return run_id

    def metrics(self, values: dict[str, float], step: int) -> None:
        """Log `values` at `step`, each metric at most once per step: after a kill -9 the resumed run trains again
        from its checkpoint through steps whose metrics the killed process had logged already (the same values,
        the resume being exact), and those are left out instead of doubling the run's history."""
        if not self.enabled or self.run_id is None:
            return
        logged = self._logged_steps()
        fresh = {k: float(v) for k, v in values.items() if int(step) > logged.get(k, -1)}
        if not fresh:
            return
        self._call({"op": "metrics", "values": fresh, "step": int(step), "timestamp": int(time.time() * 1000)})
        logged.update({k: int(step) for k in fresh})
        try:  # durable (a power loss must not roll the record back behind what the server holds)
            self.logged_path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(self.logged_path, json.dumps({"run_id": self.run_id, "steps": logged}),
                         tmp=self.logged_path.with_suffix(".tmp"))
        except OSError as e:  # a full disk: rank 0 alone must not stop here (the others would wait in a collective)
            if not self._record_warned:
                log.warning("cannot record the logged steps in %s (%s): a resume after a kill may log some steps "
                            "twice", self.logged_path, e)
                self._record_warned = True

    def new_timeline_after(self, step: int) -> None:
        """The run goes on from `step` on another timeline than the one it logged (a rollback to an older
        checkpoint, or a changed config): what it logs after `step` is new, not a replay, and is logged."""
        self._replays_from = int(step)
        if self._logged is not None:
            self._logged = {k: min(v, self._replays_from) for k, v in self._logged.items()}

    def _logged_steps(self) -> dict[str, int]:
        """The record for this MLflow run (another run's, e.g. the run directory started over, does not count)."""
        if self._logged is None:
            try:
                saved = json.loads(self.logged_path.read_text())
                self._logged = ({k: int(v) for k, v in saved["steps"].items()}
                                if saved.get("run_id") == self.run_id else {})
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                self._logged = {}
            if self._replays_from is not None:
                self._logged = {k: min(v, self._replays_from) for k, v in self._logged.items()}
        return self._logged

    def artifacts(self, local_dir: Path, artifact_path: str) -> None:
        self._call({"op": "artifacts", "dir": str(Path(local_dir).resolve()), "path": artifact_path})

    def register(self, artifact_path: str, name: str, alias: str | None, tags: dict[str, str],
                 also: list[str], registry_json: Path, description: str | None = None) -> str | None:
        """The version number, or None when the registration waits in the outbox (`registry.json` says
        `pending` until it is sent)."""
        op = {"op": "register", "path": artifact_path, "name": name, "alias": alias, "tags": tags,
              "also": list(also), "registry_json": str(Path(registry_json).resolve()), "description": description}
        return self._call(op)

    def end(self, status: str = "FINISHED") -> None:
        self._call({"op": "end", "status": status})

    # ------------------------------------------------------------ outages
    def pending(self) -> int:
        return len(self.outbox) if self.enabled else 0

    def rejected(self) -> int:
        return self.outbox.rejected() if self.enabled else 0

    def sync(self, wait_s: float = 0.0) -> int:
        """Send the outbox; while the server stays away, probe every `retry_every_s` for up to `wait_s`.
        Returns how many operations are still pending."""
        if not self.enabled:
            return 0
        deadline = time.monotonic() + wait_s
        while True:
            left = drain(self.outbox, lambda ops: send(self.uri, ops), self._reachable) if len(self.outbox) else 0
            if left == 0:
                if self.offline_since is not None:
                    log.warning("tracking server %s is back after %.0f s; the outbox is sent",
                                redact_uri(self.uri), time.monotonic() - self.offline_since)
                self.offline_since = None
                return 0
            if time.monotonic() >= deadline:
                return left
            time.sleep(min(self.cfg.tracking.retry_every_s, max(0.0, deadline - time.monotonic())))

    def _reachable(self) -> bool:
        self.last_probe = time.monotonic()
        return reachable(self.uri)

    def _call(self, op: dict[str, Any]) -> Any:
        if not self.enabled or self.run_id is None:
            return None
        op = {**op, "run_id": self.run_id}
        if self.offline_since is not None:
            if time.monotonic() - self.last_probe < self.cfg.tracking.retry_every_s or not self._reachable():
                self.outbox.append(op)
                return None
            if self.sync():  # back, but the outbox did not all go through: keep order
                self.outbox.append(op)
                return None
        try:
            return send(self.uri, [op])
        except Exception as e:  # noqa: BLE001 - MLflow raises many kinds; reachability decides
            if op["op"] in ("artifacts", "register") and disk_full(e):
                # a full artifact store: registering now would point a version at a partial copy
                raise
            self.outbox.append(op)
            if drain(self.outbox, lambda ops: send(self.uri, ops), self._reachable) == 0:
                # the server answers: sent on the retry, or refused (kept in outbox.rejected.jsonl, warned)
                return _version(op)
            self.offline_since = time.monotonic()
            log.warning("tracking server %s stopped answering (%s); training goes on, logging to %s until it is "
                        "back (probed every %.0f s)", redact_uri(self.uri),
                        redact_uri(str(e).splitlines()[0] if str(e) else type(e).__name__)[:200],
                        self.outbox.path, self.cfg.tracking.retry_every_s)
            return None


def _version(op: dict[str, Any]) -> str | None:
    """The version a `register` operation became, as the export's registry.json records it once sent."""
    if op["op"] != "register":
        return None
    try:
        return json.loads(Path(op["registry_json"]).read_text()).get("version")
    except (OSError, ValueError):
        return None

def send(uri: str, ops: list[dict[str, Any]]) -> Any:
    """Deliver one batch of outbox operations (several `metrics` of one run, or one other operation)."""
    c = client(uri)
    op = ops[0]
    kind, run_id = op["op"], op.get("run_id")
    if kind == "evaluation":
        return _send_evaluation(uri, op)
    if kind == "metrics":
        from mlflow.entities import Metric  # lazy: MLflow ~1 s, only where a run is sent

        c.log_batch(run_id, metrics=[Metric(k, v, o["timestamp"], o["step"]) for o in ops
                                     for k, v in o["values"].items()])
        return None
    if kind == "artifacts":
        c.log_artifacts(run_id, op["dir"], artifact_path=op["path"])
        return None
    if kind == "register":
        version = register_artifact_dir(uri, run_id, op["path"], op["name"], op["alias"], tags=op["tags"],
                                        also=op["also"], once=True, description=op.get("description"))
        registry_json = Path(op["registry_json"])
        if registry_json.parent.is_dir():  # the export says which version it became
            registry_json.write_text(json.dumps({"version": version, "uri": redact_uri(uri)}))
        log.info("registered %s version %s (alias %s)", op["name"], version,
                 ", ".join(dict.fromkeys([a for a in [op["alias"], *op["also"]] if a])))
        return version
    if kind == "end":
        c.set_terminated(run_id, status=op["status"])
        return None
    if kind == "resume":  # the rest of a run's start, when the server went away during it
        from mlflow.entities import Param, RunTag  # lazy: MLflow ~1 s, only where a run is sent

        c.update_run(run_id, status="RUNNING")
        c.log_batch(run_id, params=[Param(k, v) for k, v in op.get("params", {}).items()],
                    tags=[RunTag(k, v) for k, v in op["tags"].items()])
        return None
    raise ValueError(f"unknown outbox operation {kind!r}")


def evaluation_op(outbox: Outbox, experiment: str, run_name: str, tags: dict[str, str], params: dict[str, str],
                  metrics: dict[str, float], report_dir: Path, table: dict[str, list] | None) -> dict[str, Any]:
    """A whole `hibert evaluate` MLflow run as one outbox operation: sent at once when the server answers,
    else kept until `hibert registry sync`. Its `id` makes a resend after a partial one reuse the same run; the
    per-document `table` waits in a file next to the outbox."""

    op_id = uuid.uuid4().hex
    table_path = None
    if table:
        table_path = outbox.path.parent / f"evaluation-{op_id}.table.json"
        table_path.parent.mkdir(parents=True, exist_ok=True)
        table_path.write_text(json.dumps(table))
    return {"op": "evaluation", "id": op_id, "experiment": experiment, "run_name": run_name,
            "tags": tags, "params": params, "metrics": metrics, "timestamp": int(time.time() * 1000),
            "dir": str(Path(report_dir).resolve()), "table": None if table_path is None else str(table_path.resolve())}


def _send_evaluation(uri: str, op: dict[str, Any]) -> str:
    from mlflow.entities import Metric, Param, RunTag  # lazy: MLflow ~1 s, only where a run is sent

    c = client(uri)
    eid = experiment_id(uri, op["experiment"])
    found = c.search_runs([eid], filter_string=f"tags.hibert_outbox_id = '{op['id']}'", max_results=1)
    tags = dict(op["tags"])
    parent = tags.get("finetune_run")
    if parent and _run_in(c, parent, eid):   # nested under the run it evaluates, where that run is in this experiment
        tags["mlflow.parentRunId"] = parent
    run_id = found[0].info.run_id if found else c.create_run(eid, run_name=op["run_name"]).info.run_id
    c.log_batch(run_id, metrics=[Metric(k, float(v), op["timestamp"], 0) for k, v in op["metrics"].items()],
                params=[Param(k, str(v)) for k, v in op["params"].items()],
                tags=[RunTag(k, str(v)) for k, v in {**tags, "hibert_outbox_id": op["id"]}.items()])
    c.log_artifacts(run_id, op["dir"], artifact_path="report")
    table_file = "report/per_document.json"
    # per-document ROUGE per system: comparable across runs in the MLflow UI. log_table appends to an existing
    # file, so a resend whose first try got this far must not log it again
    if op["table"] and not (found and any(f.path == table_file for f in c.list_artifacts(run_id, "report"))):
        c.log_table(run_id, data=json.loads(Path(op["table"]).read_text()), artifact_file=table_file)
    c.set_terminated(run_id, status="FINISHED")
    if op["table"]:
        Path(op["table"]).unlink(missing_ok=True)
    return run_id


def _run_in(c: Any, run_id: str, experiment: str) -> bool:
    try:
        return c.get_run(run_id).info.experiment_id == experiment
    except Exception:  # noqa: BLE001 - not in this store (MLflow raises its own kinds)
        return False
