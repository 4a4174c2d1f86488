"""`python benchmarks/timed_run.py [--record FILE] [--pin-fp32] hibert ARGS...`: `hibert ARGS` in this process, with
what the device suite reads besides the run's own MLflow metrics and log lines.

--record FILE: one JSON line per optimizer step as it ends — its real tokens and model FLOPs (what the run's
metrics Window counted during the step), the loader wait, the epoch, the host clock and, on CUDA, the GPU clock (an
event recorded after the step, read once the GPU has passed it: no sync is added), and Dynamo's counters whenever
they change (compiles, graphs, graph breaks, recompiles with their reasons). A step's interval ends before the
step log's work (its syncs, the sqlite write), so the suite can time windows that hold no logging
(benchmarks/device_mfu.py). Lines are written as steps end, so a run killed at a time box keeps them.

--pin-fp32: fp32 matmuls at IEEE fp32 (no TF32) for the whole run, whatever the image's defaults or environment
(NGC images set TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1, which wins over torch's own setting); the state is recorded.
"""
from __future__ import annotations

import argparse
import atexit
import json
import logging
import os
import sys
import time
from collections import deque
from typing import Any

import torch

# what makes fp32 matmuls run at TF32 behind torch's flags (cuBLAS / torch overrides read from the environment)
TF32_ENV = ("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "NVIDIA_TF32_OVERRIDE")


def precision_state() -> dict[str, Any]:
    """The fp32 matmul settings in force, as torch reports them, and the environment variables that override them."""
    return {"float32_matmul_precision": torch.get_float32_matmul_precision(),
            "cuda_matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
            "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
            "env": {k: os.environ.get(k) for k in TF32_ENV}}


def tf32_possible(state: dict[str, Any]) -> bool:
    """Whether a run with this precision state could have run fp32 matmuls at TF32."""
    env = state.get("env") or {}
    return (state.get("float32_matmul_precision") != "highest" or bool(state.get("cuda_matmul_allow_tf32"))
            or env.get("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE") not in (None, "0") or env.get("NVIDIA_TF32_OVERRIDE") != "0")


def pin_fp32() -> None:
    """IEEE fp32 matmuls. The environment is set before the first CUDA call reads it (torch reads the override once)."""
    os.environ.pop("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", None)
    os.environ["NVIDIA_TF32_OVERRIDE"] = "0"    # cuBLAS / cuDNN: no TF32 whatever the library's default
    torch.set_float32_matmul_precision("highest")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


class RecompileLog(logging.Handler):
    """Dynamo's recompile messages (the `recompiles` artifact of torch._logging): how many, and the first reasons."""

    def __init__(self) -> None:
        super().__init__()
        self.count, self.reasons = 0, []

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1
        if len(self.reasons) < 3:
            self.reasons.append(record.getMessage()[:240])

    def install(self) -> "RecompileLog":
        torch._logging.set_logs(recompiles=True)   # also prints the reasons to the run's log
        logging.getLogger("torch._dynamo.guards.__recompiles").addHandler(self)
        return self


def dynamo_counts(recompiles: RecompileLog | None = None) -> dict[str, Any]:
    """Dynamo's counters so far ({} where nothing was compiled): frames compiled, graphs, graph breaks,
    recompiles, compile seconds, and the recompile limit they are held against."""
    utils = sys.modules.get("torch._dynamo.utils")
    if utils is None or not utils.counters["frames"]:
        return {}
    c = utils.counters
    out = {"frames_compiled": c["frames"].get("ok", 0), "frames_total": c["frames"].get("total", 0),
           "unique_graphs": c["stats"].get("unique_graphs", 0), "graph_breaks": sum(c["graph_break"].values()),
           "compile_s": round(sum(utils.compilation_time_metrics.get("_compile.compile_inner", [])), 2),
           # per function: past it Dynamo runs the function eagerly for new shapes
           "recompile_limit": getattr(sys.modules.get("torch._dynamo.config"), "recompile_limit", None)}
    if recompiles is not None:
        out.update(recompiles=recompiles.count, recompile_reasons=list(recompiles.reasons))
    return out


class StepRecord:
    """The per-step lines of --record (module docstring)."""

    def __init__(self, path: str, recompiles: RecompileLog):
        self.f = open(path, "a", buffering=1)   # a line reaches the file when it is written
        self.t0 = time.perf_counter()
        self.cuda = torch.cuda.is_available()
        self.base: Any = None                   # the first step's event: GPU times are counted from it
        self.pending: deque = deque()           # (line, event) not yet passed by the GPU
        self.recompiles = recompiles
        self.dynamo: dict[str, Any] = {}
        self.write({"precision": precision_state()})
        atexit.register(self.close)

    def write(self, line: dict[str, Any]) -> None:
        self.f.write(json.dumps(line) + "\n")

    def step(self, line: dict[str, Any]) -> None:
        counts = dynamo_counts(self.recompiles)
        if counts != self.dynamo:
            line["dynamo"] = self.dynamo = counts
        if not self.cuda:
            self.write(line)
            return
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        if self.base is None:
            self.base = event
        self.pending.append((line, event))
        self.drain(wait=False)

    def drain(self, wait: bool) -> None:
        """Write the steps the GPU has finished (all of them when `wait`: at the end)."""
        while self.pending and (wait or self.pending[0][1].query()):
            line, event = self.pending.popleft()
            event.synchronize()
            line["gpu_s"] = self.base.elapsed_time(event) / 1000
            self.write(line)

    def close(self) -> None:
        try:
            if self.cuda and self.pending:
                self.drain(wait=True)
        finally:   # at exit: a CUDA error here must not cost the lines already written
            self.f.close()


def time_steps(record: StepRecord) -> None:
    """Trainer.train_step, wrapped: what the Window counted during the step and when it ended (no sync); and the
    step log, after which the GPU has passed every step's event."""
    from hibert.runtime.trainer import Trainer

    def timed(self: Trainer, batches: Any, window: Any) -> dict[str, torch.Tensor]:
        tokens, flops, wait = window.tokens, window.flops, window.wait
        stats = train_step(self, batches, window)
        record.step({"step": self.state.global_step, "epoch": self.state.epoch,
                     "host_s": time.perf_counter() - record.t0, "tokens": window.tokens - tokens,
                     "flops": window.flops - flops, "wait_s": window.wait - wait})
        if self.state.global_step == 1:
            record.write({"precision_at_first_step": precision_state()})
        return stats

    def logged(self: Trainer, *args: Any, **kwargs: Any) -> None:
        log_window(self, *args, **kwargs)
        record.drain(wait=False)   # the log step has synchronized: every step so far is written, a kill keeps them

    train_step, log_window = Trainer.train_step, Trainer._log_window
    Trainer.train_step, Trainer._log_window = timed, logged


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--record", default=None, help="per-step JSON lines here")
    p.add_argument("--pin-fp32", action="store_true", help="IEEE fp32 matmuls (no TF32) for the whole run")
    p.add_argument("hibert", nargs=argparse.REMAINDER, help="the hibert command and its arguments")
    args = p.parse_args()
    if args.pin_fp32:
        pin_fp32()
    if args.record:
        time_steps(StepRecord(args.record, RecompileLog().install()))
    from hibert import cli

    sys.argv = ["hibert", *args.hibert]
    cli.run()


if __name__ == "__main__":
    main()
