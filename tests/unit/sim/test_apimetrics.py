"""The simulated API servers' exposition (Go's float format) and the warning recorder's
limits (k8s.io/apiserver/pkg/endpoints/filters/warning.go)."""

from __future__ import annotations

import pytest

from convergerd.sim.apimetrics import go_float
from convergerd.sim.notes import RequestNotes, warning_header


@pytest.mark.parametrize(("value", "text"), [
    (0, "0"), (1, "1"), (12, "12"), (999999, "999999"), (1e6, "1e+06"),
    (1234567, "1.234567e+06"), (1712345678.99, "1.71234567899e+09"), (0.5, "0.5"),
    (0.0001, "0.0001"), (0.00001, "1e-05"), (-3, "-3"),
])
def test_values_are_written_as_client_golang_writes_them(value: float, text: str) -> None:
    assert go_float(value) == text


def test_warnings_are_deduplicated_quoted_and_truncated_past_the_total() -> None:
    assert warning_header('say "hi" \\o/') == '299 - "say \\"hi\\" \\\\o/"'
    assert warning_header("line\nbreak") is None
    notes = RequestNotes()
    notes.warn("a")
    notes.warn("a")
    assert notes.headers == ['299 - "a"']
    notes.warn("b" * 4096)  # over 4,096 runes in all: every warning cut to 256 from now on
    assert notes.headers == ['299 - "a"', f'299 - "{"b" * 256}"']
    notes.warn("c" * 300)
    assert notes.headers[-1] == f'299 - "{"c" * 256}"'
