"""The one base of the errors a command reports: each carries the exit code it ends with."""

from __future__ import annotations

__all__ = ["AttnbenchError"]


class AttnbenchError(Exception):
    """An error the command line reports as one line on stderr and ends with ``exit_code``.

    Subclasses keep the built-in base that says what kind of error they are (``ValueError`` for
    bad input, ``OSError`` for a file that cannot be written, ``RuntimeError`` for a process that
    failed), so library callers can catch either.
    """

    exit_code: int = 1
