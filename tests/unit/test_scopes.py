"""Who may call what (`api.scopes.decide`), and what a read token is (`core.tokens`): tables."""

from __future__ import annotations

import datetime as dt
import hashlib

import pytest

from convergerd.api.scopes import (
    ADMIN,
    ANONYMOUS,
    INVALID,
    Kind,
    Principal,
    Scope,
    Verdict,
    decide,
    refusal,
    unknown_boundary,
)
from convergerd.core.model import RuleError
from convergerd.core.tokens import (
    TOKEN_PREFIX,
    TokenRecord,
    check_by,
    check_token_name,
    new_token,
    parse_time,
    token_digest,
)

READER_A = Principal(Kind.READER, boundary="team-a", name="a")
S, U, F, H, N = (Verdict.SERVE, Verdict.UNAUTHENTICATED, Verdict.FORBIDDEN, Verdict.HIDDEN,
                 Verdict.NO_ADMIN_TOKEN)


@pytest.mark.parametrize(("scope", "who", "boundary", "fleet_open", "admin", "verdict"), [
    (Scope.PUBLIC, INVALID, None, False, False, S),
    (Scope.PUBLIC, READER_A, None, False, True, S),
    (Scope.FLEET, ANONYMOUS, None, True, True, S),
    (Scope.FLEET, ANONYMOUS, None, False, True, U),
    (Scope.FLEET, ADMIN, None, False, True, S),
    (Scope.FLEET, READER_A, None, True, True, F),
    (Scope.FLEET, INVALID, None, True, True, U),
    (Scope.ADMIN, ADMIN, None, True, True, S),
    (Scope.ADMIN, ANONYMOUS, None, True, True, U),
    (Scope.ADMIN, READER_A, None, True, True, F),
    (Scope.ADMIN, INVALID, None, True, True, U),
    (Scope.ADMIN, ANONYMOUS, None, True, False, N),
    (Scope.ADMIN, READER_A, None, True, False, N),
    (Scope.BOUNDARY, ADMIN, "team-b", True, True, S),
    (Scope.BOUNDARY, READER_A, "team-a", True, True, S),
    (Scope.BOUNDARY, READER_A, "team-b", True, True, H),
    (Scope.BOUNDARY, ANONYMOUS, "team-a", True, True, U),
    (Scope.BOUNDARY, INVALID, "team-a", True, True, U),
    # Without an admin token configured the boundary views still serve their readers.
    (Scope.BOUNDARY, READER_A, "team-a", True, False, S),
])
def test_decide(  # noqa: PLR0917 - parametrized
    scope: Scope, who: Principal, boundary: str | None, fleet_open: bool, admin: bool,
    verdict: Verdict,
) -> None:
    assert decide(scope, who, boundary=boundary, admin_configured=admin,
                  fleet_open=fleet_open) is verdict


def test_refusals_say_what_is_needed() -> None:
    assert refusal(U, Scope.ADMIN) == (401, "a valid bearer token is required")
    assert refusal(F, Scope.FLEET)[0] == 403
    assert refusal(N, Scope.ADMIN)[0] == 503
    assert refusal(U, Scope.BOUNDARY)[0] == 401


def test_an_unknown_boundary_answer_does_not_echo_control_characters() -> None:
    status, body = unknown_boundary("a\x1b[2Jb")
    assert status == 404
    assert "\x1b" not in body["error"] + body["boundary"]


def test_a_token_is_prefixed_random_and_kept_as_its_sha256() -> None:
    one, two = new_token(), new_token()
    assert one != two
    assert one.startswith(TOKEN_PREFIX)
    assert len(one) == len(TOKEN_PREFIX) + 43
    assert token_digest(one) == hashlib.sha256(one.encode()).digest()
    for not_ours in ("", "Bearer x", "cvg_b_" + "x" * 200, "cvg_b_é", ADMIN.label):
        assert token_digest(not_ours) is None


NOW = dt.datetime(2026, 5, 2, 10, 0, tzinfo=dt.UTC)


@pytest.mark.parametrize(("text", "expected"), [
    ("2027-01-31", dt.datetime(2027, 1, 31, tzinfo=dt.UTC)),
    ("2027-01-31T12:00:00Z", dt.datetime(2027, 1, 31, 12, tzinfo=dt.UTC)),
    ("2027-01-31T12:00:00+02:00", dt.datetime(2027, 1, 31, 10, tzinfo=dt.UTC)),
])
def test_an_expiry_is_a_date_or_a_time_with_its_offset(text: str,
                                                       expected: dt.datetime) -> None:
    assert parse_time(text, now=NOW) == expected


@pytest.mark.parametrize(("text", "why"), [
    ("2026-05-02", "not in the future"),
    ("2027-01-31T12:00:00", "no offset"),
    ("tomorrow", "not an ISO 8601"),
    ("2027-02-30", "not an ISO 8601"),
    (20270131, "not an ISO 8601"),
    ("9" * 100, "not an ISO 8601"),
])
def test_a_bad_expiry_says_why(text: object, why: str) -> None:
    with pytest.raises(RuleError, match=why):
        parse_time(text, now=NOW)


@pytest.mark.parametrize("name", ["", "UPPER", "a_b", "-a", "a" * 64, None, 3])
def test_a_token_name_is_a_dns_label(name: object) -> None:
    with pytest.raises(RuleError, match="name"):
        check_token_name(name)


@pytest.mark.parametrize("by", ["", "\n", "\x1b[2J", "x" * 201, None])
def test_who_asked_is_printable_and_short(by: object) -> None:
    with pytest.raises(RuleError, match="by"):
        check_by(by)


def test_a_token_is_live_until_revoked_or_expired() -> None:
    record = TokenRecord("a", "team-a", "alice", NOW, NOW + dt.timedelta(days=1))
    assert record.live(NOW)
    assert not record.live(NOW + dt.timedelta(days=1))
    revoked = TokenRecord("a", "team-a", "alice", NOW, None, "bob", NOW)
    assert not revoked.live(NOW)
