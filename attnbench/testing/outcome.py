"""What the checks found, kept for the pytest plugin's summary, and how an undecided one ends.

Every check appends a :class:`Record` (one line of the summary) to this process's list; the plugin
(``attnbench_pytest``) takes the records each test made and prints them at the end of the session.
Nothing is printed here. A verdict the checks cannot reach (a time comparison the noise does not
settle, a metric this machine cannot measure) ends the test as a pytest skip with the reason, never
a pass: :func:`undecided`.
"""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass

__all__ = ["Undecided", "Record", "verdict", "note", "records", "take_records", "undecided"]


class Undecided(Exception):  # noqa: N818 - a verdict, not an error
    """A check that could not decide, raised where pytest is not running (else it skips)."""


@dataclass(frozen=True)
class Record:
    """One check's outcome, as the summary line shows it."""

    kernel: str
    check: str  # "answer", "growth", "within" or "time"
    metric: str  # the metric ("" for the answer check)
    verdict: str  # "passed", "failed" or "undecided"
    summary: str  # e.g. "peak_tensor_bytes L^1.00 (local 0.98..1.01), 1.07 GB at L=131072"

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def verdict(passed: bool) -> str:
    """A record's verdict for a check that decided."""
    return "passed" if passed else "failed"


_RECORDS: list[Record] = []


def note(record: Record) -> Record:
    """Keep ``record`` for the summary (the checks call this before they pass, fail or skip)."""
    _RECORDS.append(record)
    return record


def records() -> list[Record]:
    """Every record this process kept that has not been taken."""
    return list(_RECORDS)


def take_records() -> list[Record]:
    """The records kept so far, removed from the list (the plugin takes them after each test)."""
    taken = list(_RECORDS)
    _RECORDS.clear()
    return taken


def undecided(reason: str) -> None:
    """End the current check undecided: ``pytest.skip(reason)`` inside pytest, else raise.

    Raises:
        Undecided: outside pytest (pytest's own skip exception inside it).
    """
    pytest = sys.modules.get("pytest")
    if pytest is not None:
        pytest.skip(reason)
    raise Undecided(reason)
