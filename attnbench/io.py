"""Atomic file writes: a reader never sees a half-written result."""

from __future__ import annotations

import json
import os
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

__all__ = [
    "atomic_write",
    "check_path",
    "check_output_file",
    "check_writable_dir",
    "atomic_write_text",
    "read_json_cache",
    "cache_dir",
    "CacheNotWritten",
    "write_json_cache",
    "output_tail",
    "error_line",
    "append_line",
]

if TYPE_CHECKING:  # a type only: reading a finished process starts none
    import subprocess


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


_NAME_MAX = 255
"""Bytes in one path component Linux's file systems take (ext4, xfs, btrfs, tmpfs)."""
_PATH_MAX = 4096
"""Bytes in a whole path, its terminating NUL included, that Linux's system calls take."""


def check_path(path: str | Path, arg: str) -> Path:
    """``path`` made absolute, else a ValueError naming ``arg`` for a path no system call takes.

    A component over :data:`_NAME_MAX` bytes or a whole over :data:`_PATH_MAX`
    (``ENAMETOOLONG``), and a symlink loop (``ELOOP``), are refused here, by name, before any work,
    not as an ``OSError`` from deep inside it.
    """
    path = Path(path).absolute()
    raw = os.fsencode(path)
    if len(raw) >= _PATH_MAX:
        raise ValueError(
            f"{arg} {str(path)[:60]}...: the path is {len(raw)} bytes long, over the system's "
            f"limit of {_PATH_MAX - 1}"
        )
    for part in path.parts:
        if len(os.fsencode(part)) > _NAME_MAX:
            raise ValueError(
                f"{arg} {str(path)[:60]}...: the name {part[:20]}... is {len(os.fsencode(part))} "
                f"bytes long, over the system's limit of {_NAME_MAX}"
            )
    try:
        path.resolve(strict=False)
    except (RuntimeError, OSError) as exc:  # 3.11 raises RuntimeError("Symlink loop ...")
        raise ValueError(f"{arg} {path}: a symlink loop ({error_line(exc)})") from None
    return path


def check_output_file(path: str | Path, arg: str, *, append: bool = False) -> Path:
    """``path`` as a file this process can write, else a ValueError naming ``arg``.

    Called before any work starts, so a bad output path costs nothing. Refused: a name the system
    cannot take (:func:`check_path`), a directory, and a folder that cannot hold it (see
    :func:`check_writable_dir`; the file is replaced by a rename there). With ``append`` (a file
    opened with ``"a"``, as ``$GITHUB_STEP_SUMMARY`` is) an existing file must open for appending,
    and a new one's folder must exist already: nothing creates it.
    """
    path = check_path(path, arg)
    if path.is_dir():
        raise ValueError(f"{arg} {path} is a directory, not a file")
    if path.exists() and append:
        try:  # opened to append, and closed: nothing written
            with open(path, "a", encoding="utf-8"):
                pass
        except OSError as exc:
            raise ValueError(f"{arg} {path} is not writable: {exc.strerror or exc}") from None
        return path
    folder = next(p for p in path.parents if p.exists())  # the root exists
    if not folder.is_dir():
        raise ValueError(f"{arg} {path} cannot be created: {folder} is a file")
    if append and folder != path.parent:
        raise ValueError(f"{arg} {path} cannot be created: its folder {path.parent} does not exist")
    check_writable_dir(path.parent, arg)
    return path


def check_writable_dir(path: str | Path, arg: str, *, create: bool = False) -> Path:
    """``path`` as a directory this process can write into, else a ValueError naming ``arg``.

    Called before any work starts, so a bad output path costs nothing.

    An existing file is refused; so is a missing directory whose nearest existing ancestor is a file
    or takes no new file (a file is written there and removed). With ``create`` the directory is
    then made.
    """
    path = check_path(path, arg)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{arg} {path} is an existing file, not a directory")
    nearest = next(p for p in (path, *path.parents) if p.exists())
    if not nearest.is_dir():
        raise ValueError(f"{arg} {path} cannot be created: {nearest} is a file")
    try:
        with tempfile.TemporaryFile(dir=nearest):
            pass
        if create:
            path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(
            f"{arg} {path} cannot be created or written: {exc.strerror or exc}"
        ) from None
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Atomically replace ``path`` with ``text`` (UTF-8)."""
    return atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def read_json_cache(path: str | Path) -> dict:
    """A JSON object cached in ``path``; ``{}`` when it is missing, unreadable or not an object."""
    try:
        cache = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return cache if isinstance(cache, dict) else {}


_CACHE_ENV = "ATTNBENCH_CACHE"


def cache_dir() -> Path:
    """Where measurements of this machine are cached.

    ``ATTNBENCH_CACHE``, else ``$XDG_CACHE_HOME/attnbench``, else ``~/.cache/attnbench``.
    """
    if os.environ.get(_CACHE_ENV):
        return Path(os.environ[_CACHE_ENV])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "attnbench"


class CacheNotWritten(UserWarning):
    """The cache could not be written (a read-only or missing home).

    The figure measured is used uncached.
    """


_unwritable: set[Path] = set()


def write_json_cache(path: str | Path, cache: dict) -> Path | None:
    """Atomically replace the cache in ``path`` (its folder is created); None when it cannot be.

    A home that is read-only, a file, or full must not end a run over a cache: the value is used
    uncached, and a :class:`CacheNotWritten` warning says so once per folder and process.
    """
    try:
        return atomic_write_text(path, json.dumps(cache, indent=1, sort_keys=True))
    except OSError as exc:
        folder = Path(path).parent
        if folder not in _unwritable:
            _unwritable.add(folder)
            warnings.warn(
                CacheNotWritten(
                    f"cannot write the cache in {folder} ({exc.strerror or exc}); running "
                    f"uncached (set {_CACHE_ENV} or XDG_CACHE_HOME to a writable folder)"
                ),
                stacklevel=2,
            )
        return None


def output_tail(out: subprocess.CompletedProcess, lines: int = 25) -> str:
    """The last ``lines`` lines of a finished process's stdout and stderr (for error messages)."""
    text = "\n".join(
        part.strip("\n") for part in (out.stdout or "", out.stderr or "") if part and part.strip()
    )
    tail = text.splitlines()[-lines:]
    return "\n".join(f"  {line}" for line in tail) if tail else "  (no output)"


def error_line(exc: BaseException, limit: int = 300) -> str:
    """``"Type: first line of the message"``, just the type when it is empty (``MemoryError()``)."""
    lines = str(exc).splitlines()
    text = lines[0][:limit] if lines else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def append_line(path: str | Path, line: str) -> None:
    """Append one line to ``path`` in a single ``O_APPEND`` write.

    Concurrent writers' lines therefore never interleave.
    """
    data = (line.rstrip("\n") + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
