"""The simulator's pure front-door pieces: fault documents, fleet config, routing, managers."""

from __future__ import annotations

from typing import Any

import pytest

from convergerd.sim.faults import Faults, FaultsError
from convergerd.sim.fleet import FleetConfig, FleetConfigError, member_ids
from convergerd.sim.handlers import manager_from_user_agent
from convergerd.sim.resources import LEASES, NAMESPACES, PODS, POLICIES
from convergerd.sim.routing import Endpoint, NonResourceRoute, ResourceRoute, Router


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        ({}, Faults()),
        ({"down": True}, Faults(down=True)),
        ({"latencyMs": 250, "errorRate": 0.5}, Faults(latency_ms=250, error_rate=0.5)),
        (
            {"errorStatus": 429, "retryAfterSeconds": 3},
            Faults(error_status=429, retry_after_seconds=3),
        ),
        ({"version": "v1.29.4", "crd": False}, Faults(version="v1.29.4", crd=False)),
        ({"version": "v1.30.1+k3s1"}, Faults(version="v1.30.1+k3s1")),
    ],
)
def test_faults_from_mapping(doc: dict[str, Any], expected: Faults) -> None:
    assert Faults.from_mapping(doc) == expected


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ({"dwn": True}, "dwn"),
        ({"down": 1}, "down"),
        ({"latencyMs": -1}, "latencyMs"),
        ({"latencyMs": True}, "latencyMs"),
        ({"errorRate": 1.5}, "errorRate"),
        ({"errorStatus": 418}, "errorStatus"),
        ({"version": "1.29.4"}, "version"),
        ({"version": "v2.0.0"}, "version"),
        ({"retryAfterSeconds": "3"}, "retryAfterSeconds"),
    ],
)
def test_bad_faults_name_the_field(doc: dict[str, Any], field: str) -> None:
    with pytest.raises(FaultsError, match=field):
        Faults.from_mapping(doc)


def test_faults_merge_and_version_gate() -> None:
    faults = Faults(latency_ms=5).merged({"version": "v1.29.0"})
    assert (faults.latency_ms, faults.minor, faults.serves_vap) == (5, 29, False)
    assert Faults().serves_vap
    assert Faults.from_json_bytes(b'{"hang": true}').hang
    with pytest.raises(FaultsError, match="invalid JSON"):
        Faults.from_json_bytes(b"{")


def test_fleet_config_from_yaml() -> None:
    cfg = FleetConfig.from_yaml(
        "clusters: 5\ncaGroups: 3\ndefaults: {latencyMs: 2}\n"
        "overrides:\n  c0003: {version: v1.29.4}\n  home: {readOnly: true}\n"
    )
    assert (cfg.clusters, cfg.ca_groups) == (5, 3)
    assert cfg.defaults == Faults(latency_ms=2)
    assert cfg.overrides["c0003"] == Faults(latency_ms=2, version="v1.29.4")
    # Flags win over the file.
    assert FleetConfig.from_yaml("clusters: 5", clusters=7).clusters == 7


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("clustrs: 3", "clustrs"),
        ("clusters: three", "clusters"),
        ("overrides: {c0009: {down: true}}", "c0009"),
        ("defaults: {latency: 3}", "latency"),
        ("- 1", "mapping"),
    ],
)
def test_bad_fleet_config_names_the_setting(text: str, message: str) -> None:
    with pytest.raises(FleetConfigError, match=message):
        FleetConfig.from_yaml(text)


def test_member_ids_have_at_least_four_digits() -> None:
    assert member_ids(3) == ["c0001", "c0002", "c0003"]
    assert member_ids(12000)[-1] == "c12000"


@pytest.mark.parametrize(
    ("path", "route"),
    [
        ("/version", NonResourceRoute(Endpoint.VERSION)),
        ("/apis", NonResourceRoute(Endpoint.APIS)),
        ("/api/v1", NonResourceRoute(Endpoint.GROUP_VERSION, "", "v1")),
        ("/apis/coordination.k8s.io", NonResourceRoute(Endpoint.API_GROUP, "coordination.k8s.io")),
        (
            "/openapi/v3/apis/platform.stackship.se/v1alpha1",
            NonResourceRoute(Endpoint.OPENAPI_V3_GV, "platform.stackship.se", "v1alpha1"),
        ),
        ("/api/v1/namespaces", ResourceRoute(NAMESPACES, None, None, None)),
        ("/api/v1/namespaces/x/status", ResourceRoute(NAMESPACES, None, "x", "status")),
        ("/api/v1/namespaces/x/pods", ResourceRoute(PODS, "x", None, None)),
        ("/api/v1/pods", ResourceRoute(PODS, None, None, None)),
        (
            "/apis/coordination.k8s.io/v1/namespaces/s/leases/l",
            ResourceRoute(LEASES, "s", "l", None),
        ),
        (
            "/apis/platform.stackship.se/v1alpha1/policies/p/status",
            ResourceRoute(POLICIES, None, "p", "status"),
        ),
        # Not addressable: scoped wrongly, unknown subresource, unknown type.
        ("/apis/platform.stackship.se/v1alpha1/namespaces/x/policies", None),
        ("/apis/coordination.k8s.io/v1/leases/l", None),
        ("/apis/coordination.k8s.io/v1/namespaces/s/leases/l/scale", None),
        ("/apis/example.com/v1/widgets", None),
        ("/api/v2/pods", None),
    ],
)
def test_routing(path: str, route: object) -> None:
    assert Router().parse(path) == route


@pytest.mark.parametrize(
    ("agent", "manager"),
    [
        ("convergerd/0.1.0 (replica-a)", "convergerd"),
        ("OpenAPI-Generator/32.0.0/python", "OpenAPI-Generator"),
        ("kubectl", "kubectl"),
        ("", ""),
        ("x" * 200, "x" * 128),
    ],
)
def test_default_field_manager_is_the_user_agent_prefix(agent: str, manager: str) -> None:
    assert manager_from_user_agent(agent) == manager
