"""Turn a tidy frame into claims: fitted exponents, crossovers, memory model, % of peak.

How the fit range is chosen: at short lengths a constant per-call cost (interpreter, dispatch,
kernel launch) hides the asymptotic term. We fit ``log(value) = a + p log(L)`` over the lengths
where the value is at least ``DOMINANCE`` (10x) the value at the shortest length measured, i.e.
where that constant is below ~10% of the total. If that leaves fewer than ``MIN_POINTS`` (3)
lengths, the longest 3 are used, and the row says so. The slope ``p`` comes with a 95% confidence
interval (Student t, n - 2 degrees of freedom) and R^2, and is compared with the variant's declared
exponent. Big-O is an upper bound, so only a fit *steeper* than declared by more than ``TOLERANCE``
with the declared value outside the interval is a mismatch; a shallower fit is reported as
"shallower" (a lower-order term, such as a fixed block buffer or a linear projection, still matters
in the measured range).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import stats

from attnbench.registry import get_variant, variant_names
from attnbench.spec import AttnSpec

DOMINANCE = 10.0
MIN_POINTS = 3
TOLERANCE = 0.25
GROUP = ["source", "machine", "commit", "device", "mode", "dtype", "mask", "variant", "metric"]
DECLARED = {"time": "time_exponent", "peak_tensor_bytes": "memory_exponent"}


def fit_exponent(lengths: np.ndarray, values: np.ndarray) -> dict[str, float | int | str]:
    """Least-squares slope of log(value) on log(L) over the dominance range (see module doc)."""
    order = np.argsort(lengths)
    lengths, values = np.asarray(lengths, float)[order], np.asarray(values, float)[order]
    keep = values > 0
    lengths, values = lengths[keep], values[keep]
    if len(lengths) < 2:
        return {"exponent": math.nan, "ci_low": math.nan, "ci_high": math.nan, "r2": math.nan, "n": len(lengths), "L_min": math.nan, "L_max": math.nan, "range": "too few points"}
    dominant = values >= DOMINANCE * values[0]
    rule = f"value >= {DOMINANCE:g}x value at L={int(lengths[0])}"
    if dominant.sum() < MIN_POINTS:
        dominant = np.zeros_like(dominant)
        dominant[-MIN_POINTS:] = True
        rule = f"longest {min(MIN_POINTS, len(lengths))} lengths"
    x, y = np.log(lengths[dominant]), np.log(values[dominant])
    n = len(x)
    if n < 2:
        return {"exponent": math.nan, "ci_low": math.nan, "ci_high": math.nan, "r2": math.nan, "n": n, "L_min": math.nan, "L_max": math.nan, "range": rule}
    fit = stats.linregress(x, y)
    # Two points determine a line but not its uncertainty: the interval is then unbounded.
    half = stats.t.ppf(0.975, n - 2) * fit.stderr if n > 2 else math.inf
    return {
        "exponent": float(fit.slope), "ci_low": float(fit.slope - half), "ci_high": float(fit.slope + half),
        "r2": float(fit.rvalue**2), "n": n, "L_min": int(math.exp(x[0]) + 0.5), "L_max": int(math.exp(x[-1]) + 0.5),
        "range": rule,
    }


def verdict(fit: dict, declared: float) -> str:
    """"matches", "steeper" (a mismatch), "shallower", or "" when nothing is declared or fitted."""
    slope = fit["exponent"]
    if math.isnan(declared) or math.isnan(slope):
        return ""
    inside = fit["ci_low"] <= declared <= fit["ci_high"]
    if slope > declared + TOLERANCE and not inside:
        return "steeper"
    if slope < declared - TOLERANCE and not inside:
        return "shallower"
    return "matches"


def declared_exponent(variant: str, metric: str) -> float:
    if metric not in DECLARED or variant not in variant_names():
        return math.nan
    return float(getattr(get_variant(variant), DECLARED[metric]))


def fit_table(frame: pd.DataFrame, metrics: tuple[str, ...] = ("time", "peak_tensor_bytes")) -> pd.DataFrame:
    """One row per (source, machine, commit, device, mode, dtype, mask, variant, metric) group."""
    ok = frame[(frame["status"] == "ok") & frame["metric"].isin(metrics) & (frame["seq_len"] == frame["seq_len_k"])]
    rows = []
    for key, group in ok.groupby(GROUP, dropna=False, sort=True):
        by_len = group.groupby("seq_len")["value"].median()
        fit = fit_exponent(by_len.index.to_numpy(), by_len.to_numpy())
        declared = declared_exponent(key[GROUP.index("variant")], key[GROUP.index("metric")])
        rows.append({**dict(zip(GROUP, key, strict=True)), **fit, "declared": declared, "verdict": verdict(fit, declared)})
    return pd.DataFrame(rows)


def crossovers(frame: pd.DataFrame, baselines: tuple[str, ...] = ("batched", "sdpa"), metric: str = "time") -> pd.DataFrame:
    """Length from which each variant stays below each baseline (faster, or smaller for memory).

    ``crossover`` is the smallest measured L such that the variant beats the baseline at L and at
    every longer length both were measured at; "never" / "always" describe the edge cases.
    """
    ok = frame[(frame["status"] == "ok") & (frame["metric"] == metric)]
    rows = []
    keys = ["source", "machine", "commit", "device", "mode", "dtype", "mask"]
    for key, group in ok.groupby(keys, dropna=False):
        table = group.pivot_table(index="seq_len", columns="variant", values="value", aggfunc="median").sort_index()
        for base in baselines:
            if base not in table:
                continue
            for variant in table.columns:
                if variant == base:
                    continue
                both = table[[variant, base]].dropna()
                if both.empty:
                    continue
                wins = (both[variant] < both[base]).to_numpy()
                cross = "never"
                for i in range(len(wins)):
                    if wins[i:].all():
                        cross = "always" if i == 0 else str(int(both.index[i]))
                        break
                ratio = both[base].iloc[-1] / both[variant].iloc[-1]
                rows.append({**dict(zip(keys, key, strict=True)), "variant": variant, "baseline": base, "metric": metric,
                             "crossover_L": cross, "longest_L": int(both.index[-1]), "ratio_at_longest": ratio})
    return pd.DataFrame(rows)


def largest_length(frame: pd.DataFrame) -> pd.DataFrame:
    """Longest L each variant ran ``ok`` at, and why the next one did not (first non-ok reason)."""
    time_rows = frame[frame["metric"] == "time"]
    rows = []
    for (device, mode, variant), group in time_rows.groupby(["device", "mode", "variant"], sort=False):
        ok = group[group["status"] == "ok"]
        longest = int(ok["seq_len"].max()) if len(ok) else None
        beyond = group[(group["status"] != "ok") & (group["seq_len"] > (longest or 0))].sort_values("seq_len")
        first = beyond.iloc[0] if len(beyond) else None
        rows.append({
            "device": device, "mode": mode, "variant": variant, "largest_ok_L": longest,
            "next_status": "" if first is None else first["status"],
            "next_reason": "" if first is None else (first["reason"] or first["status"]),
        })
    return pd.DataFrame(rows)


def memory_model(frame: pd.DataFrame) -> pd.DataFrame:
    """Predicted vs measured peak tensor bytes per variant and length, with their ratio."""
    mem = frame[(frame["metric"] == "peak_tensor_bytes") & (frame["status"] == "ok")]
    rows = []
    for rec in mem.to_dict("records"):
        if rec["variant"] not in variant_names():
            continue
        spec = AttnSpec(
            batch=int(rec["batch"]), heads=int(rec["heads"]), seq_len=int(rec["seq_len"]), seq_len_k=int(rec["seq_len_k"]),
            head_dim=int(rec["head_dim"]), dtype=rec["dtype"], device=rec["device"], mode=rec["mode"], mask=rec["mask"],
        )
        predicted = get_variant(rec["variant"]).predicted_peak_bytes(spec)
        rows.append({
            "machine": rec["machine"], "device": rec["device"], "mode": rec["mode"], "variant": rec["variant"],
            "seq_len": int(rec["seq_len"]), "predicted_MiB": predicted / 2**20, "measured_MiB": rec["value"] / 2**20,
            "measured/predicted": rec["value"] / predicted if predicted else math.nan,
        })
    return pd.DataFrame(rows)


def roofline(frame: pd.DataFrame) -> pd.DataFrame:
    """Achieved GFLOP/s as a percentage of the machine's measured matmul peak."""
    g = frame[(frame["metric"] == "gflops") & (frame["status"] == "ok")].copy()
    g["pct_of_peak"] = 100.0 * g["value"] / g["peak_gflops"]
    return g[["machine", "device", "mode", "variant", "seq_len", "value", "peak_gflops", "pct_of_peak"]].rename(columns={"value": "gflops"})
