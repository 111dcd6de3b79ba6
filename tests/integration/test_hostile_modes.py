"""The `hostile` modes an attacker tries (convergerd.sim.hostile), on the wire: what each one
sends, read with a plain HTTP client that follows no redirect, so the test sees the bytes a
client would. How the daemon survives them is tests/e2e/test_hostile_grammar.py."""

from __future__ import annotations

import json
import re
from typing import Any

import aiohttp
import orjson
import pytest

from convergerd.admission.evaluate import Check
from convergerd.sim.faults import HOSTILE_MODES, Faults, FaultsError
from convergerd.sim.fleet import Fleet
from convergerd.sim.hostile import CONTINUE_PREFIX, NESTED_KEY
from convergerd.sim.tls import client_ssl_context
from tests.e2e.hostile_world import GRAMMAR
from tests.e2e.operator_world import GRAMMAR as OPERATOR_GRAMMAR

C1, C2 = "c0001", "c0002"
POLICIES = "/apis/platform.stackship.se/v1alpha1/policies"
MiB = 2**20


def policy(name: str, revision: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "platform.stackship.se/v1alpha1", "kind": "Policy",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "convergerd"}},
        "spec": {"policyId": name, "revision": revision, "rule": {"type": "ForbidLatestTag"}},
    }


async def call(fleet: Fleet, method: str, path: str, *, cluster: str = C1,
               body: Any = None, content_type: str = "application/json",
               ) -> tuple[int, Any, bytes]:
    """One request with the cluster's token; redirects are not followed."""
    headers = {"Authorization": f"Bearer {fleet.token(cluster)}", "Content-Type": content_type}
    data = None if body is None else json.dumps(body).encode()
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session,
        session.request(method, fleet.base_url(cluster) + path, data=data, headers=headers,
                        ssl=client_ssl_context(fleet.ca_pem(cluster)), allow_redirects=False,
                        max_field_size=2**20, max_line_size=2**20) as resp,
    ):
        return resp.status, resp.headers, await resp.read()


def hostile(fleet: Fleet, mode: str, **params: Any) -> None:
    fleet.set_faults(C1, Faults.from_mapping({"hostile": {"mode": mode, **params}}))


@pytest.fixture
async def seeded(fleet: Fleet) -> Fleet:
    for name in ("p1", "p2", "p3"):
        status, _, body = await call(fleet, "POST", POLICIES, body=policy(name))
        assert status == 201, body
    return fleet


async def test_amplification_fills_items_with_empty_objects_up_to_the_size(
        seeded: Fleet) -> None:
    hostile(seeded, "amplification", bytes=3 * MiB)
    status, _, body = await call(seeded, "GET", POLICIES + "?limit=2")
    doc = orjson.loads(body)
    assert status == 200
    assert 3 * MiB - 4 <= len(body) <= 3 * MiB
    assert doc["kind"] == "PolicyList"
    assert len(doc["items"]) > MiB - 100  # three bytes each: `{},`
    assert doc["items"][:2] == [{}, {}]
    # Not a list: served as it is.
    _, _, one = await call(seeded, "GET", POLICIES + "/p1")
    assert orjson.loads(one)["metadata"]["name"] == "p1"


async def test_amplification_of_bracket_strings_fills_items_with_lists_of_one(
        seeded: Fleet) -> None:
    hostile(seeded, "amplification", bytes=MiB, shape="bracketStrings")
    status, _, body = await call(seeded, "GET", POLICIES + "?limit=2")
    doc = orjson.loads(body)
    assert status == 200
    assert MiB - 6 <= len(body) <= MiB
    assert len(doc["items"]) > MiB // 6 - 100  # six bytes each: `["["],`
    assert doc["items"][:2] == [["["], ["["]]


async def test_deep_nesting_is_past_every_parser_limit(seeded: Fleet) -> None:
    hostile(seeded, "deepNesting", depth=5000)
    _, _, body = await call(seeded, "GET", "/version")
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(body)
    assert body.endswith(b"[" * 5000 + b"]" * 5000 + b"}")
    shallow = json.loads(body.replace(b"[" * 4990, b"").replace(b"]" * 4990, b""))
    assert shallow[NESTED_KEY] == [[[[[[[[[[]]]]]]]]]]


