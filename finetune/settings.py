"""Typed settings of `hibert evaluate` and `hibert summarize`, built once from the command line by the CLI
and handed to the heads' library functions (which never see argparse)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class GivenFlags:
    """The settings flags given on the command line: flag -> value (--beam: 4); the rest, the export's own
    settings decide. Which flags exist is the heads' (finetune/inference/flags.py)."""
    flags: dict[str, Any] = field(default_factory=dict)


@dataclass
class EvalSettings(GivenFlags):
    split: str = "test"
    out: Path | None = None              # report directory (default: <run dir>/report-<split>)
    bootstrap: int = 1000                # resamples for CIs and paired differences
    compare: list[str] = field(default_factory=list)   # NAME=REPORT of other runs, paired by document
    limit: int | None = None             # score only the first N documents / clusters
    budget_tokens: int | None = None     # clusters: source tokens read (default: as trained)
    ranking: str | None = None           # clusters: unit ranking (default: as trained)

    def report_dir(self, run_dir: Path) -> Path:
        return Path(self.out) if self.out else run_dir / f"report-{self.split}"


@dataclass
class SummarizeSettings(GivenFlags):
    ranking: str | None = None           # clusters: unit ranking (default: as trained)


def model_ref(cfg, ref: str | None) -> str:
    """--model, else the run's own export (`<run dir>/export`)."""
    return ref or str(cfg.run_dir / "export")


def default_device() -> str:
    import torch  # ~1 s: only when a model is about to load

    return "cuda" if torch.cuda.is_available() else "cpu"
