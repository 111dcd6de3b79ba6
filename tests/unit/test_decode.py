"""What a cluster sends, decoded at the edge (`convergerd.core.decode`, `ListedPolicy.from_object`):
strings clean and bounded, wrong types named, unusable answers `BadResponse` — never another
exception, whatever the bytes."""

from __future__ import annotations

import datetime as dt
import json
import re
import unicodedata
from collections.abc import Callable
from typing import Any, TypeVar

import pytest
from hypothesis import given
from hypothesis import strategies as st

from convergerd.core.decode import (
    MAX_LABEL_VALUE_CHARS,
    MAX_MESSAGE_CHARS,
    MAX_NAME_CHARS,
    MAX_REASON_CHARS,
    MAX_TOKEN_CHARS,
    MAX_VERSION_CHARS,
    as_int,
    clean_text,
    git_version,
    list_page,
    parse_object,
    status_body,
)
from convergerd.core.errors import BadResponse
from convergerd.core.plan import MALFORMED_REASON, UNKNOWN_PHASE, ListedPolicy
from convergerd.kube.client import http_error, retry_after, status_message

T = TypeVar("T")
NUL_MESSAGE = {"type": "Ready", "status": "True", "reason": "Installed", "message": "ok\u0000"}


def policy(**status: Any) -> dict[str, Any]:
    return {
        "apiVersion": "platform.stackship.se/v1alpha1", "kind": "Policy",
        "metadata": {"name": "policy-p1", "resourceVersion": "7", "generation": 2,
                     "labels": {"app.kubernetes.io/managed-by": "convergerd"}},
        "spec": {"policyId": "p1", "revision": 2},
        "status": status,
    }


def safe(text: str) -> bool:
    """No character PostgreSQL text, a log line or a label value cannot hold."""
    return all(unicodedata.category(c) not in ("Cc", "Cs") and c not in "\u202e\u2066"
               for c in text)


# --- the three crash reproductions, at the edge ------------------------------------------------


def test_nul_in_a_condition_message_is_replaced_not_stored() -> None:
    found = ListedPolicy.from_object(policy(phase="Enforcing", conditions=[NUL_MESSAGE]))
    assert found.phase == "Enforcing"
    assert found.ready_message == "ok\ufffd"


def test_status_phase_object_makes_that_object_unknown_with_the_field_named() -> None:
    found = ListedPolicy.from_object(policy(phase={"nested": "object"}))
    assert found.phase == UNKNOWN_PHASE
    assert found.ready_reason == MALFORMED_REASON
    assert found.ready_message == (
        'status.phase: expected a string, got an object {"nested":"object"}')
    assert found.name == "policy-p1"  # still attributed to its policy
    assert found.spec["revision"] == 2


def test_nul_in_a_403_body_is_replaced_in_the_error() -> None:
    body = json.dumps({"kind": "Status", "status": "Failure", "reason": "Forbidden\u0000",
                       "message": "policies is forbidden\u0000: User \"x\"\r\nFAKE LOG"}).encode()
    exc = http_error(403, "Forbidden", {}, body)
    assert str(exc) == '403 Forbidden: policies is forbidden\ufffd: User "x" FAKE LOG'
    assert exc.k8s_reason == "Forbidden\ufffd"
    assert exc.reason == "forbidden"


# --- field by field ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("obj", "field"),
    [
        ({"metadata": "x"}, "metadata: expected an object, got a string"),
        ({"metadata": {"labels": ["a=b"]}}, "metadata.labels: expected an object, got a list"),
        ({"metadata": {"labels": {"a": 1}}}, 'metadata.labels["a"]: expected a string'),
        ({"metadata": {"generation": "2"}}, 'metadata.generation: expected an integer, got a '
                                            'string "2"'),
        ({"metadata": {"generation": True}}, "metadata.generation: expected an integer"),
        ({"metadata": {"generation": 2**64}}, "metadata.generation: expected an integer, got a "
                                              "number <large integer>"),
        ({"metadata": {"name": 5}}, "metadata.name: expected a string, got a number 5"),
        ({"spec": [1]}, "spec: expected an object, got a list [1]"),
        ({"status": {"conditions": "Ready"}}, "status.conditions: expected a list"),
        ({"status": {"conditions": [7]}}, "status.conditions[0]: expected an object"),
        ({"status": {"conditions": [{"type": "Ready", "message": {"a": 1}}]}},
         "status.conditions[Ready].message: expected a string"),
        ({"status": {"observedGeneration": 1.5}}, "status.observedGeneration: expected an "
                                                  "integer"),
    ],
)
def test_a_wrong_type_is_unknown_naming_the_field(obj: dict[str, Any], field: str) -> None:
    found = ListedPolicy.from_object(obj)
    assert found.phase == UNKNOWN_PHASE
    assert found.ready_reason == MALFORMED_REASON
    assert found.ready_message is not None
    assert found.ready_message.startswith(field)


