"""The report of a fixed set of run directories says exactly what it said before (see ``tests/golden.py``)."""

from __future__ import annotations

import json

import pytest

from tests import golden


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict:
    return golden.build_all(tmp_path_factory.mktemp("golden"))


@pytest.mark.slow
@pytest.mark.parametrize("scenario", sorted(golden.SCENARIOS))
@pytest.mark.parametrize("part", ["tidy", "fits", "findings", "problems", "notes", "figures"])
def test_the_report_of_todays_run_directories_is_unchanged(built, scenario, part):
    want = json.loads(golden.GOLDEN.read_text())[scenario][part]
    got = built[scenario][part]
    if isinstance(want, list) and part in ("tidy", "fits", "figures"):
        missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
        assert not missing and not extra, (
            f"{scenario} {part}: {len(missing)} missing, e.g. {missing[:1]}; {len(extra)} new, e.g. {extra[:1]}"
        )
    assert got == want
