"""`sim --clusters 1000` as a subprocess: it starts, every context is in the kubeconfig, and
clusters far apart in the fleet answer. The startup time is printed, not asserted."""

from __future__ import annotations

import base64
import json
import signal
import ssl
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.fixtures.fleet import running_sim_process, start_sim_process


def _get(base_url: str, path: str, token: str, ca_pem: bytes) -> tuple[int, dict]:  # type: ignore[type-arg]
    ctx = ssl.create_default_context(cadata=ca_pem.decode())
    req = urllib.request.Request(base_url + path, headers={"Authorization": f"Bearer {token}"})  # noqa: S310 - https URL from the kubeconfig
    with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:  # noqa: S310
        return resp.status, json.loads(resp.read())


def test_thousand_clusters_start_and_answer(tmp_path: Path) -> None:
    with running_sim_process(tmp_path, clusters=1000, extra_args=["--ca-groups", "3"]) as sim:
        print(f"\nsim --clusters 1000 ready in {sim.startup_s:.2f}s")  # noqa: T201
        kubeconfig = yaml.safe_load(sim.kubeconfig_path.read_text())
        assert oct(sim.kubeconfig_path.stat().st_mode & 0o777) == "0o600"
        contexts = {c["name"] for c in kubeconfig["contexts"]}
        assert len(contexts) == 1001
        assert {"home", "c0001", "c0500", "c1000"} <= contexts
        assert kubeconfig["current-context"] == "home"
        clusters = {c["name"]: c["cluster"] for c in kubeconfig["clusters"]}
        users = {u["name"]: u["user"] for u in kubeconfig["users"]}
        cas = {base64.b64decode(c["certificate-authority-data"]) for c in clusters.values()}
        assert len(cas) == 4  # home + 3 member CA groups
        for cid in ("home", "c0001", "c0777", "c1000"):
            code, body = _get(
                clusters[cid]["server"],
                "/apis/platform.stackship.se/v1alpha1/policies",
                users[cid]["token"],
                base64.b64decode(clusters[cid]["certificate-authority-data"]),
            )
            assert (code, body["kind"]) == (200, "PolicyList")
        code, listing = sim.admin("GET", "/_sim/clusters")
        assert code == 200
        assert len(listing["clusters"]) == 1001
        # Only the four clusters asked hold a store.
        assert sum(1 for c in listing["clusters"] if c["objects"]) == 4


def test_config_file_starts_a_mixed_fleet_and_sigint_exits_cleanly(tmp_path: Path) -> None:
    config = tmp_path / "fleet.yaml"
    config.write_text(
        "clusters: 4\n"
        "defaults: {latencyMs: 1}\n"
        "overrides:\n"
        "  c0002: {version: v1.29.4}\n"
        "  c0003: {crd: false}\n"
    )
    sim = start_sim_process(tmp_path, clusters=4, extra_args=["--config", str(config)])
    try:
        code, listing = sim.admin("GET", "/_sim/clusters")
        assert code == 200
        faults = {c["id"]: c["faults"] for c in listing["clusters"]}
        assert faults["c0001"]["latencyMs"] == 1
        assert faults["c0002"]["version"] == "v1.29.4"
        assert faults["c0003"]["crd"] is False
        assert faults["home"]["latencyMs"] == 0
    finally:
        sim.proc.send_signal(signal.SIGINT)
        assert sim.proc.wait(10) == 0


def test_bad_config_is_a_startup_error_naming_the_setting(tmp_path: Path) -> None:
    config = tmp_path / "fleet.yaml"
    config.write_text("defaults: {latencyMS: 1}\n")
    with pytest.raises(RuntimeError, match="latencyMS"):
        start_sim_process(tmp_path, extra_args=["--config", str(config)])
