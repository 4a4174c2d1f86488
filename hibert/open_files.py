"""The process's open-file limit, raised where it is too low: every memory-mapped array and every open part file
holds a descriptor, and the default soft limit (often 1,024) is far below the hard one on most clusters."""
from __future__ import annotations

import math

try:
    import resource
except ImportError:   # not a POSIX system
    resource = None


def raise_soft_limit(want: int) -> tuple[float, float]:
    """Raise the soft RLIMIT_NOFILE toward `want`, never above the hard limit and never lowering it. Returns the
    (soft, hard) limits that hold afterwards, math.inf for unlimited; (1024, 1024) where they cannot be read."""
    if resource is None:
        return 1024.0, 1024.0
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    inf = resource.RLIM_INFINITY
    if soft != inf and soft < want:
        target = want if hard == inf else min(want, hard)
        if target > soft:
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
                soft = target
            except (ValueError, OSError):
                pass
    return (math.inf if soft == inf else float(soft)), (math.inf if hard == inf else float(hard))