def test_several_problems_name_the_first_and_count_the_rest() -> None:
    found = ListedPolicy.from_object(policy(phase=[1], conditions="x"))
    assert found.ready_message == (
        'status.conditions: expected a list, got a string "x" (and 1 more)')


def test_a_well_formed_object_reads_as_before() -> None:
    found = ListedPolicy.from_object(policy(
        phase="Enforcing", observedGeneration=2,
        conditions=[{"type": "Ready", "status": "True", "reason": "Installed",
                     "message": "bound"}]))
    assert (found.name, found.generation, found.phase, found.observed_generation,
            found.ready_status, found.ready_reason, found.ready_message) == (
        "policy-p1", 2, "Enforcing", 2, "True", "Installed", "bound")
    assert found.labels == {"app.kubernetes.io/managed-by": "convergerd"}


def test_the_verified_condition_is_read_with_its_times() -> None:
    found = ListedPolicy.from_object(policy(phase="Enforcing", conditions=[
        {"type": "Ready", "status": "True", "reason": "Enforcing", "message": "ok"},
        {"type": "Verified", "status": "False", "reason": "Admitted",
         "message": "ADMITTED\u0000", "lastProbeTime": "2025-01-02T03:04:05Z",
         "lastTransitionTime": "2025-01-02T04:04:05+01:00"}]))
    v = found.verified
    assert v is not None
    assert (v.status, v.reason, v.message) == ("False", "Admitted", "ADMITTED\ufffd")
    assert v.probed_at == v.since == dt.datetime(2025, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    assert ListedPolicy.from_object(policy(phase="Enforcing")).verified is None


@pytest.mark.parametrize(("condition", "field"), [
    ({"status": "Yes"}, 'status.conditions[Verified].status: expected True, False or Unknown, '
                        'got a string "Yes"'),
    ({"status": "True", "reason": 7}, "status.conditions[Verified].reason: expected a string"),
    ({"status": "True", "lastProbeTime": "yesterday"},
     "status.conditions[Verified].lastProbeTime: expected an RFC 3339 time"),
    ({"status": "True", "lastProbeTime": "2025-01-02T03:04:05"},  # no zone
     "status.conditions[Verified].lastProbeTime: expected an RFC 3339 time"),
    ({"status": "True", "lastTransitionTime": 1735787045},
     "status.conditions[Verified].lastTransitionTime: expected an RFC 3339 time"),
])
def test_a_malformed_verified_condition_is_unknown_alone(
    condition: dict[str, Any], field: str
) -> None:
    """A bad Verified condition is Unknown/Malformed naming the field; the phase and Ready,
    read from the same object, stay as they are."""
    found = ListedPolicy.from_object(policy(phase="Enforcing", conditions=[
        {"type": "Ready", "status": "True", "reason": "Enforcing"},
        {"type": "Verified", **condition}]))
    assert (found.phase, found.ready_reason) == ("Enforcing", "Enforcing")
    assert found.verified is not None
    assert (found.verified.status, found.verified.reason) == ("Unknown", MALFORMED_REASON)
    assert (found.verified.message or "").startswith(field), found.verified.message


def test_long_strings_are_capped() -> None:
    found = ListedPolicy.from_object(policy(phase="P" * 10_000, conditions=[
        {"type": "Ready", "reason": "R" * 10_000, "message": "m " * 100_000}]))
    assert len(found.phase or "") == MAX_REASON_CHARS
    assert len(found.ready_reason or "") == MAX_REASON_CHARS
    assert len(found.ready_message or "") == MAX_MESSAGE_CHARS
    assert (found.ready_message or "").endswith("…")


def test_clean_text_keeps_what_is_safe() -> None:
    assert clean_text("Enforcing \u2013 ✓ 日本", 100) == "Enforcing \u2013 ✓ 日本"
    assert clean_text("a\tb\nc", 100) == "a b c"
    assert clean_text("\x1b[31mred\u202e\ud800", 100) == "\ufffd[31mred\ufffd\ufffd"
    assert clean_text("abcdef", 4) == "abc…"


def test_as_int_is_a_bigint_or_nothing() -> None:
    assert [as_int(v) for v in (3, 2**63 - 1, 2**63, -(2**63), True, 1.0, "3")] == [
        3, 2**63 - 1, None, -(2**63), None, None, None]


# --- whole answers ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"items": [', "list answer is not JSON"),
        (b"\xff\xfe", "list answer is not JSON"),
        (b"[" * 100_000 + b"]" * 100_000, "list answer is not JSON"),
        (b'{"a": NaN}', "list answer is not JSON"),
        (b'[1]', "list answer is not a JSON object: got a list [1]"),
    ],
)
def test_an_answer_that_is_not_a_json_object_is_bad_response(body: bytes, message: str) -> None:
    with pytest.raises(BadResponse, match=re.escape(message)) as info:
        parse_object(body, "list answer")
    assert info.value.reason == "bad_response"


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"items": {"a": 1}}, "list answer: items: expected a list, got an object"),
        ({"items": [{}, 42]}, "list answer: items[1]: expected an object, got a number 42"),
        ({"items": [], "metadata": []}, "list answer: metadata: expected an object"),
        ({"items": [], "metadata": {"continue": 5}}, "metadata.continue: expected a string"),
        ({"items": [], "metadata": {"continue": "x" * (MAX_TOKEN_CHARS + 1)}},
         "metadata.continue: longer than"),
    ],
)
def test_a_list_of_the_wrong_shape_is_bad_response(doc: dict[str, Any], message: str) -> None:
    with pytest.raises(BadResponse, match=re.escape(message)):
        list_page(doc)


