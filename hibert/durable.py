"""Files that survive a crash or a power loss: written whole under a temporary name, flushed, renamed, and the
rename itself flushed (checkpoint markers, corpus summarize's `.done` and stats files)."""
from __future__ import annotations

import os
from pathlib import Path


def write_atomic(path: Path, text: str, tmp: Path | None = None) -> None:
    """`text` into `path` so that a crash leaves the old file or the new one, never a cut one, and the new one is on
    disk when this returns. `tmp`: the temporary name (default: a hidden, unique one beside `path`, so that
    concurrent writers do not share it)."""
    tmp = tmp or path.with_name(f".{path.name}.{os.getpid()}-{os.urandom(4).hex()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)
    fsync_dir(path.parent)


def fsync_dir(path: Path) -> None:
    """Make the directory's entries (new names, renames) durable; a no-op where directories cannot be opened or
    flushed (their renames are durable by other means there)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
