"""Bytes of model parameters and optimizer state held by this rank (what ZeRO partitions).

Counted per underlying storage, so views into DeepSpeed's flat buffers and tensors that alias each
other are counted once."""
from __future__ import annotations

import torch


class _Counter:
    def __init__(self) -> None:
        self.seen: set[int] = set()

    def __call__(self, t) -> int:
        if not isinstance(t, torch.Tensor) or t.numel() <= 1:
            return 0
        storage = t.untyped_storage()
        if storage.data_ptr() in self.seen or storage.nbytes() == 0:
            return 0
        self.seen.add(storage.data_ptr())
        return storage.nbytes()


def rank_state_bytes(engine) -> dict[str, int]:
    count = _Counter()
    params = 0
    for p in engine.module.parameters():
        # ZeRO-3 keeps only this rank's partition in ds_tensor; the full param is an empty placeholder
        params += count(p.ds_tensor if hasattr(p, "ds_tensor") else p)
    opt = engine.optimizer
    state = 0
    inner = getattr(opt, "optimizer", opt)  # DeepSpeed wraps the torch optimizer
    for st in inner.state.values():
        for v in st.values():
            state += count(v)
    # fp32 master partitions kept by DeepSpeed's ZeRO optimizers (when they are separate storage)
    for name in ("single_partition_of_fp32_groups", "fp32_partitioned_groups_flat", "fp32_groups_flat_partition"):
        for t in getattr(opt, name, []) or []:
            state += count(t)
    return {"param_bytes": params, "optimizer_bytes": state, "total_bytes": params + state}
