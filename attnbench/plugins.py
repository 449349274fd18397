"""Variants from outside the package: modules that call :func:`attnbench.register` on import.

A sweep measures each case in a worker process and asv runs every benchmark in a process of its
own, so a variant registered interactively in the parent would be unknown where the measuring
happens. Naming the module instead (``--plugin my_variants`` on the command line, or the
``ATTNBENCH_PLUGINS`` environment variable, comma-separated) lets every process import it.

Example:
    >>> import os
    >>> os.environ.get(PLUGINS_ENV, "")
    ''
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterable

__all__ = ["PLUGINS_ENV", "plugin_names", "load_plugins", "export_plugins"]

PLUGINS_ENV = "ATTNBENCH_PLUGINS"
"""Environment variable holding comma-separated importable module names."""

_loaded: set[str] = set()


def plugin_names(value: str | None = None) -> list[str]:
    """Module names in ``value`` (default: the ``ATTNBENCH_PLUGINS`` environment variable)."""
    raw = os.environ.get(PLUGINS_ENV, "") if value is None else value
    return [name.strip() for name in raw.split(",") if name.strip()]


def load_plugins(names: Iterable[str] | None = None) -> list[str]:
    """Import each plugin module once (default: those named in ``ATTNBENCH_PLUGINS``).

    Returns:
        The names imported by this call (already-imported ones are skipped).

    Raises:
        ValueError: naming the module, when one cannot be imported.
    """
    loaded = []
    for name in plugin_names() if names is None else list(names):
        if name in _loaded:
            continue
        if name.endswith(".py") or os.sep in name:
            folder, file = os.path.split(name)
            raise ValueError(
                f"plugin {name!r}: expected a module name, not a file: put its folder on "
                f"PYTHONPATH and name the module (PYTHONPATH={folder or '.'} attnbench --plugin "
                f"{file.removesuffix('.py')} ...)"
            )
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - any import failure is reported the same way
            raise ValueError(
                f"plugin module {name!r} could not be imported: {type(exc).__name__}: {exc}"
            ) from exc
        _loaded.add(name)
        loaded.append(name)
    return loaded


def export_plugins(names: Iterable[str]) -> None:
    """Add ``names`` to ``ATTNBENCH_PLUGINS`` so child processes (workers, asv) import them too."""
    merged = list(dict.fromkeys([*plugin_names(), *names]))
    os.environ[PLUGINS_ENV] = ",".join(merged)
