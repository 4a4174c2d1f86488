"""One logging setup for every command: a level chosen once (`hibert --log-level`, inherited by the ranks a
launcher starts through $HIBERT_LOG_LEVEL), rank-tagged lines, and third-party chatter kept at WARNING.
Everything it writes — log lines, and the traceback of an exception nobody caught (an MLflow error quoting its
store URI, on a cluster the job's .err file) — goes through the credential redaction first."""
from __future__ import annotations

import logging
import os
import sys
import traceback
import warnings

from hibert.redact import redact_text

LEVEL_ENV = "HIBERT_LOG_LEVEL"
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
# Libraries that log at INFO on every run (DeepSpeed's config dumps, MLflow's run/store messages,
# alembic's migrations of a fresh sqlite store, HTTP clients): operators read our lines, not theirs.
NOISY = ("DeepSpeed", "deepspeed", "mlflow", "alembic", "urllib3", "httpx", "git", "matplotlib",
         "torch.distributed", "filelock", "stanza", "datasets", "absl")


def set_level(level: str | None) -> None:
    """Remember the chosen level for this process and every process it starts."""
    if level:
        os.environ[LEVEL_ENV] = level.upper()


def setup_logging(rank: int = 0) -> None:
    """Rank 0 logs at the chosen level (INFO by default); other ranks only warnings, unless DEBUG."""
    chosen = os.environ.get(LEVEL_ENV, "INFO").upper()
    level = getattr(logging, chosen if chosen in LEVELS else "INFO")
    if rank != 0 and level > logging.DEBUG:
        level = max(level, logging.WARNING)
    logging.basicConfig(level=level, format=f"%(asctime)s [rank{rank}] %(name)s: %(message)s", force=True)
    for handler in logging.getLogger().handlers:
        handler.setFormatter(RedactingFormatter(handler.formatter._fmt if handler.formatter else None))
    sys.excepthook = redacted_excepthook
    third_party = logging.DEBUG if level <= logging.DEBUG else logging.WARNING
    for name in NOISY:
        logging.getLogger(name).setLevel(third_party)
    store = logging.getLogger(MLFLOW_STORE_LOGGER)
    for f in [f for f in store.filters if isinstance(f, OneLinePerError)]:
        store.removeFilter(f)
    if level > logging.DEBUG:
        store.addFilter(OneLinePerError())
    if level > logging.DEBUG:  # DeepSpeed's own calls of torch APIs it has not migrated yet, once per step
        warnings.filterwarnings("ignore", message=r".*all_gather_into_tensor.* is deprecated", category=FutureWarning)
        warnings.filterwarnings("ignore", message=r".*reduce_scatter_tensor.* is deprecated", category=FutureWarning)


# MLflow's SQL stores log every failed write with its whole traceback (`_logger.exception`, ~40 lines with the
# exceptions chained to it) and then raise it to the caller, which reports it (the tracker: its outbox, or the run's
# one line). A full disk under a sqlite store printed ~360 such lines before the run's own line.
MLFLOW_STORE_LOGGER = "mlflow.store.db.utils"


class OneLinePerError(logging.Filter):
    """A record with a traceback becomes one line naming the error (the database's own message), once per
    distinct error; DEBUG keeps the tracebacks (this filter is not installed there)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.exc_info or record.exc_info[1] is None:
            return True
        e = record.exc_info[1]
        reason = str(getattr(e, "orig", None) or e).strip().splitlines()
        reason_line = (reason[0] if reason else type(e).__name__)[:300]
        if reason_line in self.seen:
            return False
        self.seen.add(reason_line)
        record.msg, record.args = f"database error: {reason_line} (the operation that failed reports it)", ()
        record.exc_info = record.exc_text = None
        return True


class RedactingFormatter(logging.Formatter):
    """A log line (with its traceback, if any) with credentials masked."""

    def format(self, record: logging.LogRecord) -> str:
        return redact_text(super().format(record))


def redacted_excepthook(kind, value, tb) -> None:
    """An uncaught exception's traceback, masked, on stderr (Python's own hook would print it raw)."""
    sys.stderr.write(redact_text("".join(traceback.format_exception(kind, value, tb))))
