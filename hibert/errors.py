"""The one exception the library raises for problems a user can fix (a missing split, an export of the wrong
kind, a report that does not pair, an init encoder that does not fit): the commands print its message on one
line and exit 1. Library code never raises SystemExit or prints for the user."""


from __future__ import annotations

import errno
import os
import shutil
import tempfile
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


class NotWritable(UserError):
    """A target this process may not write: permissions, or a read-only filesystem."""


_DENIED = (errno.EACCES, errno.EPERM, errno.EROFS)


def not_writable(e: BaseException | None) -> bool:
    """A write refused by permissions or a read-only filesystem (EACCES, EPERM, EROFS)."""
    return isinstance(e, OSError) and e.errno in _DENIED


def writable_dir(path: str | Path, what: str) -> Path:
    """Create `path` (and its parents) and write a probe file in it, before any work whose results would go
    there: a directory that cannot be written is one `NotWritable` line naming it, not a traceback later."""
    p = Path(path)
    try:
        p.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=p, prefix=".write-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        if not not_writable(e):
            raise
        raise NotWritable(f"{what} {p} is not writable ({e.strerror}): choose a directory you can "
                          "write, or fix its permissions") from None
    return p
