"""The global batch, kept across world sizes: a run's optimizer step is M micro-batches of the epoch's plan (each
at most `schedule.batch_tokens` real tokens), whatever the number of ranks; each rank accumulates M / W of them.

M is `schedule.global_batch` where set; otherwise the checkpoint the run resumes from says it (so a Slurm requeue
on fewer or more nodes trains on the same batches); otherwise it is world size x `schedule.grad_accum` at the run's
first start. With M fixed, step g takes micro-batches [g*M, (g+1)*M) of the plan (batching.py) on any world size,
so the position a checkpoint records is exact, and each micro-batch's dropout stream is seeded by its index in the
plan (`micro_batch_seed`), not by the rank that happens to run it."""
from __future__ import annotations

import torch.distributed as dist

from hibert.config import Config
from hibert.errors import UserError
from hibert.runtime.checkpoint import complete_tags, read_marker


def saved_global_batch(cfg: Config, is_main: bool) -> int | None:
    """Micro-batches per step of the checkpoint this run would resume from (its newest complete tag, or the one
    `checkpoint.resume` names), read from its marker; None without one. Rank 0 reads, every rank gets it."""
    box: list[int | None] = [None]
    if is_main and cfg.checkpoint.resume != "never":
        tags = complete_tags(cfg.checkpoint_dir)
        if cfg.checkpoint.resume != "auto":
            tags = [t for t in tags if t.name == cfg.checkpoint.resume]
        marker = read_marker(tags[0]) if tags else None
        state = (marker or {}).get("state") or {}
        micro = state.get("micro_per_step")
        box[0] = int(micro) if isinstance(micro, int) and micro > 0 else None
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(box, src=0)
    return box[0]


def resolve_global_batch(cfg: Config, world: int, saved: int | None) -> tuple[Config, str]:
    """`cfg` with schedule.global_batch (M) and schedule.grad_accum (M / world) set for this world size, and where M
    came from. A world size that does not divide M is one line naming the sizes that do."""
    s = cfg.schedule
    if s.global_batch is not None:
        m, source = s.global_batch, "schedule.global_batch"
    elif saved is not None:
        m, source = saved, "the checkpoint it resumes"
    else:
        m, source = world * s.grad_accum, f"{world} rank(s) x schedule.grad_accum={s.grad_accum}"
    if m % world:
        fits = [w for w in range(1, m + 1) if m % w == 0]
        raise UserError(f"hibert: the global batch of {m} micro-batches ({source}) cannot be split over {world} "
                        f"ranks: run on {', '.join(map(str, fits))} ranks, or set schedule.global_batch to a multiple "
                        f"of {world}")
    schedule = s.model_copy(update={"global_batch": m, "grad_accum": m // world})
    return cfg.model_copy(update={"schedule": schedule}), source


def micro_batch_seed(run_seed: int, epoch: int, index: int) -> int:
    """The dropout seed of the plan's micro-batch `index` in `epoch`: one per micro-batch, the same on any rank and
    any world size (a 64-bit mix: distinct for any realistic run, epoch and index)."""
    x = (run_seed * 0x9E3779B97F4A7C15 + epoch * 0xBF58476D1CE4E5B9 + index * 0x94D049BB133111EB) % 2**64
    x ^= x >> 31
    return x % 2**63