def test_a_list_page_reads_items_token_and_version() -> None:
    page = list_page({"items": [{"a": 1}], "metadata": {"continue": "abc",
                                                        "resourceVersion": "9\u0000"}})
    assert (page.items, page.continue_token, page.resource_version) == ([{"a": 1}], "abc",
                                                                         "9\ufffd")
    assert list_page({"items": None}).items == []


def test_version_must_be_a_string() -> None:
    assert git_version({"gitVersion": "v1.32.0\u0000"}) == "v1.32.0\ufffd"
    with pytest.raises(BadResponse, match="gitVersion: expected a string, got a number 132"):
        git_version({"gitVersion": 132})


def test_status_bodies_never_raise() -> None:
    assert status_body(b"") == status_body(b"null")
    assert status_body(b"Too many requests, please try again later.\n").message == (
        "Too many requests, please try again later.")
    assert status_body(b'{"message": {"a": 1}, "reason": 5}').message is None
    assert status_body(b'{"details": {"retryAfterSeconds": 1e400}}').retry_after_s is None
    assert status_body(b'{"details": {"retryAfterSeconds": ' + b"9" * 400 + b"}}"
                       ).retry_after_s is None
    assert status_message(500, None, b"\x00" * 10) == ("500: " + "\ufffd" * 10, None)


@pytest.mark.parametrize(
    ("header", "body", "expected"),
    [
        ("7", b"", 7.0),
        ("inf", b"", None),
        ("nan", b"", None),
        ("-1", b'{"details": {"retryAfterSeconds": 3}}', 3.0),
        (None, b'{"details": {"retryAfterSeconds": true}}', None),
        ("Wed, 21 Oct 2015 07:28:00 GMT", b"", None),
    ],
)
def test_retry_after_is_finite_and_non_negative(
    header: str | None, body: bytes, expected: float | None
) -> None:
    assert retry_after(header, body) == expected


# --- properties: whatever the bytes --------------------------------------------------------

_TEXT = st.text(max_size=40) | st.sampled_from(
    ["ok\u0000", "\x1b[2J", "a\r\nb", "\ud800", "\u202e", "Ready", "policy-p1", "x" * 700])
