"""The sides compared and the primary slice: which runs, commits or machines a page sets side by
side (:func:`sides`, their ratios in :func:`compare`), and the one side, machine and setting the
story is told from (:func:`primary_slice`, and :func:`restrict` / :func:`pair_decode` to its rows).

Read by :mod:`attnbench.analysis.summary` and the finding rules
(:mod:`attnbench.analysis.findings`); nothing here fits a curve or writes a sentence.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from attnbench import contract
from attnbench.analysis import complexity
from attnbench.analysis.text import SHORT_HASH, short_hash
from attnbench.contract import Source, Status

__all__ = [
    "SLICE",
    "Comparison",
    "compare",
    "decode_commit",
    "pair_decode",
    "primary_slice",
    "restrict",
    "side_key",
    "sides",
]

SLICE = contract.case_columns(
    ("machine", "commit", "device", "mode", "dtype", "mask"),
    without=("workload", "variant", *contract.LENGTHS),
)
"""The columns that pick the primary slice (beside its side), in the order they are picked (its
shape last: ``heads`` before ``kv_heads``). Its lengths, variants and workloads are the story."""


@dataclass(frozen=True)
class Comparison:
    """Side B against side A (runs, commits, machines): time and memory ratios where both ran ok."""

    label_a: str  # what A is (run directory, short hash, machine)
    label_b: str  # what B is
    # variant, seq_len, device, mode, dtype, mask, time_a, time_b, ratio (B / A)
    ratios: pd.DataFrame
    # same keys, bytes_a, bytes_b, ratio (B / A): measured peak tensor bytes only
    memory: pd.DataFrame = field(default_factory=pd.DataFrame)


# ---- sides: the runs, commits or machines compared ----------------------------------------------
def side_key(frame: pd.DataFrame) -> pd.Series:
    """One label per run / commit / machine, naming only what differs between them."""
    origin = (
        frame["origin"].fillna("").astype(str)
        if "origin" in frame
        else pd.Series("", index=frame.index)
    )
    parts = {
        "origin": origin.map(lambda p: Path(p).name or p),
        "machine": frame["machine"].astype(str),
        "commit": frame["commit"].fillna("").astype(str).str[:SHORT_HASH],
    }
    varying = [k for k in ("origin", "machine", "commit") if parts[k].nunique() > 1]
    if not varying:
        return pd.Series("this run", index=frame.index)
    if (
        "origin" in varying
        and len(varying) > 1
        and origin.nunique() == frame.groupby(["machine", "commit"]).ngroups
    ):
        # each source is one machine/commit: name those instead of the path
        varying.remove("origin")
    return pd.Series(
        [" / ".join(p) for p in zip(*(parts[k] for k in varying), strict=True)], index=frame.index
    )


def sides(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per side: label, source kind, machine, short hash, run date, commit date, cases."""
    if frame.empty:
        return pd.DataFrame()
    frame = frame.assign(side=side_key(frame))
    rows = []
    for label, group in frame.groupby("side", sort=False):
        time_rows = group[group["metric"] == "time"]
        run_date = group["run_date"].min() if "run_date" in group else pd.NaT
        rows.append(
            {
                "side": label,
                "source": ", ".join(sorted(set(group["source"]))),
                "machine": ", ".join(sorted(set(group["machine"]))),
                "commit": ", ".join(sorted({short_hash(c) for c in group["commit"] if c})),
                "run date": run_date,
                "commit date": group["date"].min()
                if (group["source"] == Source.ASV).any()
                else pd.NaT,
                "cases ok": int((time_rows["status"] == Status.OK).sum()),
                "cases": len(time_rows),
            }
        )
    out = pd.DataFrame(rows)
    return out.sort_values(
        ["commit date", "run date"], na_position="first", kind="stable"
    ).reset_index(drop=True)


# metric -> column prefix of A's and B's values
_COMPARED = {"time": "time", "peak_tensor_bytes": "bytes"}
_CASE = contract.case_columns(
    ("variant", "seq_len", "device", "mode", "dtype", "mask"), without=("machine",)
)
"""A case of both sides (sides may be machines): its shape too, so no ratio pools two shapes."""


