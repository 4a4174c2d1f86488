"""MFU for the device suite: the GPU's dense bf16 peak, chosen by stated rules; what a run logged, read from its log
lines where its MLflow store cannot be; and the steady-state windows of a run from its per-step record
(benchmarks/timed_run.py --record). Standard library only (the tests import it bare).

Why not the run's logged windows alone: each of them starts right after the previous log step, so it absorbs that
step's syncs, all-reduces and sqlite writes; and the first one holds start-up, kernel selection and compiles.
"""
from __future__ import annotations

import importlib.util
import json
import re
import statistics
from pathlib import Path
from typing import Any

# the table and its rules live with the runtime (hibert/runtime/peak_flops.py, standard library only), loaded by
# path so that this module needs no installed project
_spec = importlib.util.spec_from_file_location(
    "hibert_peak_flops", Path(__file__).resolve().parent.parent / "hibert" / "runtime" / "peak_flops.py")
_peak_flops = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_peak_flops)
PEAKS, peak_tflops = _peak_flops.PEAKS, _peak_flops.peak_tflops


# ------------------------------------------------------------------------------------------ what a run logged
# the step log's line (hibert/runtime/step_log.py): what a stopped run logged, where its MLflow store cannot be read
STEP_LINE = re.compile(r"step (\d+)/\S+ .*?tokens/s=([\d,]+)(?: mfu=([\d.]+)%)?(?: data_wait=([\d.]+)%)?")


def logged_lines(log: Path) -> dict[str, list[tuple[int, float]]]:
    """tokens/s, mfu and data-wait fraction per logged step, from the run's log lines."""
    out: dict[str, list[tuple[int, float]]] = {"tokens_per_s": [], "mfu": [], "data_wait_fraction": []}
    for m in STEP_LINE.finditer(log.read_text(errors="replace") if log.is_file() else ""):
        step = int(m.group(1))
        out["tokens_per_s"].append((step, float(m.group(2).replace(",", ""))))
        for key, group in (("mfu", 3), ("data_wait_fraction", 4)):
            if m.group(group):
                out[key].append((step, float(m.group(group)) / 100))
    return {k: v for k, v in out.items() if v}


# ------------------------------------------------------------------------------------------ steady windows
def read_record(path: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """timed_run.py's lines: the steps, and the rest (precision state, the last Dynamo counters)."""
    steps, info = [], {}
    if not path.is_file():
        return steps, info
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:   # a line cut by a kill
            continue
        if "step" in rec:
            steps.append(rec)
            if "dynamo" in rec:
                info["dynamo"] = rec["dynamo"]
        else:
            info.update(rec)
    return steps, info


def _why_not_steady(k: int, steps: list[dict[str, Any]], log_every: int, warm: int) -> str | None:
    if k <= warm:
        return "warm-up"
    if len(steps) < log_every:
        return "incomplete"
    if len({s["epoch"] for s in steps}) > 1:
        return "epoch boundary (the loader restarts)"
    if any("dynamo" in s for s in steps[1:]):
        return "compiled during it"
    return None


def steady_windows(steps: list[dict[str, Any]], log_every: int, peak: float | None, warm: int = 1,
                   clock: str | None = None) -> dict[str, Any]:
    """Window k holds steps (k-1)L+1 .. kL (L = log_every: the run's own logging windows); it is timed from the end
    of its first step to the end of its last, so the step after a log step, whose interval holds the logging, is
    left out. Windows are steady unless they are among the first `warm`, incomplete, cross an epoch or compiled
    (Dynamo counters changed inside). Clock: "gpu_s" where every step has it (CUDA events), else "host_s"."""
    by_step = {s["step"]: s for s in steps}
    clock = clock or ("gpu_s" if steps and all("gpu_s" in s for s in steps) else "host_s")
    windows = []
    for k in range(1, (max(by_step, default=0) // log_every) + 2):
        own = [by_step[i] for i in range((k - 1) * log_every + 1, k * log_every + 1) if i in by_step]
        if not own:
            continue
        w: dict[str, Any] = {"steps": [own[0]["step"], own[-1]["step"]], "excluded": _why_not_steady(
            k, own, log_every, warm)}
        timed = own[1:]
        seconds = own[-1][clock] - own[0][clock]
        if timed and own[-1]["step"] - own[0]["step"] == len(timed) and seconds > 0:
            host = own[-1]["host_s"] - own[0]["host_s"]
            tokens, flops = sum(s["tokens"] for s in timed), sum(s["flops"] for s in timed)
            w.update(timed_steps=len(timed), seconds=seconds, tokens_per_s=tokens / seconds,
                     data_wait_fraction=sum(s["wait_s"] for s in timed) / host if host > 0 else None,
                     _tokens=tokens, _flops=flops)
            if peak:
                w["mfu"] = flops / seconds / (peak * 1e12)
        windows.append(w)
    return summarize(windows, clock, peak)


def summarize(windows: list[dict[str, Any]], clock: str, peak: float | None) -> dict[str, Any]:
    """Steady state: every steady window's tokens and FLOPs over their time together (at least two windows)."""
    good = [w for w in windows if w["excluded"] is None and w.get("seconds")]
    seconds = sum(w["seconds"] for w in good)
    out: dict[str, Any] = {"clock": clock, "steady_windows": len(good), "windows": [
        {k: _rounded(k, v) for k, v in w.items() if not k.startswith("_")} for w in windows]}
    if len(good) < 2:
        out["steady"] = None
        out["reason"] = f"{len(good)} steady window(s): at least 2 are needed"
        return out
    rates = [w["tokens_per_s"] for w in good]
    waits = [w["data_wait_fraction"] for w in good if w["data_wait_fraction"] is not None]
    steady = {"tokens_per_s": sum(w["_tokens"] for w in good) / seconds, "seconds": seconds,
              "timed_steps": sum(w["timed_steps"] for w in good),
              "spread": (max(rates) - min(rates)) / statistics.fmean(rates),   # across the steady windows
              "mfu": sum(w["_flops"] for w in good) / seconds / (peak * 1e12) if peak else None,
              "data_wait_fraction": statistics.fmean(waits) if waits else None}
    out["steady"] = {k: _rounded(k, v) for k, v in steady.items()}
    return out


def _rounded(key: str, value: Any) -> Any:
    if not isinstance(value, float):
        return value
    return round(value) if key == "tokens_per_s" else round(value, 5)   # JSON a person reads
