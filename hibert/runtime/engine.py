"""Distributed init and the DeepSpeed engine, built from the one config schema.

The DeepSpeed JSON is generated (never hand-written): batch/accumulation from `schedule:`, clipping from
`optimizer:`, ZeRO and precision from `deepspeed:`. The optimizer is a torch AdamW built here (fused on
CUDA) with weight decay off for biases and LayerNorm weights; with optimizer offload DeepSpeed's CPU Adam
is used instead. The lr schedule is a LambdaLR that DeepSpeed steps at every optimizer step and saves in
its checkpoints.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch

from hibert.config import Config
from hibert.runtime.build_locks import skip_unneeded_ops, wait_for_build_lock
from hibert.runtime.dist_env import DistEnv, detect_dist_env
from hibert.runtime.host_syncs import remove_clip_sync
from hibert.runtime.launch import free_port
from hibert.runtime.schedule import lr_multiplier
from hibert.runtime.task import ParamGroup, decay_groups


@dataclass
class Runtime:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    precision: str
    # host-side collectives at every step (the preemption flag) beside NCCL: a gloo group, so that asking them
    # never waits for the device; None where the default group is gloo already (CPU) or there is one rank
    control_group: Any = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def resolve_precision(requested: str) -> str:
    if requested != "auto":
        return requested
    return "bf16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "fp32"


def process_env() -> DistEnv:
    """The launcher's ranks, exported as torch's `env://` variables. A lone process with no MASTER_PORT gets a free
    port, so that two single-process runs on one node do not both wait on the default one."""
    env = detect_dist_env()
    if env.world_size == 1 and "MASTER_PORT" not in os.environ and env.launcher == "single":
        os.environ["MASTER_PORT"] = str(free_port())
        env = detect_dist_env()
    return env.export()


def init_distributed(cfg: Config) -> Runtime:
    """Map the launcher's environment (torchrun, deepspeed, srun, or none) to ranks and init the group."""
    env = process_env()
    cuda = torch.cuda.is_available()
    if not cuda:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed  # lazy: ~2.5 s, and only after DS_ACCELERATOR is set (it picks its accelerator on import)

    skip_unneeded_ops()   # the CPU shared-memory op: built under a user-wide lock, never used by training
    if cuda:
        torch.cuda.set_device(env.local_rank)
    timeout = timedelta(seconds=cfg.run.collective_timeout_s)
    # DeepSpeed makes its own groups (data parallel, ZeRO partitions) with no timeout argument, so they take
    # torch's module defaults (30 min; 10 for NCCL): set those too, or a hung peer would stall the job there
    import torch.distributed.distributed_c10d as c10d  # lazy: a private module, read only here

    c10d.default_pg_timeout = timeout
    if isinstance(getattr(c10d, "default_pg_nccl_timeout", None), timedelta):
        c10d.default_pg_nccl_timeout = timeout
    deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo", auto_mpi_discovery=False, timeout=timeout)
    device = torch.device("cuda", env.local_rank) if cuda else torch.device("cpu")
    precision = resolve_precision(cfg.deepspeed.precision)
    if precision == "fp16" and not cuda:
        raise ValueError("deepspeed.precision=fp16 needs a GPU; use bf16 or fp32 on CPU")
    control = None
    if cuda and env.world_size > 1:
        import torch.distributed as dist

        control = dist.new_group(backend="gloo", timeout=timeout)   # collective: every rank makes it here
    return Runtime(env.rank, env.local_rank, env.world_size, device, precision, control)


