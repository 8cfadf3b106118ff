"""How benchmarks/apiserver_profile.py reads `go tool pprof -top`'s summary line."""

from __future__ import annotations

import pytest

from benchmarks.apiserver_profile import _ACCOUNTING, _seconds


@pytest.mark.parametrize("text,seconds", [
    ("23.88s", 23.88), ("230ms", 0.23), ("0", 0.0), ("1.50mins", 90.0), ("12us", 12e-6), ("x", 0.0),
])
def test_durations_as_pprof_prints_them(text: str, seconds: float) -> None:
    assert _seconds(text) == pytest.approx(seconds)


def test_the_summary_line_gives_percent_and_total() -> None:
    # As go tool pprof 1.26 prints it with -focus.
    m = _ACCOUNTING.search("Active filters:\n   focus=crdHandler\n"
                           "Showing nodes accounting for 5.30s, 22.19% of 23.88s total\n")
    assert m is not None
    assert (m.group(1), float(m.group(2)), _seconds(m.group(3))) == ("5.30s", 22.19, 23.88)
    empty = _ACCOUNTING.search("Showing nodes accounting for 0, 0% of 23.88s total")
    assert empty is not None and float(empty.group(2)) == 0.0
