"""A process's own peak resident set, without importing torch (so that a probe measuring its own memory does not
measure torch's)."""
from __future__ import annotations

import resource


def host_peak_rss_kib() -> int:
    """This process's peak resident set. Linux's VmHWM belongs to the address space exec made; ru_maxrss does not
    restart at exec, so a process started by a parent that had grown larger would report the parent's peak."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux (no /proc elsewhere)
