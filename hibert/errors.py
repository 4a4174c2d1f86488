"""The one exception the library raises for problems a user can fix (a missing split, an export of the wrong
kind, a report that does not pair, an init encoder that does not fit): the commands print its message on one
line and exit 1. Library code never raises SystemExit or prints for the user."""


from __future__ import annotations

import errno
import shutil
from pathlib import Path


class UserError(ValueError):
    """A problem with the user's input or settings; the message is complete and names what to change."""


class DiskFull(UserError):
    """A write that found no space (ENOSPC, or a quota): what was kept, and that rerunning resumes."""


_FULL = ("No space left on device", "Disk quota exceeded", "StorageFull")


def disk_full(e: BaseException | None) -> bool:
    """ENOSPC / EDQUOT however it arrives: an OSError, or wrapped (safetensors' IoError 'StorageFull', a
    worker's exception re-raised in its parent, an exception raised while handling one)."""
    seen = 0
    while e is not None and seen < 10:
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if any(m in str(e) for m in _FULL):
            return True
        e, seen = e.__cause__ or e.__context__, seen + 1
    return False


def free_mb(path: str | Path) -> str:
    """Free space of the filesystem holding `path` (its nearest existing parent), for messages."""
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return f"{shutil.disk_usage(p).free / 2**20:,.1f} MB free"
    except OSError:
        return "free space unknown"
