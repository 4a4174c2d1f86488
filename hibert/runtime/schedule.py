"""Learning-rate schedules (HIBERT §4.2: warmup 10k steps, then decay as in Vaswani et al. 2017)."""
from __future__ import annotations

import math


def lr_multiplier(step: int, warmup: int, decay: str, max_steps: int | None) -> float:
    """Multiplier of the peak lr after `step` optimizer steps (step 0 = before the first update).

    Linear warmup to 1 over `warmup` steps, then
      inverse_sqrt: sqrt(warmup / step)  (Vaswani et al.'s d^-0.5 * min(step^-0.5, step * warmup^-1.5),
                                          normalised so the peak equals the configured lr)
      linear:       falls linearly to 0 at max_steps
      constant:     stays at 1
    """
    s = step + 1  # the multiplier used for the (step+1)-th update, so the first update is not at lr 0
    if warmup > 0 and s < warmup:
        return s / warmup
    if decay == "inverse_sqrt":
        return math.sqrt(max(warmup, 1) / s)
    if decay == "linear":
        if not max_steps:
            raise ValueError("linear decay needs schedule.max_steps")
        return max(0.0, (max_steps - s) / max(1, max_steps - warmup))
    if decay == "constant":
        return 1.0
    raise ValueError(f"unknown decay {decay!r}")