async def test_endless_continue_hands_out_a_fresh_token_for_every_page(seeded: Fleet) -> None:
    hostile(seeded, "endlessContinue")
    seen: list[str] = []
    token = ""
    for _ in range(5):
        query = f"?limit=2&continue={token}" if token else "?limit=2"
        status, _, body = await call(seeded, "GET", POLICIES + query)
        assert status == 200, body
        doc = orjson.loads(body)
        token = doc["metadata"]["continue"]
        assert token.startswith(CONTINUE_PREFIX)
        assert [i["metadata"]["name"] for i in doc["items"]] == ["p1", "p2"]
        seen.append(token)
    assert len(set(seen)) == 5


async def test_over_limit_sends_factor_times_the_limit(seeded: Fleet) -> None:
    hostile(seeded, "overLimit", factor=7)
    _, _, body = await call(seeded, "GET", POLICIES + "?limit=2")
    names = [i["metadata"]["name"] for i in orjson.loads(body)["items"]]
    assert len(names) == 14
    assert names[:2] == ["p1", "p2"]
    assert len(set(names)) == 14


@pytest.mark.parametrize("status", [302, 307])
async def test_redirect_to_another_clusters_path_behind_the_same_front(
        seeded: Fleet, status: int) -> None:
    hostile(seeded, "redirect", status=status, cluster=C2)
    got, headers, _ = await call(seeded, "GET", POLICIES + "?limit=2")
    assert (got, headers["Location"]) == (status, f"/clusters/{C2}{POLICIES}?limit=2")
    # Not served: nothing written.
    hostile(seeded, "redirect", location="http://127.0.0.1:9/x/")
    got, headers, _ = await call(seeded, "PATCH", POLICIES + "/p9", body=policy("p9"),
                                 content_type="application/apply-patch+yaml")
    assert (got, headers["Location"]) == (307, f"http://127.0.0.1:9/x/clusters/{C1}"
                                                f"{POLICIES}/p9")
    seeded.clear_faults(C1)
    assert (await call(seeded, "GET", POLICIES + "/p9"))[0] == 404


async def test_the_request_log_says_whose_token_reached_which_cluster(seeded: Fleet) -> None:
    seeded.accounting.reset()
    hostile(seeded, "redirect", cluster=C2)
    async with (
        aiohttp.ClientSession() as session,
        # What a client that follows redirects does: the same headers, to the new path.
        session.get(seeded.base_url(C1) + POLICIES,
                    headers={"Authorization": f"Bearer {seeded.token(C1)}"},
                    ssl=client_ssl_context(seeded.ca_pem(C1))) as resp,
    ):
        assert resp.status == 401  # c0002 refuses c0001's token, but it has seen it
    log = [(r.cluster, r.token_of) for r in seeded.accounting.requests()]
    assert log == [(C1, C1), (C2, C1)]


@pytest.mark.parametrize(("change", "expect"), [
    ("kind", ("Lease", "p9", 4)), ("name", ("Policy", "p9-other", 4)),
    ("revision", ("Policy", "p9", 5))])
async def test_wrong_object_answers_an_apply_with_another_object_and_stores_nothing(
        seeded: Fleet, change: str, expect: tuple[str, str, int]) -> None:
    hostile(seeded, "wrongObject", change=change)
    status, _, body = await call(seeded, "PATCH", POLICIES + "/p9?fieldManager=t&force=true",
                                 body=policy("p9", revision=4),
                                 content_type="application/apply-patch+yaml")
    doc = orjson.loads(body)
    assert status == 200
    assert (doc["kind"], doc["metadata"]["name"], doc["spec"]["revision"]) == expect
    assert doc["metadata"]["resourceVersion"]
    assert (await call(seeded, "GET", POLICIES + "/p9"))[0] == 404