_SCALARS = (st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
            | st.floats(allow_nan=False, allow_infinity=False) | _TEXT)
def _containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    # Named, not a lambda: Hypothesis judges a multi-line lambda by its source text.
    return st.lists(children, max_size=4) | st.dictionaries(_TEXT | st.sampled_from(
        ["metadata", "status", "spec", "labels", "conditions", "phase", "message", "reason",
         "type", "name", "generation", "items", "continue", "resourceVersion", "gitVersion",
         "details", "retryAfterSeconds"]), children, max_size=5)


JSON = st.recursive(_SCALARS, _containers, max_leaves=25)
# Objects shaped like a Policy, with any value anywhere.
POLICY_LIKE = st.fixed_dictionaries(
    {},
    optional={
        "metadata": st.fixed_dictionaries({}, optional={
            "name": JSON, "labels": JSON | st.dictionaries(_TEXT, _TEXT, max_size=3),
            "generation": JSON, "resourceVersion": JSON}) | JSON,
        "spec": JSON,
        "status": st.fixed_dictionaries({}, optional={
            "phase": JSON, "observedGeneration": JSON,
            "conditions": st.lists(st.fixed_dictionaries(
                {"type": st.just("Ready")}, optional={"status": JSON, "reason": JSON,
                                                      "message": JSON}) | JSON, max_size=3)
            | JSON}) | JSON,
    },
)


def outcome(decode: Callable[[], T]) -> T | BadResponse:
    """What decoding returned, or the `BadResponse` it raised (any other exception fails)."""
    try:
        return decode()
    except BadResponse as exc:
        return exc


def _strings(found: ListedPolicy) -> list[tuple[str | None, int]]:
    return [(found.name, MAX_NAME_CHARS), (found.resource_version, MAX_TOKEN_CHARS),
            (found.phase, MAX_REASON_CHARS), (found.ready_status, MAX_REASON_CHARS),
            (found.ready_reason, MAX_REASON_CHARS), (found.ready_message, MAX_MESSAGE_CHARS),
            *((k, MAX_NAME_CHARS) for k in found.labels),
            *((v, MAX_LABEL_VALUE_CHARS) for v in found.labels.values())]


@given(POLICY_LIKE)
def test_any_listed_object_decodes_to_clean_bounded_typed_fields(obj: dict[str, Any]) -> None:
    found = ListedPolicy.from_object(obj)
    for text, limit in _strings(found):
        assert text is None or (isinstance(text, str) and safe(text) and len(text) <= limit)
    for number in (found.generation, found.observed_generation):
        assert number is None or as_int(number) == number
    assert isinstance(found.spec, dict)
    if found.ready_reason == MALFORMED_REASON:
        assert found.phase == UNKNOWN_PHASE


@given(JSON)
def test_any_list_answer_is_a_page_or_bad_response(doc: Any) -> None:
    page = outcome(lambda: list_page(parse_object(json.dumps(doc).encode(), "list answer")))
    if isinstance(page, BadResponse):
        assert safe(str(page))
        assert len(str(page)) <= 300
        return
    assert all(isinstance(item, dict) for item in page.items)
    assert safe(page.resource_version)
    assert len(page.resource_version) <= MAX_TOKEN_CHARS


@given(JSON | st.binary(max_size=200))
def test_any_error_body_gives_a_clean_bounded_message(doc: Any) -> None:
    body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    exc = http_error(403, "Forbidden", {"Retry-After": "x"}, body)
    assert safe(str(exc))
    assert len(str(exc)) <= len("403 Forbidden: ") + MAX_MESSAGE_CHARS
    assert exc.k8s_reason is None or (safe(exc.k8s_reason)
                                      and len(exc.k8s_reason) <= MAX_REASON_CHARS)
    assert exc.retry_after_s is None or exc.retry_after_s >= 0


@given(JSON)
def test_any_version_answer_is_a_clean_version_or_bad_response(doc: Any) -> None:
    version = outcome(lambda: git_version(parse_object(json.dumps(doc).encode(), "/version")))
    if isinstance(version, BadResponse):
        assert safe(str(version))
        assert len(str(version)) <= 300
        return
    assert safe(version)
    assert len(version) <= MAX_VERSION_CHARS
