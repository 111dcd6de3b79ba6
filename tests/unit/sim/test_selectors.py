"""labelSelector / fieldSelector parsing and matching (labels/selector.go, fields/selector.go)."""

from __future__ import annotations

from typing import Any

import pytest

from convergerd.sim.resources import LEASES, NAMESPACES, PODS, POLICIES
from convergerd.sim.selectors import parse_field_selector, parse_label_selector
from convergerd.sim.status import ApiError

LABELS = {"app": "web", "tier": "front", "n": "5"}


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("", True),
        ("app=web", True),
        ("app==web", True),
        ("app=db", False),
        ("app!=db", True),
        ("missing!=x", True),  # != matches objects without the key
        ("app in (web,db)", True),
        ("app in (db)", False),
        ("app notin (db)", True),
        ("missing notin (db)", True),  # notin matches objects without the key
        ("app", True),
        ("missing", False),
        ("!missing", True),
        ("!app", False),
        ("n>4", True),
        ("n>5", False),
        ("n<6", True),
        ("app>1", False),  # not an integer label: no match
        ("app=web,tier=front", True),  # comma is AND
        ("app=web,tier=back", False),
        ("  app = web , tier in ( front ) ", True),
        ("x in (a,,b)", False),
    ],
)
def test_label_selector_matching(selector: str, expected: bool) -> None:
    assert parse_label_selector(selector).matches(LABELS) is expected


@pytest.mark.parametrize(
    ("selector", "message"),
    [
        ("a b", "unable to parse requirement: found 'b', expected: in, notin, =, ==, !=, gt, lt"),
        ("a=b,", "found '', expected: identifier after ','"),
        ("a in b", "unable to parse requirement: found 'b' expected: '('"),
        ("a in (b", "unable to parse requirement: found '', expected: ',' or ')'"),
        ("=a", "found '=', expected: !, identifier, or 'end of string'"),
        (
            "a>b",
            'unable to parse requirement: values[0]: Invalid value: "b": '
            "for 'Gt', 'Lt' operators, the value must be an integer",
        ),
    ],
)
def test_label_selector_syntax_errors_are_400_with_library_text(
    selector: str, message: str
) -> None:
    with pytest.raises(ApiError) as info:
        parse_label_selector(selector)
    assert info.value.code == 400
    assert info.value.status == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": "BadRequest",
        "code": 400,
    }


def test_label_selector_rejects_invalid_key() -> None:
    with pytest.raises(ApiError) as info:
        parse_label_selector("bad key!x=1")
    assert info.value.code == 400
    assert info.value.message.startswith("unable to parse requirement:")


POD: dict[str, Any] = {
    "metadata": {"name": "p", "namespace": "ns1"},
    "spec": {"nodeName": "node-1"},
    "status": {"phase": "Running"},
}


@pytest.mark.parametrize(
    ("selector", "rt", "obj", "expected"),
    [
        ("metadata.name=p", PODS, POD, True),
        ("metadata.name==p", PODS, POD, True),
        ("metadata.name!=p", PODS, POD, False),
        ("metadata.namespace=ns1", PODS, POD, True),
        ("spec.nodeName=node-1,status.phase=Running", PODS, POD, True),
        ("spec.nodeName=node-2", PODS, POD, False),
        (
            "status.phase=Active",
            NAMESPACES,
            {"metadata": {"name": "a"}, "status": {"phase": "Active"}},
            True,
        ),
        ("name=a", NAMESPACES, {"metadata": {"name": "a"}}, True),
        ("metadata.name=lock", LEASES, {"metadata": {"name": "lock"}}, True),
        ("", POLICIES, {"metadata": {"name": "x"}}, True),
        (r"metadata.name=a\,b", POLICIES, {"metadata": {"name": "a,b"}}, True),
    ],
)
def test_field_selector_matching(
    selector: str, rt: Any, obj: dict[str, Any], expected: bool
) -> None:
    assert parse_field_selector(selector, rt).matches(obj) is expected


@pytest.mark.parametrize(
    ("selector", "rt", "message"),
    [
        ("spec.enabled=true", POLICIES, "field label not supported: spec.enabled"),
        ("spec.nodeName=n", LEASES, "field label not supported: spec.nodeName"),
        ("status.phase=Running", POLICIES, "field label not supported: status.phase"),
        (
            "metadata.name",
            PODS,
            "invalid selector: 'metadata.name'; can't understand 'metadata.name'",
        ),
    ],
)
def test_field_selector_errors(selector: str, rt: Any, message: str) -> None:
    with pytest.raises(ApiError) as info:
        parse_field_selector(selector, rt)
    assert (info.value.code, info.value.reason, info.value.message) == (400, "BadRequest", message)