def _ratios(med: pd.DataFrame, prefix: str, label_a: str, label_b: str) -> pd.DataFrame:
    """B / A per case from the per-side medians of one metric (cases where A's value is > 0)."""
    a = med[med["side"] == label_a].drop(columns="side").rename(columns={"value": f"{prefix}_a"})
    b = med[med["side"] == label_b].drop(columns="side").rename(columns={"value": f"{prefix}_b"})
    both = a.merge(b, on=_CASE)
    both = both[both[f"{prefix}_a"] > 0].reset_index(drop=True)
    both["seq_len"] = both["seq_len"].astype("int64")
    both["ratio"] = both[f"{prefix}_b"] / both[f"{prefix}_a"]
    return both


def compare(frame: pd.DataFrame, sides: pd.DataFrame) -> tuple[Comparison, ...]:
    """B / A ratios of time and of peak tensor bytes, per case both sides ran ok.

    Memory: measured values only (not "model"), where A's is above 0."""
    if len(sides) < 2:
        return ()
    frame = frame.assign(side=side_key(frame))
    ok = frame[
        (frame["status"] == Status.OK)
        & (frame["seq_len"] == frame["seq_len_k"])
        & (frame["method"] != complexity.MODEL)
    ]
    med = {
        metric: ok[ok["metric"] == metric]
        .groupby(["side", *_CASE], dropna=False)["value"]
        .median()
        .reset_index()
        for metric in _COMPARED
    }
    label_a = str(sides["side"].iloc[0])
    return tuple(
        Comparison(
            label_a=label_a,
            label_b=str(label_b),
            ratios=_ratios(med["time"], _COMPARED["time"], label_a, label_b),
            memory=_ratios(
                med["peak_tensor_bytes"], _COMPARED["peak_tensor_bytes"], label_a, label_b
            ),
        )
        for label_b in sides["side"].iloc[1:4]
    )


# ---- the primary slice: the side, machine and setting the story is told from --------------------
def primary_slice(frame: pd.DataFrame) -> dict[str, str]:
    """The slice the findings are read from: the first side, its most common device, forward, ..."""
    time_rows = frame[frame["metric"] == "time"]
    if time_rows.empty:
        return {}
    side = side_key(frame)
    first = side.loc[time_rows.index].iloc[0]
    rows = time_rows[side.loc[time_rows.index] == first]
    pick = {"side": str(first)}
    prefer = {"mode": "forward", "mask": "none"}
    for col in SLICE:
        if col not in rows:
            continue
        values = _as_text(rows[col])
        # plain attention before grouped queries
        wanted = pick.get("heads") if col == "kv_heads" else prefer.get(col)
        choice = wanted if wanted in set(values) else values.value_counts().index[0]
        pick[col] = choice
        rows = rows[values == choice]
    return pick


def _as_text(values: pd.Series) -> pd.Series:
    """A column as the text it is compared by: whole numbers without a point (8 and 8.0 alike)."""
    numbers = pd.to_numeric(values, errors="coerce")
    whole = numbers.notna() & (numbers == numbers.round())
    return values.astype(str).where(~whole, numbers.round().astype("Int64").astype(str))


def restrict(
    table: pd.DataFrame, primary: dict[str, str], columns: Sequence[str] = SLICE
) -> pd.DataFrame:
    """The rows of ``table`` (frame rows, fits, crossovers) whose ``columns`` match ``primary``."""
    keep = pd.Series(True, index=table.index)
    for col in columns:
        if col in primary and col in table:
            keep &= _as_text(table[col]) == primary[col]
    return table[keep]


def decode_commit(frame: pd.DataFrame, primary: dict[str, str]) -> str:
    """The commit whose decode cases pair with the primary prefill ones.

    The primary commit when it ran decode on the primary machine, else the machine's latest decode
    run (a decode sweep is often a later run)."""
    if "workload" not in frame or not primary:
        return primary.get("commit", "") if primary else ""
    rows = frame[
        (frame["workload"] == "decode") & (frame["machine"].astype(str) == primary["machine"])
    ]
    if rows.empty or (rows["commit"].astype(str) == primary["commit"]).any():
        return primary["commit"]
    return str(rows.sort_values("run_date", na_position="first")["commit"].iloc[-1])


def pair_decode(table: pd.DataFrame, primary: dict[str, str], commit: str) -> pd.DataFrame:
    """The primary machine's rows or fits: prefill of the primary commit, decode of ``commit``."""
    if not primary or table.empty:
        return table
    decode = (
        table["workload"] == "decode"
        if "workload" in table
        else pd.Series(False, index=table.index)
    )
    commits = table["commit"].astype(str)
    return table[
        (table["machine"].astype(str) == primary["machine"])
        & ((~decode & (commits == primary["commit"])) | (decode & (commits == commit)))
    ]
