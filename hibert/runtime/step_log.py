"""What an operator reads: a start-up banner per run and one line per logging window,
`step i/N loss=... | tokens/s ... mfu ... data-wait ... | lr ... | eta ...`, loss first."""
from __future__ import annotations

import logging
import time
from typing import Any

log = logging.getLogger("hibert.train")

# Shown first, in this order, when present; then throughput; then the rest alphabetically.
_FIRST = ("train_loss", "train_ppl", "train_accuracy")
_SPEED = ("tokens_per_s", "mfu", "data_wait_fraction", "steps_per_s", "collate_ms",
          "data_ms", "forward_ms", "backward_ms", "optimizer_ms")   # the last four: tracking.step_breakdown


def format_duration(seconds: float) -> str:
    seconds = int(max(0, seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


def _fmt(key: str, value: float) -> str:
    if key in ("mfu", "data_wait_fraction"):
        return f"{key.replace('_fraction', '')}={100 * value:.1f}%"
    if key == "tokens_per_s":
        return f"tokens/s={value:,.0f}"
    if key == "lr":
        return f"lr={value:.3g}"
    return f"{key}={value:.4g}"


def metric_line(metrics: dict[str, float]) -> str:
    first = [k for k in _FIRST if k in metrics]
    speed = [k for k in _SPEED if k in metrics]
    rest = sorted(k for k in metrics if k not in first and k not in speed)
    parts = [" ".join(_fmt(k, metrics[k]) for k in first), " ".join(_fmt(k, metrics[k]) for k in speed),
             " ".join(_fmt(k, metrics[k]) for k in rest)]
    return " | ".join(p for p in parts if p)


class StepLog:
    """Step lines with progress against the planned total and an ETA from this process's own pace
    (a resumed run does not count the steps it inherited)."""

    def __init__(self, total_steps: int, start_step: int, enabled: bool):
        self.enabled = enabled
        self.begin(total_steps, start_step)

    def begin(self, total_steps: int, start_step: int) -> None:
        """The planned total, and the step this process starts from: its pace is timed from now."""
        self.total, self.t0, self.step0 = total_steps, time.perf_counter(), start_step

    def eta(self, step: int) -> float | None:
        done = step - self.step0
        if done <= 0:
            return None
        return (time.perf_counter() - self.t0) / done * max(0, self.total - step)

    def line(self, step: int, metrics: dict[str, float]) -> str:
        eta = self.eta(step)
        tail = f" | eta {format_duration(eta)}" if eta is not None else ""
        return f"step {step}/{self.total} {metric_line(metrics)}{tail}"

    def step(self, step: int, metrics: dict[str, float]) -> None:
        if self.enabled:
            log.info("%s", self.line(step, metrics))

    def eval(self, step: int, metrics: dict[str, float]) -> None:
        if self.enabled and metrics:
            log.info("eval step %d/%d %s", step, self.total, metric_line(metrics))


def banner(facts: dict[str, Any]) -> str:
    width = max(len(k) for k in facts)
    return "\n".join(["run " + "-" * 60] + [f"  {k:<{width}}  {v}" for k, v in facts.items()] + ["-" * 64])
