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
    if level > logging.DEBUG:  # DeepSpeed's own calls of torch APIs it has not migrated yet, once per step
        warnings.filterwarnings("ignore", message=r".*all_gather_into_tensor.* is deprecated", category=FutureWarning)
        warnings.filterwarnings("ignore", message=r".*reduce_scatter_tensor.* is deprecated", category=FutureWarning)


class RedactingFormatter(logging.Formatter):
    """A log line (with its traceback, if any) with credentials masked."""

    def format(self, record: logging.LogRecord) -> str:
        return redact_text(super().format(record))


def redacted_excepthook(kind, value, tb) -> None:
    """An uncaught exception's traceback, masked, on stderr (Python's own hook would print it raw)."""
    sys.stderr.write(redact_text("".join(traceback.format_exception(kind, value, tb))))
