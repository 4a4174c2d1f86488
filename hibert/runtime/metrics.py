"""Throughput, MFU, data-wait fraction and peak memory over a logging window; the record of a window not yet
logged that a checkpoint keeps (`gather_window` / `restore_window`)."""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

from hibert.runtime.host_memory import host_peak_rss_kib
from hibert.runtime.peak_flops import peak_tflops

def default_peak_tflops(device: torch.device, configured: float | None) -> float | None:
    """The dense bf16 peak MFU is counted against: tracking.peak_tflops where set, else the GPU's by peak_flops.py's
    rules (name, memory, SM count: an H200 NVL is not counted at the SXM part's 989)."""
    if configured:
        return configured
    if device.type != "cuda":
        return None
    props = torch.cuda.get_device_properties(device)
    return peak_tflops(props.name, props.total_memory / 2**30, props.multi_processor_count)["tflops"]


def peak_memory_gb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return host_peak_rss_kib() / 2**20


class Window:
    """Accumulates one logging window; `flush` returns rates and resets."""

    def __init__(self, peak_tflops: float | None, world_size: int):
        self.peak, self.world = peak_tflops, world_size
        self.reset()

    def reset(self) -> None:
        self.start = time.perf_counter()
        self.wait = 0.0
        self.tokens = 0
        self.flops = 0.0
        self.steps = 0
        self.micro = 0
        self.collate = 0.0
        self.phases: dict[str, float] = {}

    def add(self, tokens: int, flops: float, wait_s: float, collate_s: float = 0.0) -> None:
        self.tokens += tokens
        self.flops += flops
        self.wait += wait_s
        self.collate += collate_s
        self.micro += 1

    def add_phase(self, name: str, seconds: float) -> None:
        self.phases[name] = self.phases.get(name, 0.0) + seconds

    def flush(self) -> dict[str, float]:
        elapsed = max(time.perf_counter() - self.start, 1e-9)
        # tokens/s counts all ranks (this rank's count x world: ranks see similar loads); MFU is per device
        out = {"tokens_per_s": self.tokens * self.world / elapsed, "steps_per_s": self.steps / elapsed,
               "data_wait_fraction": self.wait / elapsed}
        if self.micro:  # worker time per micro-batch: with N workers the loader keeps up while N x step > this
            out["collate_ms"] = self.collate / self.micro * 1e3
        if self.peak:
            out["mfu"] = self.flops / elapsed / (self.peak * 1e12)
        for name, seconds in self.phases.items():
            out[f"{name}_ms"] = seconds / max(self.steps, 1) * 1e3   # per optimizer step
        self.reset()
        return out


class PhaseClock:
    """Times the phases of a step into a Window when `on` (tracking.step_breakdown). On CUDA it synchronizes
    at each lap so the kernels are counted in the phase that launched them; off, it costs nothing."""

    def __init__(self, window: Window, device: torch.device, on: bool):
        self.window, self.on = window, on
        self.sync = on and device.type == "cuda"
        self.t = 0.0

    def start(self) -> None:
        if self.on:
            if self.sync:
                torch.cuda.synchronize()
            self.t = time.perf_counter()

    def lap(self, name: str) -> None:
        if self.on:
            if self.sync:
                torch.cuda.synchronize()
            now = time.perf_counter()
            self.window.add_phase(name, now - self.t)
            self.t = now


def gather_window(stats: dict[str, torch.Tensor]) -> list[dict[str, list]] | None:
    """Collective. Every rank's training statistics since the last logged step, as [value, dtype] per key, rank
    by rank: what a checkpoint keeps so that a resumed run logs the same window an uninterrupted one would
    (None when nothing is pending, i.e. the step was a logged one)."""
    mine = {k: [float(v), str(v.dtype).removeprefix("torch.")] for k, v in stats.items()}
    every = [mine]
    if dist.is_initialized() and dist.get_world_size() > 1:
        every = [None] * dist.get_world_size()
        dist.all_gather_object(every, mine)
    return every if any(every) else None


def restore_window(saved: list[dict[str, list]] | None, rank: int, world: int,
                    device: torch.device) -> dict[str, torch.Tensor]:
    """This rank's pending statistics from `gather_window`'s record: its own when the world size is the one
    they were saved with (the sums then go on bit for bit), else all of them on rank 0 (the logged totals
    are the same up to rounding)."""
    if not saved:
        return {}
    if len(saved) == world:
        mine = saved[rank]
    elif rank == 0:
        mine = {}
        for part in saved:
            for k, (v, dtype) in part.items():
                mine[k] = [mine.get(k, [0.0])[0] + v, dtype]
    else:
        return {}
    return {k: torch.tensor(v, dtype=getattr(torch, dtype), device=device) for k, (v, dtype) in mine.items()}
