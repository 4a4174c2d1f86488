"""Process-level setting of glibc's malloc for CPU inference.

PyTorch's CPU tensors come straight from malloc. glibc serves blocks above its mmap threshold (at most
32 MB when it adapts it itself) with a fresh mmap and unmaps them on free, and trims the heap's free top
back to the kernel: every large temporary (a 16-document encoder batch's 52 MB FFN activations, a beam
step's 10 MB vocabulary log-probs) is then zero-filled page by page again at its next use. Measured on 2
CPU cores, 16 documents x 800 tokens: the encoder pass takes 1.09 s with glibc's defaults and 0.82 s once
freed memory is kept for reuse; one document at a time barely changes (its blocks are small). The price:
memory freed after the peak stays in the process (its peak RSS is unchanged)."""
from __future__ import annotations

import ctypes
import ctypes.util
import platform

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_done = False


def keep_freed_memory() -> bool:
    """Serve large blocks from the heap and do not return its free top to the kernel (glibc only; once per
    process). Returns whether the setting was applied."""
    global _done
    if _done:
        return True
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        # mallopt takes a C int: 1 GiB / 2 GiB - 1 are the largest round values that fit
        ok = libc.mallopt(_M_MMAP_THRESHOLD, 1 << 30) == 1 and libc.mallopt(_M_TRIM_THRESHOLD, (1 << 31) - 1) == 1
    except (OSError, AttributeError):
        return False
    _done = ok
    return ok
