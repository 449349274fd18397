"""Numbers as the report writes them: 3 significant figures with a readable unit (``fmt``), and
commits by their short hash (``short_hash``)."""

from __future__ import annotations

import math

__all__ = ["SHORT_HASH", "sig", "ratio", "fmt", "short_hash", "count", "agree"]

SHORT_HASH = 8  # characters of a commit hash shown on the page (asv's own convention)


def sig(value: float, digits: int = 3) -> str:
    """``value`` to ``digits`` significant figures, 12,300 rather than 1.23e+04."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    text = f"{value:.{digits}g}"
    if "e" in text:  # 1.23e+04 -> 12,300
        text = f"{float(text):,.0f}" if abs(value) >= 1 else f"{value:.{digits}e}"
    return text


def ratio(value: float, metric: str) -> str:
    """A HEAD / BASE ratio, ``x1.23``, with the digits its metric needs.

    A count's 0.2% change is a verdict, so instructions get 4.
    """
    return f"x{value:.{4 if metric == 'instructions' else 2}f}"


def fmt(value: float, unit: str) -> str:
    """``value`` with a readable unit and 3 significant figures: "1.08 GB", "3.1 ms", "112x".

    Args:
        value: the number in the base unit (seconds, bytes, GFLOP/s, a ratio "x").
        unit: "s", "bytes", "x", "GFLOP/s" or anything else (printed after the number).
    """
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    if unit == "s":
        for scale, name in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs"), (1e-9, "ns")):
            if abs(value) >= scale or scale == 1e-9:
                return f"{sig(value / scale)} {name}"
    if unit == "bytes":
        for scale, name in ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
            if abs(value) >= scale:
                return f"{sig(value / scale)} {name}"
        return f"{value:.0f} B"
    if unit == "x":
        return f"{sig(value)}x"
    return f"{sig(value)} {unit}"


def short_hash(commit: object) -> str:
    return str(commit)[:SHORT_HASH] if commit else ""


def count(n: int, noun: str, plural: str = "") -> str:
    """``1 case``, ``3 cases``, ``1 fit``: a number and its noun in agreement (``plural``: an
    irregular one, e.g. ``count(2, "is", "are")``)."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def agree(n: int, one: str, many: str) -> str:
    """The word of ``one`` or ``many`` that agrees with ``n``: ``agree(1, "is", "are")`` -> "is"."""
    return one if n == 1 else many
