"""What a GPU check's run directories say about the claims a card must bear out, one row each.

Reads the ``prefill/`` and ``train/`` run directories of a gallery folder (``measurements.csv`` and
``manifest.json``, as ``python -m studies.gpu_check`` writes them) and states, with its figure:

- the best rate against the card's own measured matmul roof (none may pass it);
- how many cases were marked noisy, and for which reasons (an idle card should mark none);
- how many cases were checked against the float64 reference, up to which length;
- the time exponents of ``sdpa`` and ``batched`` (the tool's own fit, which leaves noisy cases out,
  and the same fit over every case's median, labelled as such);
- the exponent of ``chunked``'s backward peak bytes (at most L^1.1);
- each fused backend's best rate at L >= 8192 as a share of the bf16 matmul roof (the goal: 70%).

Usage::

    python -m studies.gpu_claims reports/gallery/nvidia-h200   # prints a markdown table

Importing this module does nothing; the work happens under ``__main__``.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd

from attnbench.analysis.complexity import fit_exponent
from studies.gpu_check import BACKENDS

__all__ = ["Claim", "claims", "markdown"]

FUSED = tuple(BACKENDS.split(","))
"""The fused backends the check sweeps (:data:`studies.gpu_check.BACKENDS`)."""
LONG = 8192
"""The shortest length at which the fused backends' rates are held against the roof."""
GOAL_SHARE = 0.70
CHUNKED_BACKWARD_LIMIT = 1.1


@dataclasses.dataclass(frozen=True)
class Claim:
    """One claim: what it says, the figure found, and whether it held (None: not measured)."""

    text: str
    figure: str
    met: bool | None


def _run(folder: Path, name: str) -> tuple[pd.DataFrame, dict] | None:
    run = folder / name
    if not (run / "measurements.csv").is_file():
        return None
    manifest = json.loads((run / "manifest.json").read_text(encoding="utf-8"))
    return pd.read_csv(run / "measurements.csv"), manifest


def _roof_claim(runs: dict[str, tuple[pd.DataFrame, dict]]) -> Claim:
    worst = ("", 0.0, 0.0)
    for name, (rows, manifest) in runs.items():
        for dtype, roof in (manifest.get("peak_gflops") or {}).items():
            rates = rows.loc[rows["spec_dtype"] == dtype, "gflops_per_s"].dropna()
            if len(rates) and rates.max() / roof > worst[1]:
                worst = (name, rates.max() / roof, roof)
    if not worst[0]:
        return Claim("no rate above the card's measured roof", "no rate and roof to compare", None)
    name, share, roof = worst
    figure = f"best rate {share:.0%} of the {roof / 1e3:,.0f} TFLOP/s roof ({name})"
    return Claim("no rate above the card's measured roof", figure, bool(share <= 1.0))


def _noise_claim(runs: dict[str, tuple[pd.DataFrame, dict]]) -> Claim:
    rows = pd.concat([r for r, _ in runs.values()])
    noisy = rows[rows["status"] == "noisy"]
    reasons = Counter(str(r).split(" (pid")[0] for r in noisy["reason"])
    top = "; ".join(f"{n} x '{why}'" for why, n in reasons.most_common(3))
    figure = f"{len(noisy)} of {len(rows)} cases noisy" + (f": {top}" if top else "")
    return Claim("on the idle card, no case marked noisy", figure, len(noisy) == 0)


def _checked_claim(runs: dict[str, tuple[pd.DataFrame, dict]]) -> Claim:
    rows = pd.concat([r for r, _ in runs.values()])
    ran = rows[rows["median_s"].notna()]
    checked = ran[ran["error_ratio"].notna()]
    passed = checked[checked["error_ratio"] <= 1.0]
    longest = int(ran["spec_seq_len"].max()) if len(ran) else 0
    figure = (
        f"{len(passed)} of {len(ran)} cases that ran were checked and within tolerance "
        f"(worst error ratio {checked['error_ratio'].max():.2f}), up to L={longest}"
    )
    return Claim("every case checked against the reference", figure, len(passed) == len(ran))


def _fit(lengths: pd.Series, values: pd.Series) -> dict:
    return fit_exponent(np.asarray(lengths, float), np.asarray(values, float))


