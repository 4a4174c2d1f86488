"""What MLflow has not received yet: `<run dir>/tracking/outbox.jsonl`, one operation per line, in order.

A tracking server that goes away mid-run must not stop training nor lose what the run logs. The tracker
(`hibert.runtime.tracking`) writes every call that cannot reach the server here and sends the whole outbox,
in order, once the server answers again — during the run, at its end (waiting up to
`tracking.outage_wait_s`), when a requeued job starts, or by hand with `hibert registry sync <run dir>`.

Operations (each carries its `run_id`): `metrics` (values, step, timestamp: re-sent with the time they were
measured), `artifacts` (a local directory that stays in the run directory), `register` (a model version of
the export, then `registry.json` is rewritten with its number), `resume` (the rest of a run's start: status
RUNNING, its tags, a new run's params) and `end` (the run's final status).

An operation the server *refuses* (a 4xx: a bad value, a permission) is not retried forever: it moves to
`outbox.rejected.jsonl` with the server's message, and is counted in the warning; `hibert registry sync RUN_DIR
--rejected` queues them again once the cause is fixed (an expired token renewed). A 5xx (a reverse proxy whose
backend is down, an overloaded server) is an outage like no answer at all: the operation stays queued.
"""
from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hibert.redact import redact_uri

log = logging.getLogger("hibert.tracking")

OUTBOX = Path("tracking") / "outbox.jsonl"
REJECTED = Path("tracking") / "outbox.rejected.jsonl"
MAX_METRICS_PER_BATCH = 1000   # MLflow's log_batch limit


class Outbox:
    """Append-only JSON Lines of pending operations under one run directory."""

    def __init__(self, run_dir: str | Path):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / OUTBOX
        self.rejected_path = self.run_dir / REJECTED

    def append(self, op: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._cut_partial_tail()
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(op, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())  # a kill -9 right after must not lose what the run believes is kept

    def _cut_partial_tail(self) -> None:
        """Drop a last line cut short by a crash mid-write (never acknowledged) before appending: a new line
        joined onto it would make one bad line in the middle, losing that operation and every later read."""
        try:
            with self.path.open("r+b") as f:
                size = f.seek(0, os.SEEK_END)
                if size == 0:
                    return
                f.seek(size - 1)
                if f.read(1) == b"\n":
                    return
                f.seek(0)
                keep = f.read().rfind(b"\n") + 1
                f.truncate(keep)
                f.flush()
                os.fsync(f.fileno())
        except FileNotFoundError:
            return
        log.warning("%s: the last line was cut short by a crash while being written; dropped", self.path)

    def read(self) -> list[dict[str, Any]]:
        """The pending operations. A last line cut short by a crash mid-write is dropped (it was never
        acknowledged to the caller: `append` returns after the fsync); any other bad line is an error."""
        if not self.path.is_file():
            return []
        lines = self.path.read_text(encoding="utf-8").splitlines()
        ops = []
        for i, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                ops.append(json.loads(line))
            except ValueError:
                if i == len(lines):
                    log.warning("%s: line %d was cut short by a crash while being written; dropped", self.path, i)
                    continue
                raise ValueError(f"{self.path}: line {i} is not JSON; the outbox is damaged") from None
        return ops

    def __len__(self) -> int:
        return len(self.read())

    def replace(self, ops: list[dict[str, Any]]) -> None:
        """Keep only `ops` (what is left after a partial send), atomically."""
        if not ops:
            self.path.unlink(missing_ok=True)
            return
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(op, sort_keys=True) + "\n" for op in ops), encoding="utf-8")
        tmp.replace(self.path)

    def reject(self, op: dict[str, Any], reason: str) -> None:
        self.rejected_path.parent.mkdir(parents=True, exist_ok=True)
        with self.rejected_path.open("a", encoding="utf-8") as f:
            f.write(json.dumps({**op, "rejected": reason[:500], "rejected_at": time.time()}, sort_keys=True) + "\n")

    def requeue_rejected(self) -> int:
        """Put the operations the server refused back in front of the pending ones (they are older), for a send
        after what it refused is fixed (an expired token, a permission). Returns how many."""
        if not self.rejected_path.is_file():
            return 0
        ops = []
        for line in self.rejected_path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                try:
                    op = json.loads(line)
                except ValueError:
                    continue   # a line cut by a crash while it was written: never an acknowledged operation
                ops.append({k: v for k, v in op.items() if k not in ("rejected", "rejected_at")})
        self.replace(ops + self.read())
        self.rejected_path.unlink()
        return len(ops)

    def rejected(self) -> int:
        if not self.rejected_path.is_file():
            return 0
        return sum(1 for line in self.rejected_path.read_text(encoding="utf-8").splitlines() if line.strip())