async def test_wrong_list_shapes(seeded: Fleet) -> None:
    hostile(seeded, "wrongList")
    doc = orjson.loads((await call(seeded, "GET", POLICIES))[2])
    assert "items" not in doc
    assert doc["kind"] == "PolicyList"
    hostile(seeded, "wrongList", shape="otherKind")
    doc = orjson.loads((await call(seeded, "GET", POLICIES))[2])
    assert doc["kind"] == "LeaseList"
    assert {i["kind"] for i in doc["items"]} == {"Lease"}


@pytest.mark.parametrize("field", ["gitVersion", "extra"])
async def test_huge_version_under_the_cap(seeded: Fleet, field: str) -> None:
    hostile(seeded, "hugeVersion", bytes=2 * MiB, field=field)
    _, _, body = await call(seeded, "GET", "/version")
    doc = orjson.loads(body)
    assert 2 * MiB - 64 <= len(body) <= 2 * MiB
    assert doc["gitVersion"].startswith("v1.32.0")
    assert (len(doc["gitVersion"]) > MiB) == (field == "gitVersion")


async def test_huge_headers(seeded: Fleet) -> None:
    hostile(seeded, "hugeHeaders", bytes=256 * 1024, headerBytes=4096)
    status, headers, _ = await call(seeded, "GET", POLICIES)
    hostile_headers = [v for k, v in headers.items() if k.startswith("X-Hostile-")]
    assert status == 200
    assert len(hostile_headers) == 64
    assert sum(map(len, hostile_headers)) == 256 * 1024


async def test_huge_values_in_labels_annotations_and_conditions(seeded: Fleet) -> None:
    hostile(seeded, "hugeValues", bytes=100_000, fields=["metadata.labels",
                                                         "status.conditions"])
    doc = orjson.loads((await call(seeded, "GET", POLICIES))[2])
    for item in doc["items"]:
        assert len(item["metadata"]["labels"]["sim.stackship.se/hostile"]) == 100_000
        assert "sim.stackship.se/hostile" not in item["metadata"].get("annotations", {})
        assert len(item["status"]["conditions"][0]["message"]) == 100_000


async def test_huge_holder_identity_in_leases(fleet: Fleet) -> None:
    lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
             "metadata": {"name": "x", "namespace": "stackship-system"},
             "spec": {"holderIdentity": "me", "leaseDurationSeconds": 15}}
    path = "/apis/coordination.k8s.io/v1/namespaces/stackship-system/leases"
    assert (await call(fleet, "POST", path, body=lease, cluster="home"))[0] == 201
    fleet.set_faults("home", Faults.from_mapping({"hostile": {
        "mode": "hugeValues", "bytes": 5000, "fields": ["spec.holderIdentity"]}}))
    doc = orjson.loads((await call(fleet, "GET", path + "/x", cluster="home"))[2])
    assert doc["spec"]["holderIdentity"] == "x" * 5000


@pytest.mark.parametrize(("doc", "message"), [
    ({"mode": "redirect", "cluster": C2, "location": "http://x"},
     "hostile: cluster and location: give one"),
    ({"mode": "redirect", "location": "ftp://x"}, 'hostile.location: invalid value "ftp://x"'),
    ({"mode": "redirect", "status": 200}, "hostile.status: invalid value 200: must be one of "
                                          "301, 302, 303, 307, 308"),
    ({"mode": "wrongObject", "change": "color"}, 'hostile.change: invalid value "color"'),
    ({"mode": "wrongList", "shape": []}, "hostile.shape: invalid value []"),
    ({"mode": "overLimit", "factor": 1}, "hostile.factor: invalid value 1: must be an integer "
                                         "in [2, 10000]"),
    ({"mode": "hugeValues", "fields": ["spec"]}, 'hostile.fields: invalid value ["spec"]: '
                                                 "must be a non-empty list of metadata.labels"),
    ({"mode": "hostileMetrics", "shape": "noItems"}, 'hostile.shape: invalid value "noItems"'),
    ({"mode": "hostileMetrics", "value": "7"}, 'hostile.value: invalid value "7"'),
    ({"mode": "hostileWarnings", "count": 0}, "hostile.count: invalid value 0"),
    ({"mode": "deepNesting", "bytes": 3}, "hostile: unknown field(s) for mode deepNesting: "
                                          "bytes (known: mode, depth)"),
])
def test_bad_parameters_are_refused_naming_the_field(doc: dict[str, Any], message: str) -> None:
    with pytest.raises(FaultsError) as info:
        Faults.from_mapping({"hostile": doc})
    assert str(info.value).startswith(message), str(info.value)