def deepspeed_config(cfg: Config, precision: str, world_size: int = 2) -> dict[str, Any]:
    ds = cfg.deepspeed
    zero: dict[str, Any] = {
        "stage": ds.zero_stage,
        # ZeRO-1/2's overlap synchronizes the device at the end of every backward; one rank has no gradient
        # reduction to overlap, so it would pay that sync for nothing
        "overlap_comm": ds.overlap_comm and world_size > 1,
        "contiguous_gradients": ds.contiguous_gradients,
        "reduce_bucket_size": ds.reduce_bucket_size,
    }
    if ds.offload_optimizer != "none":
        zero["offload_optimizer"] = {"device": ds.offload_optimizer}
    if ds.offload_param != "none":
        zero["offload_param"] = {"device": ds.offload_param}
    if ds.zero_stage == 3:
        zero["stage3_gather_16bit_weights_on_model_save"] = ds.stage3_gather_16bit_weights_on_model_save
    out: dict[str, Any] = {
        # One "sample" is one token-budget micro-batch assembled by our loader.
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": cfg.schedule.grad_accum,
        "gradient_clipping": cfg.optimizer.grad_clip,
        "zero_optimization": zero,
        "bf16": {"enabled": precision == "bf16"},
        "fp16": {"enabled": precision == "fp16", "initial_scale_power": 16},
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
        # DeepSpeed's throughput timer synchronizes the device at the start of every forward and the end of every
        # step (on by default); the runtime measures its own windows (hibert/runtime/metrics.py)
        "timers": {"throughput": {"enabled": False}},
    }
    if precision == "bf16" and not ds.check_finite_grads:   # DeepSpeed's bf16 overflow check, per step
        out["bf16"]["check_grad_overflow"] = False
    if ds.offload_optimizer != "none":
        out["optimizer"] = {"type": "AdamW", "params": {
            "lr": cfg.optimizer.lr, "betas": list(cfg.optimizer.betas), "eps": cfg.optimizer.eps,
            "weight_decay": cfg.optimizer.weight_decay}}
    _deep_merge(out, ds.extra)
    return out


def _deep_merge(dst: dict[str, Any], src: dict[str, Any]) -> None:
    for k, v in src.items():
        if isinstance(v, dict) and isinstance(dst.get(k), dict):
            _deep_merge(dst[k], v)
        else:
            dst[k] = v


def build_engine(cfg: Config, model: torch.nn.Module, rt: Runtime, groups: list[ParamGroup] | None = None):
    """DeepSpeed engine over `model`. Each optimizer group has its own peak lr (optimizer.lr x lr_scale) and
    warmup under the one decay rule of `schedule:` — a LambdaLR with one multiplier per group, which
    DeepSpeed steps and checkpoints."""
    import deepspeed  # lazy: ~2.5 s (after init_distributed chose its accelerator)

    ds_cfg = deepspeed_config(cfg, rt.precision, rt.world_size)
    groups = groups if groups is not None else decay_groups(model.named_parameters(), cfg.optimizer.weight_decay)
    groups = [g for g in groups if g.params]
    torch_groups = [{"params": g.params, "weight_decay": g.weight_decay, "lr": cfg.optimizer.lr * g.lr_scale,
                     "name": g.name} for g in groups]
    opt = None
    if cfg.deepspeed.offload_optimizer != "none":
        wait_for_build_lock("cpu_adam")   # DeepSpeed builds its CPU Adam now: not behind a dead build's lock
    if cfg.deepspeed.offload_optimizer == "none":
        opt = torch.optim.AdamW(torch_groups, lr=cfg.optimizer.lr, betas=tuple(cfg.optimizer.betas),
                                eps=cfg.optimizer.eps, fused=rt.device.type == "cuda")
    sch = cfg.schedule
    warmups = [sch.warmup_steps if g.warmup_steps is None else g.warmup_steps for g in groups]

    def scheduler(optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LambdaLR:
        lambdas = [lambda step, w=w: lr_multiplier(step, w, sch.decay, sch.max_steps) for w in warmups]
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambdas if len(lambdas) > 1 else lambdas[0])

    engine, _, _, _ = deepspeed.initialize(
        model=model, optimizer=opt, model_parameters=None if opt is not None else torch_groups,
        lr_scheduler=scheduler, config=ds_cfg, dist_init_required=False)
    remove_clip_sync(engine.optimizer)
    return engine
