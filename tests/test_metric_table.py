"""The metric table: one row is all a metric needs to reach the CSV export, the frame, the fits, the plots and asv."""

from __future__ import annotations

import math

import pytest

from attnbench import contract
from attnbench.analysis import complexity
from attnbench.analysis.rundir import load_run
from attnbench.measure.config import MeasureConfig
from attnbench.measure.record import Measurement
from attnbench.rundir_format import MEASUREMENTS
from attnbench.runs import write_run
from attnbench.spec import AttnSpec
from tests.box import BOX

THROWAWAY = contract.Metric(
    "scratch_pages",
    "pages",
    "4 KiB pages of scratch per call",
    field="extra.scratch_pages",
    method="counted",
    asv=("AttentionMetrics.track_scratch_pages",),
    fitted=True,
)
"""A metric no code knows: its value is a key of ``extra``, as a plugin's measurement would record it."""
DERIVED = ("METRICS", "UNITS", "LABELS", "FITTED", "DECLARED", "ASV_METRICS")


@pytest.fixture
def with_throwaway():
    saved = {name: type(getattr(contract, name))(getattr(contract, name)) for name in DERIVED}
    contract.add_metric(THROWAWAY)
    yield THROWAWAY
    for name, value in saved.items():  # the same objects every module holds: restored in place
        getattr(contract, name).clear()
        getattr(contract, name).__iadd__(value) if isinstance(value, list) else getattr(
            contract, name
        ).update(value)


def _run(tmp_path):
    env = BOX
    cases = []
    for n in (64, 128, 256, 512, 1024):
        t = 1e-7 * n * n
        cases.append(
            Measurement(
                variant="batched",
                spec=AttnSpec(heads=2, head_dim=16, seq_len=n),
                status="ok",
                samples=(t, t, t),
                runs=3,
                timing_method="wall",
                env=env,
                extra={"scratch_pages": 2 * n * n * 4 / 4096},
            )
        )
    return write_run(tmp_path / "run", cases, MeasureConfig(), seconds=1.0, command=["t"])


def test_a_metric_added_to_the_table_alone_reaches_the_export_the_frame_the_fits_a_figure_and_asv(
    with_throwaway, tmp_path
):
    run = _run(tmp_path)
    assert "scratch_pages" in (run / MEASUREMENTS).read_text().splitlines()[0].split(
        ","
    )  # the CSV export's column
    frame = load_run(run).frame
    rows = frame[frame["metric"] == "scratch_pages"]
    assert len(rows) == 5 and set(rows["unit"]) == {"pages"} and set(rows["method"]) == {"counted"}
    assert rows.sort_values("seq_len")["value"].iloc[0] == pytest.approx(2 * 64 * 64 * 4 / 4096)
    fits = complexity.fit_table(frame).set_index("metric")
    assert fits.loc["scratch_pages", "exponent"] == pytest.approx(
        2.0
    )  # fitted because the row says so

    from attnbench.report import plots

    fig = plots.scaling(frame, "scratch_pages")
    assert fig.axes[0].get_ylabel() == "4 KiB pages of scratch per call"

    pytest.importorskip("asv")
    from attnbench import asv_bench

    @asv_bench.tracked
    class AttentionMetrics:
        pass

    assert AttentionMetrics.track_scratch_pages.unit == "pages"  # asv discovers it with its unit
    assert contract.ASV_METRICS["track_scratch_pages"] == ("scratch_pages", 1.0, "asv")


def test_the_table_refuses_a_second_row_of_a_name_or_an_asv_benchmark():
    with pytest.raises(ValueError, match="already in the table"):
        contract.add_metric(contract.METRICS["time"])
    with pytest.raises(ValueError, match="already record another metric"):
        contract.add_metric(contract.Metric("other", "s", "x", asv=(contract.TIME_BENCHMARK,)))


def test_page_faults_is_a_row_like_the_others():
    """The metric added through the table: read from extra, fitted, tracked by asv, labelled."""
    row = contract.METRICS["page_faults"]
    assert (
        row.field == "extra.page_faults"
        and row.fitted
        and row.tracked == ("AttentionMetrics.track_page_faults",)
    )
    m = Measurement(
        variant="batched", spec=AttnSpec(), status="ok", samples=(1.0,), extra={"page_faults": 7}
    )
    assert m.to_row()["page_faults"] == 7 and "extra_page_faults" not in m.to_row()
    assert math.isnan(
        contract.metric_value(
            Measurement(variant="b", spec=AttnSpec(), status="skipped"), row.field
        )
    )


def test_the_run_queue_rows_are_facts_about_the_machine(tmp_path):
    """Read from extra, never fitted, not timed: a noisy case (a neighbour took its core) keeps them as measured, in the
    CSV export, the frame and the report's collapsed table; a case without them (a kernel that does not report the
    wait, a run before they existed) has no rows, never an ok NaN."""
    from attnbench.reporting import build_report

    for name in ("waited_blocks", "runqueue_share"):
        row = contract.METRICS[name]
        assert (
            row.field == f"extra.{name}"
            and not row.fitted
            and not row.timed
            and row.unit == "share"
        )
    env = BOX
    spec = AttnSpec(heads=2, head_dim=16)
    cases = [
        Measurement(
            variant="batched",
            spec=spec.replace(seq_len=n),
            status="ok",
            samples=(1e-7 * n * n,) * 3,
            runs=3,
            timing_method="wall",
            env=env,
            extra={"waited_blocks": 0.25, "runqueue_share": 0.02, "runqueue_max": 0.6},
        )
        for n in (64, 128)
    ]
    cases.append(
        Measurement(
            variant="batched",
            spec=spec.replace(seq_len=256),
            status="noisy",
            samples=(1e-2,) * 3,
            runs=3,
            timing_method="wall",
            env=env,
            reason="run-queue wait: a neighbour took the core",
            extra={"waited_blocks": 1.0, "runqueue_share": 0.5, "runqueue_max": 0.7},
        )
    )
    cases.append(
        Measurement(
            variant="batched",
            spec=spec.replace(seq_len=512),
            status="ok",
            samples=(1e-2,) * 3,
            runs=3,
            timing_method="wall",
            env=env,
        )
    )
    run = write_run(tmp_path / "run", cases, MeasureConfig(), seconds=1.0, command=["t"])
    header = (run / MEASUREMENTS).read_text().splitlines()[0].split(",")
    assert {"waited_blocks", "runqueue_share", "extra_runqueue_max"} <= set(header)
    frame = load_run(run).frame
    waited = frame[frame["metric"] == "waited_blocks"].set_index("seq_len")
    assert list(waited.index) == [64, 128, 256] and set(waited["status"]) == {
        "ok"
    }  # the noisy case's wait is a fact
    assert waited.loc[256, "value"] == 1.0 and set(waited["method"]) == {"schedstat"}
    assert "waited_blocks" not in set(complexity.fit_table(frame)["metric"])
    page = build_report([run], tmp_path / "out").read_text()
    assert "Run-queue wait per case" in page and "100%" in page and "noisy" in page
