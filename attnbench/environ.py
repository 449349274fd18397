"""The ``ATTNBENCH_*`` variables that shape asv's grid, read and checked in one place.

The asv suite reads them when asv imports it, and the commands that start asv (``shard``,
``regress``) pass them on: a value that cannot be used must stop those commands before any work,
naming the variable and what it may hold, never surface as a traceback inside asv or go unnoticed
(an unknown variant name that narrows the grid to nothing). :func:`problems` says what is wrong with
the current environment; :func:`read_list` and :func:`read_number` read one variable, raising the
same message.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping

from attnbench import contract, masks
from attnbench.errors import UsageError
from attnbench.registry import variant_names
from attnbench.spec import MODES

__all__ = [
    "EnvironmentVariableError",
    "THREADS",
    "read_list",
    "read_number",
    "read_budget",
    "problems",
]

THREADS = "ATTNBENCH_THREADS"
"""Torch threads of asv's benchmark processes (default: the regime's)."""


class EnvironmentVariableError(ValueError, UsageError):
    """An ``ATTNBENCH_*`` variable holds a value that cannot be used (a usage error: exit 2)."""


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not (math.isfinite(value) and value > 0):
        raise ValueError
    return value


def _device(text: str) -> str:
    if text != "cpu" and not (text == "cuda" or (text.startswith("cuda:") and text[5:].isdigit())):
        raise ValueError
    return text


def _one_of(choices: Callable[[], tuple[str, ...]]) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in choices():
            raise ValueError
        return text

    return parse


_LISTS: dict[str, tuple[Callable[[str], object], str]] = {
    contract.ENV_VARIANTS: (_one_of(lambda: tuple(variant_names())), "registered variant names"),
    contract.ENV_LENGTHS: (_positive_int, "lengths, integers >= 1"),
    contract.ENV_DECODE_LENGTHS: (_positive_int, "cache lengths, integers >= 1"),
    contract.ENV_DEVICES: (_device, "devices: cpu, cuda or cuda:N"),
    contract.ENV_MODES: (_one_of(lambda: MODES), f"passes: {', '.join(MODES)}"),
    contract.ENV_MASKS: (
        _one_of(lambda: masks.MASK_KINDS),
        f"mask kinds: {', '.join(masks.MASK_KINDS)}",
    ),
}
"""Comma-separated variables: how one item is read, and what the items may be."""
_NUMBERS: dict[str, tuple[Callable[[str], float], str]] = {
    contract.ENV_MAX_CALL_S: (_positive_float, "a number of seconds > 0"),
    contract.ENV_BATCH: (_positive_int, "an integer >= 1"),
    contract.ENV_COUNT_PROCESSES: (_positive_int, "an integer >= 1"),
    THREADS: (_positive_int, "an integer >= 1"),
}
"""Single-value variables."""


def _error(name: str, raw: str, expected: str) -> EnvironmentVariableError:
    valid = f" (valid: {', '.join(variant_names())})" if name == contract.ENV_VARIANTS else ""
    return EnvironmentVariableError(
        f"{name}={raw!r}: expected comma-separated {expected}{valid}"
        if name in _LISTS
        else f"{name}={raw!r}: expected {expected}"
    )


def read_list(name: str, default: list, environ: Mapping[str, str] | None = None) -> list:
    """Items of ``name`` (comma-separated, each read and checked); ``default`` if unset or empty.

    Raises:
        EnvironmentVariableError: an item that is not what the variable holds, or no item at all.
    """
    raw = (os.environ if environ is None else environ).get(name, "").strip()
    if not raw:
        return default
    parse, expected = _LISTS[name]
    try:
        items = [parse(x.strip()) for x in raw.split(",") if x.strip()]
    except ValueError:
        raise _error(name, raw, expected) from None
    if not items:
        raise _error(name, raw, expected)
    return items


def read_number(name: str, default: float, environ: Mapping[str, str] | None = None) -> float:
    """The value of the single-value variable ``name``, else ``default`` when unset or empty.

    Raises:
        EnvironmentVariableError: a value that is not what the variable holds.
    """
    raw = (os.environ if environ is None else environ).get(name, "").strip()
    if not raw:
        return default
    parse, expected = _NUMBERS[name]
    try:
        return parse(raw)
    except ValueError:
        raise _error(name, raw, expected) from None


def read_budget(
    name: str, default: float | None, environ: Mapping[str, str] | None = None
) -> float | None:
    """A budget in seconds, or ``none`` (no budget: None), else ``default`` when unset or empty.

    Raises:
        EnvironmentVariableError: neither ``none`` nor a finite number > 0.
    """
    raw = (os.environ if environ is None else environ).get(name, "").strip().lower()
    if not raw:
        return default
    if raw == "none":
        return None
    try:
        return _positive_float(raw)
    except ValueError:
        raise EnvironmentVariableError(
            f"{name}={raw!r}: expected a number of seconds > 0, or none"
        ) from None


def problems(environ: Mapping[str, str] | None = None) -> list[str]:
    """What is wrong with the ``ATTNBENCH_*`` variables of ``environ`` (default: this process's).

    One line each.
    """
    out = []
    try:
        contract.asv_tier(environ)
    except ValueError as exc:
        out.append(str(exc))
    try:
        read_budget(contract.ENV_COUNT_BUDGET_S, None, environ)
    except EnvironmentVariableError as exc:
        out.append(str(exc))
    for name in _LISTS:
        try:
            read_list(name, [], environ)
        except EnvironmentVariableError as exc:
            out.append(str(exc))
    for name in _NUMBERS:
        try:
            read_number(name, 0, environ)
        except EnvironmentVariableError as exc:
            out.append(str(exc))
    return out
