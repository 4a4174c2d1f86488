"""Keeping the training step free of host syncs, where DeepSpeed's own step has one that changes nothing.

A host sync (`.item()`, `bool(tensor)`) makes the host wait for the device to drain before it queues the next
step's kernels: on a GPU the launch overhead of the next step is then no longer hidden under this step's
kernels. ZeRO-1/2 (read in DeepSpeed 0.19) asks `bool(norm is invalid)` in `unscale_and_clip_grads` at every step
with gradient clipping on; the replacement here computes the same scale on the device with `torch.where`.
DeepSpeed's other per-step sync, the bf16 overflow check, is the `deepspeed.check_finite_grads` switch.
"""
from __future__ import annotations

import types
from typing import Any

import torch


def unscale_and_clip_grads(self: Any, grad_groups_flat: list, total_norm: Any) -> None:
    """DeepSpeedZeroOptimizer.unscale_and_clip_grads without reading the norm back: an invalid norm (NaN,
    inf, or DeepSpeed's -1 sentinel) clips with an infinite norm as DeepSpeed's does (the gradients become 0,
    NaN stays NaN), a finite one gives the same scale in the same float32 arithmetic, so the same weights."""
    if not torch.is_tensor(total_norm):     # a norm already on the host: DeepSpeed's own code, nothing to save
        return type(self).unscale_and_clip_grads(self, grad_groups_flat, total_norm)
    if self.clip_grad == 0.0 and self.loss_scale == 1.0:
        return None
    combined_scale = self.loss_scale
    if self.clip_grad > 0.0:
        norm = total_norm.float()
        norm = torch.where(torch.isfinite(norm) & (norm >= 0), norm, torch.full_like(norm, float("inf")))
        clip = torch.clamp((norm / self.loss_scale + 1e-6) / self.clip_grad, min=1.0)
        combined_scale = clip * self.loss_scale
    for grad in grad_groups_flat:
        for g in grad if isinstance(grad, list) else (grad,):
            g.data.mul_(1.0 / combined_scale)
    return None


def remove_clip_sync(optimizer: Any) -> bool:
    """Give a ZeRO-1/2 optimizer the sync-free clipping. Returns whether it applied (ZeRO-3's clipping has no
    sync; stage 0's bf16/fp16 optimizers keep their own; with CPU offload the norm was read back already)."""
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer  # lazy: deepspeed imports slowly

    if not isinstance(optimizer, DeepSpeedZeroOptimizer) or not hasattr(DeepSpeedZeroOptimizer,
                                                                           "unscale_and_clip_grads"):
        return False
    optimizer.unscale_and_clip_grads = types.MethodType(unscale_and_clip_grads, optimizer)
    return True
