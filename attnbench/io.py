"""Atomic file writes: a reader never sees a half-written result."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def atomic_write(path: str | Path, write: Callable[[str], object]) -> Path:
    """Call ``write(tmp_path)`` on a temporary file beside ``path``, then rename it into place.

    The rename is atomic on POSIX, so ``path`` holds either the old content or the new, never a
    mix; on failure the temporary file is removed and ``path`` is untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    try:
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; give the result ordinary permissions
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Atomically replace ``path`` with ``text`` (UTF-8)."""
    return atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
