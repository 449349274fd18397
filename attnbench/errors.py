"""The one base of the errors a command reports: each carries the exit code it ends with."""

from __future__ import annotations

__all__ = ["AttnbenchError", "CouldNotMeasure", "UsageError"]


class AttnbenchError(Exception):
    """An error the command line reports as one line on stderr and ends with ``exit_code``.

    Subclasses keep the built-in base that says what kind of error they are (``ValueError`` for
    bad input, ``OSError`` for a file that cannot be written, ``RuntimeError`` for a process that
    failed), so library callers can catch either.
    """

    exit_code: int = 1

    def line(self) -> str:
        """The line ``attnbench`` prints on stderr for this error."""
        return f"error: {self}"


class UsageError(AttnbenchError):
    """The command cannot do what it was asked (nothing measured, nothing written): exit 2."""

    exit_code = 2

    def line(self) -> str:
        return f"attnbench: error: {self}"


class CouldNotMeasure(AttnbenchError):
    """A measurement could not be taken (asv, git, valgrind failed): exit 3."""

    exit_code = 3

    def line(self) -> str:
        return f"error: could not measure: {self}"
