"""One logging setup for every command: a level chosen once (`hibert --log-level`, inherited by the ranks a
launcher starts through $HIBERT_LOG_LEVEL), rank-tagged lines, and third-party chatter kept at WARNING."""
from __future__ import annotations

import logging
import os
import warnings

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
    third_party = logging.DEBUG if level <= logging.DEBUG else logging.WARNING
    for name in NOISY:
        logging.getLogger(name).setLevel(third_party)
    if level > logging.DEBUG:  # DeepSpeed's own calls of torch APIs it has not migrated yet, once per step
        warnings.filterwarnings("ignore", message=r".*all_gather_into_tensor.* is deprecated", category=FutureWarning)
        warnings.filterwarnings("ignore", message=r".*reduce_scatter_tensor.* is deprecated", category=FutureWarning)