def _exponent_text(fit: dict) -> str:
    if not fit["conclusive"]:
        return f"inconclusive ({fit['note']})"
    return f"L^{fit['exponent']:.2f} [{fit['ci_low']:.2f}, {fit['ci_high']:.2f}]"


def _time_claim(prefill: pd.DataFrame | None) -> Claim:
    text = "sdpa's and batched's time exponents conclusive"
    if prefill is None:
        return Claim(text, "no prefill run", None)
    parts, met = [], True
    for variant in ("sdpa", "batched"):
        rows = prefill[(prefill["variant"] == variant) & (prefill["spec_mask"] == "none")]
        ok = rows[rows["status"] == "ok"]
        tool = _fit(ok["spec_seq_len"], ok["median_s"])
        every = _fit(rows["spec_seq_len"], rows["median_s"])
        met = met and bool(tool["conclusive"])
        parts.append(
            f"{variant}: {_exponent_text(tool)}; over every case's median, noisy ones too: "
            f"{_exponent_text(every)}"
        )
    return Claim(text, "; ".join(parts), met)


def _chunked_claim(train: pd.DataFrame | None) -> Claim:
    text = f"chunked's backward peak bytes fitted at most L^{CHUNKED_BACKWARD_LIMIT}"
    rows = (
        None
        if train is None
        else train[(train["variant"] == "chunked") & (train["spec_mode"] == "backward")]
    )
    if rows is None or rows["peak_tensor_bytes"].notna().sum() == 0:
        return Claim(text, "not measured: no chunked backward case ran", None)
    rows = rows[rows["spec_mask"] == "none"]
    fit = _fit(rows["spec_seq_len"], rows["peak_tensor_bytes"])
    met = bool(fit["conclusive"]) and fit["exponent"] <= CHUNKED_BACKWARD_LIMIT
    return Claim(text, _exponent_text(fit), met)


def _fused_claim(runs: dict[str, tuple[pd.DataFrame, dict]]) -> Claim:
    text = f"fused backends at L >= {LONG // 1024}K reach {GOAL_SHARE:.0%} of the bf16 matmul roof"
    best: dict[str, tuple[float, int, str]] = {}
    for name, (rows, manifest) in runs.items():
        roof = (manifest.get("peak_gflops") or {}).get("bfloat16")
        long = rows[(rows["spec_seq_len"] >= LONG) & rows["variant"].isin(FUSED)]
        for _, row in long.dropna(subset=["gflops_per_s"]).iterrows():
            share = row["gflops_per_s"] / roof
            if roof and share > best.get(row["variant"], (0.0,))[0]:
                where = f"{name} {row['spec_mode']} {row['spec_mask']} L={row['spec_seq_len']}"
                best[row["variant"]] = (share, int(row["gflops_per_s"]), where)
    if not best:
        return Claim(text, f"no fused case at L >= {LONG} ran", None)
    figure = "; ".join(
        f"{v} {share:.0%} ({rate / 1e3:,.0f} TFLOP/s, {where})"
        for v, (share, rate, where) in sorted(best.items())
    )
    return Claim(text, figure, all(share >= GOAL_SHARE for share, _, _ in best.values()))


def claims(folder: Path) -> list[Claim]:
    """The claims, in the order above, from the run directories under ``folder``."""
    runs = {name: run for name in ("prefill", "train") if (run := _run(folder, name))}
    if not runs:
        raise ValueError(f"folder: no prefill/ or train/ run directory under {folder}")
    prefill, train = (runs[n][0] if n in runs else None for n in ("prefill", "train"))
    return [
        _roof_claim(runs),
        _noise_claim(runs),
        _checked_claim(runs),
        _time_claim(prefill),
        _chunked_claim(train),
        _fused_claim(runs),
    ]


def markdown(found: list[Claim]) -> str:
    """A table: claim, figure, met / not met / not measured."""
    word = {True: "met", False: "**not met**", None: "not measured"}
    lines = ["| claim | figure | |", "|---|---|---|"]
    lines += [f"| {c.text} | {c.figure.replace('|', '/')} | {word[c.met]} |" for c in found]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m studies.gpu_claims GALLERY_FOLDER")
    print(markdown(claims(Path(sys.argv[1]))), end="")
