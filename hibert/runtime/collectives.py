"""Where a tensor must live for a collective: the one rule the runtime's small host-side agreements share."""
from __future__ import annotations

import torch
import torch.distributed as dist


def reduce_device(group: dist.ProcessGroup | None = None) -> torch.device | None:
    """The device of a tensor reduced over `group` (None: the default group). NCCL reduces device tensors only
    (a CPU tensor there raises "No backend type associated with device type cpu"): the current GPU, a sync;
    gloo (the default on CPU, or a host-side group beside NCCL) reduces host tensors: None."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return None