@pytest.mark.parametrize("doc", [
    {"mode": "amplification", "bytes": 15 * MiB, "shape": "objects"},
    {"mode": "amplification", "bytes": 15 * MiB, "shape": "bracketStrings"},
    {"mode": "deepNesting", "depth": 100_000},
    {"mode": "endlessContinue"},
    {"mode": "overLimit", "factor": 10},
    {"mode": "redirect", "status": 307, "cluster": "home"},
    {"mode": "redirect", "status": 302, "location": "http://127.0.0.1:9"},
    {"mode": "wrongObject", "change": "revision"},
    {"mode": "wrongList", "shape": "noItems"},
    {"mode": "hugeVersion", "bytes": 15 * MiB, "field": "gitVersion"},
    {"mode": "hugeHeaders", "bytes": MiB, "headerBytes": 4096},
    {"mode": "hugeValues", "bytes": MiB, "fields": ["metadata.labels", "metadata.annotations",
                                                     "spec.holderIdentity",
                                                     "status.conditions"]},
    {"mode": "hostileMetrics", "shape": "huge", "bytes": 48 * MiB, "count": 100_000,
     "bytesPerSecond": 10, "value": "NaN"},
    {"mode": "hostileWarnings", "shape": "many", "bytes": 4096, "count": 50},
])
def test_each_mode_reads_back_as_written(doc: dict[str, Any]) -> None:
    assert Faults.from_mapping({"hostile": doc}).to_json()["hostile"] == doc
    # The others are defaults.
    if (doc.get("location") is None and doc.get("status") != 302
            and doc.get("shape") != "bracketStrings"):
        assert Faults.from_mapping({"hostile": {"mode": doc["mode"]}}).to_json()["hostile"] == doc


def test_the_grammar_of_the_hostile_cluster_test_has_every_mode() -> None:
    """A new mode belongs in tests/e2e/test_hostile_grammar.py's grammar too (or, for what
    only the operator reads, tests/e2e/test_operator_hostile_grammar.py's)."""
    assert set(GRAMMAR) - {"garbageLeases"} | set(OPERATOR_GRAMMAR) == set(HOSTILE_MODES)
    assert not set(GRAMMAR) & set(OPERATOR_GRAMMAR)
    for mode, params in (*GRAMMAR.items(), *OPERATOR_GRAMMAR.items()):
        for name, values in params.items():
            assert values, (mode, name)


# -- what only the operator reads: /metrics and the Warning headers of dry-run answers ------

CHECK = "apiserver_validating_admission_policy_check_total"
OUR_LINE = (f'{CHECK}{{enforcement_action="deny",error_type="no_error",policy="stackship-p1",'
            'policy_binding="stackship-p1"}')


def counted(fleet: Fleet, times: int = 3) -> None:
    for _ in range(times):
        fleet.cluster(C1).apiservers.record([Check("stackship-p1", "stackship-p1", "no_error",
                                                   "deny")])


async def metrics(fleet: Fleet, **params: Any) -> tuple[Any, bytes]:
    counted(fleet)
    hostile(fleet, "hostileMetrics", **params)
    status, headers, body = await call(fleet, "GET", "/metrics")
    assert status == 200
    return headers, body


@pytest.mark.parametrize(("shape", "at_least"), [("huge", 2 * MiB), ("longLine", 3 * MiB)])
async def test_huge_metrics_and_a_long_line_still_carry_ours(fleet: Fleet, shape: str,
                                                           at_least: int) -> None:
    _, body = await metrics(fleet, shape=shape, bytes=3 * MiB)
    assert len(body) >= at_least
    assert f"{OUR_LINE} 3\n".encode() in body
    assert b"\nprocess_start_time_seconds " in body


