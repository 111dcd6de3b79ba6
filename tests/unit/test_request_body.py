"""`mutations.parse_body`, the request body decoder: whatever the bytes (arbitrary, nested
deep, huge numbers, cut short), the body's fields or a `BadRequest` 400 naming the body, never
anything else (which the server would answer 500)."""

from __future__ import annotations

import pytest
from hypothesis import given

from convergerd.api.mutations import BadRequest, parse_body
from tests.strategies import HOSTILE_BODIES

FIELDS = {"allow_mass_removal": bool}


def outcome(raw: bytes) -> dict[str, object] | BadRequest:
    try:
        return parse_body(raw, FIELDS)
    except BadRequest as exc:
        return exc


@given(HOSTILE_BODIES)
def test_a_body_is_its_fields_or_a_400_naming_the_body(raw: bytes) -> None:
    got = outcome(raw)
    if isinstance(got, BadRequest):
        assert got.status == 400
        assert str(got).startswith("body")
        assert len(str(got)) < 400
    else:
        assert set(got) <= set(FIELDS)
        assert all(type(v) is bool for v in got.values())


@pytest.mark.parametrize(("raw", "names"), [
    (b"[" * 1000 + b"]" * 1000, "nested deeper than 100 levels"),
    (b'{"allow_mass_removal": 1' + b"0" * 5000 + b"}", "digits"),
    (b'{"allow_mass_removal": 1e999}', "out of range"),
    (b'{"allow_mass_removal": "yes"}', "expected bool"),
    (b'{"force": true}', "unknown field"),
    (b"[1]", "expected a JSON object"),
    (b'{"allow_mass_removal": tr', "not JSON"),
])
def test_the_problem_is_named(raw: bytes, names: str) -> None:
    with pytest.raises(BadRequest, match=names):
        parse_body(raw, FIELDS)


def test_good_bodies() -> None:
    assert parse_body(b"  \n", FIELDS) == {}
    assert parse_body(b'{"allow_mass_removal": true}', FIELDS) == {"allow_mass_removal": True}