def batches(ops: list[dict[str, Any]]) -> list[tuple[int, int]]:
    """[start, end) ranges to send as one call: consecutive `metrics` of one run merge into one log_batch (up
    to MLflow's limit); anything else goes alone."""
    out: list[tuple[int, int]] = []
    i = 0
    while i < len(ops):
        j = i + 1
        if ops[i]["op"] == "metrics":
            n = len(ops[i]["values"])
            while (j < len(ops) and ops[j]["op"] == "metrics" and ops[j]["run_id"] == ops[i]["run_id"]
                   and n + len(ops[j]["values"]) <= MAX_METRICS_PER_BATCH):
                n += len(ops[j]["values"])
                j += 1
        out.append((i, j))
        i = j
    return out


def http_status(e: BaseException) -> int | None:
    """The HTTP status an exception carries: an MlflowException's (500 when MLflow wraps a connection failure
    or exhausted retries), a requests HTTPError's (the artifact proxy raises those); None for anything else."""
    code = getattr(e, "get_http_status_code", None)
    if callable(code):
        try:
            return int(code())
        except (TypeError, ValueError):
            return None
    response = getattr(e, "response", None)
    status = getattr(response, "status_code", None)
    return status if isinstance(status, int) else None


# "later": too many requests, unavailable, gateway timeout. Not 500: MLflow reports a proxy's 502 and a non-JSON
# 4xx (413, 422) as 500 too, so a 500 is an outage only if the server's /health says so (`drain`'s probe).
_LATER = (429, 503, 504)


def refused(e: BaseException) -> bool:
    """Whether the server answered and refused the operation itself (a 4xx but 429): sending it again will not
    help."""
    status = http_status(e)
    return status is not None and status < 500 and status not in _LATER


def transient(e: BaseException) -> bool:
    """A failure that says nothing against the operation: no answer at all, or "later" (429, 503, 504)."""
    import requests  # lazy: ~60 ms, which every command importing the outbox (the CLI) would pay

    return http_status(e) in _LATER or isinstance(e, (requests.ConnectionError, requests.Timeout, ConnectionError,
                                                      TimeoutError))


def drain(outbox: Outbox, send: Callable[[list[dict[str, Any]]], None],
          reachable: Callable[[], bool]) -> int:
    """Send the outbox in order through `send` (one batch of ops per call). Stops at the first batch that
    fails transiently (no answer, 429/503/504) or while the server is unreachable (its /health fails or answers
    5xx): that batch and the rest stay. A batch the server refuses (a 4xx), or that fails otherwise while the
    server answers (a 500 from a healthy server), is retried once, then rejected, so that one bad operation
    cannot hold back every later one. Returns how many operations are still pending."""
    ops = outbox.read()
    for start, end in batches(ops):
        chunk = ops[start:end]
        for attempt in (1, 2):
            try:
                send(chunk)
                break
            except Exception as e:  # noqa: BLE001 - MLflow raises many kinds; the status and reachability decide
                if not refused(e) and (transient(e) or not reachable()):
                    outbox.replace(ops[start:])
                    return len(ops) - start
                if attempt == 2:

                    reason = redact_uri(f"{type(e).__name__}: {e}".splitlines()[0])
                    for op in chunk:
                        outbox.reject(op, reason)
                    log.warning("tracking server refused %d %s operation(s): %s (kept in %s)", len(chunk),
                                chunk[0]["op"], reason[:200], outbox.rejected_path)
    outbox.replace([])
    return 0