async def test_metrics_repeated_many_policies_and_escapes(fleet: Fleet) -> None:
    _, body = await metrics(fleet, shape="repeated", count=1000)
    assert body.count(f"{OUR_LINE} 3\n".encode()) == 1001
    _, body = await metrics(fleet, shape="manyPolicies", count=20_000)
    assert body.count(b'policy="stackship-fake-') == 20_000
    assert f"{OUR_LINE} 6\n".encode() in body
    _, body = await metrics(fleet, shape="labelEscapes")
    assert f"{OUR_LINE} 9\n".encode() in body
    assert b'policy="stackship-p1\\""} 1e+06' not in body  # the quote is inside the value
    assert b'policy="stackship-p1\\"",policy_binding' in body
    assert b'policy="stackship-p1\x1b[0m"' in body


@pytest.mark.parametrize("value", ["NaN", "-1", "1.5"])
async def test_metrics_bad_values(fleet: Fleet, value: str) -> None:
    _, body = await metrics(fleet, shape="badValues", value=value)
    assert f"{OUR_LINE} {value}\n".encode() in body


async def test_metrics_restarts_backwards_and_not_text(fleet: Fleet) -> None:
    _, first = await metrics(fleet, shape="restarts")
    _, second = await metrics(fleet, shape="restarts")
    start = re.compile(rb"^process_start_time_seconds (\S+)$", re.M)
    assert start.findall(first) != start.findall(second)
    value = re.compile(re.escape(OUR_LINE.encode()) + rb" (\d+)$", re.M)
    _, first = await metrics(fleet, shape="backwards")
    _, second = await metrics(fleet, shape="backwards")
    assert int(value.findall(first)[0]) > int(value.findall(second)[0]) > 2**50
    headers, body = await metrics(fleet, shape="notText")
    assert headers["Content-Type"].startswith("text/html")
    assert CHECK.encode() not in body


async def test_hostile_metrics_leaves_every_other_answer_alone(seeded: Fleet) -> None:
    hostile(seeded, "hostileMetrics", shape="badValues")
    status, _, body = await call(seeded, "GET", POLICIES)
    assert status == 200
    assert len(orjson.loads(body)["items"]) == 3


async def dry_run(fleet: Fleet, **params: Any) -> tuple[int, list[str]]:
    """A dry-run create answered with a hostile set of Warning headers: its status and the
    Warning header values as a tolerant client reads them."""
    hostile(fleet, "hostileWarnings", **params)
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "default"},
           "spec": {"containers": [{"name": "c", "image": "nginx"}]}}
    status, headers, _ = await call(fleet, "POST", "/api/v1/namespaces/default/pods?dryRun=All",
                                    body=pod)
    return status, headers.getall("Warning", [])


async def test_hostile_warnings_many_huge_and_malformed(fleet: Fleet) -> None:
    status, found = await dry_run(fleet, shape="many", count=20, bytes=100)
    assert status == 201
    assert len(found) == 20
    assert found[0] == f'299 - "0:{"w" * 100}"'
    _, found = await dry_run(fleet, shape="huge", count=2, bytes=20_000)
    assert [len(v) for v in found] == [len('299 - "0:"') + 20_000] * 2
    _, found = await dry_run(fleet, shape="malformed", count=10)
    assert "299 - unquoted text" in found
    assert '199 - "not code 299"' in found
    # Not a dry run: served as it is.
    status, _, _ = await call(fleet, "GET", "/api/v1/namespaces/default/pods")
    assert status == 200


@pytest.mark.parametrize(("shape", "raw"), [("controlChars", b"\xc2\x9b31m\xe2\x80\xae"),
                                            ("invalidUtf8", b"\xff\xfe")])
async def test_hostile_warnings_with_bytes_aiohttp_refuses(fleet: Fleet, shape: str,
                                                           raw: bytes) -> None:
    status, found = await dry_run(fleet, shape=shape)
    assert status == 201
    assert len(found) == 1
    assert raw in found[0].encode("utf-8", "surrogateescape")


async def test_hostile_warnings_an_http_parser_refuses(fleet: Fleet) -> None:
    with pytest.raises(aiohttp.ClientResponseError, match="Invalid HTTP header"):
        await dry_run(fleet, shape="rawControls")
