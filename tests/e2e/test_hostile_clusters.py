"""One cluster's bytes never stop delivery to the others (real `convergerd run`, the simulator,
the real PostgreSQL).

The three inputs that once made every round's database write fail (and the daemon exit, and
crash again at every start): a NUL in a condition message of one Policy's status (valid under
the CRD schema, written through the status subresource), a `status.phase` that is a JSON object,
and a 403 whose Status body holds NUL and other control characters.
"""

from __future__ import annotations

import datetime as dt
import unicodedata
from typing import Any

import pytest

from tests.e2e.harness import (
    MEMBERS,
    POLICIES,
    POLICY_GROUP,
    POLICY_PLURAL,
    POLICY_VERSION,
    STARTUP_S,
    Daemon,
    World,
    http_json,
    kubernetes,
    wait_for,
)

pytestmark = pytest.mark.e2e
C1, C2, C3 = MEMBERS
ROUNDS_S = 30.0  # a few 1.2 s rounds on a busy machine


def safe(text: str) -> bool:
    return all(unicodedata.category(c) not in ("Cc", "Cs") for c in text)


def clusters(daemon: Daemon) -> dict[str, dict[str, Any]]:
    doc = daemon.status() or {"clusters": []}
    return {c["id"]: c for c in doc["clusters"]}


def converged_since(daemon: Daemon, cluster: str, since: str) -> bool:
    c = clusters(daemon).get(cluster)
    return bool(c and c["last_error"] is None and c["in_sync"] == c["desired"] == len(POLICIES)
                and (c["last_success_at"] or "") > since)


def phases(daemon: Daemon, cluster: str) -> dict[str, dict[str, Any]]:
    doc = http_json(f"{daemon.url}/v1/clusters/{cluster}")
    return {p["id"]: p for p in doc["policies"]}


def write_nul_condition(world: World, cluster: str, policy: str) -> None:
    """A Ready condition with message "ok\\u0000", through the status subresource."""
    api = kubernetes.config.new_client_from_config(config_file=str(world.sim.kubeconfig_path),
                                                   context=cluster)
    try:
        custom = kubernetes.client.CustomObjectsApi(api)
        name = f"policy-{policy}"
        obj = custom.get_cluster_custom_object(POLICY_GROUP, POLICY_VERSION, POLICY_PLURAL, name)
        obj["status"] = {"phase": "Enforcing", "conditions": [
            {"type": "Ready", "status": "True", "reason": "Installed", "message": "ok\u0000",
             "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
        custom.replace_cluster_custom_object_status(POLICY_GROUP, POLICY_VERSION, POLICY_PLURAL,
                                                    name, obj)
    finally:
        api.close()


def forbid_with_control_chars(world: World, cluster: str) -> None:
    """Delete the cluster's Policies (so the next round must apply), then make it read-only
    with control characters in its answers. Again if a round re-created them in between."""
    for _ in range(5):
        seq = world.last_seq()
        world.delete_policies(cluster)
        world.faults(cluster, readOnly=True, hostile={"mode": "controlChars"})
        if not [r for r in world.policy_writes(seq) if r.cluster == cluster and r.status < 300]:
            return
        world.clear_faults(cluster)
    raise AssertionError(f"a round re-created {cluster}'s Policies every time")


def test_bad_bytes_from_three_clusters_never_stop_the_daemon(world: World) -> None:
    daemon = world.start("alpha")
    wait_for(daemon.serving, STARTUP_S, "alpha serving")
    wait_for(world.leader, STARTUP_S, "a leader")
    start = dt.datetime.now(dt.UTC).isoformat()
    wait_for(lambda: all(converged_since(daemon, c, "") for c in MEMBERS), STARTUP_S,
             "every member converged")

    # c0001: NUL in one Policy's condition message (valid under the schema).
    write_nul_condition(world, C1, POLICIES[0])
    # c0002: status.phase a JSON object in every Policy it lists.
    world.faults(C2, hostile={"mode": "wrongTypes", "fields": ["status.phase"]})
    # c0003: the apply gets a 403 whose Status holds NUL, ESC, CR LF, a lone surrogate.
    forbid_with_control_chars(world, C3)
    injected = dt.datetime.now(dt.UTC).isoformat()
    assert injected > start

    # The other clusters go on converging, round after round.
    wait_for(lambda: converged_since(daemon, C1, injected) and converged_since(
        daemon, C2, injected), ROUNDS_S, "c0001 and c0002 converged after the bad bytes")

    # /status names the bad cluster with a clear, clean reason.
    bad = wait_for(lambda: (c := clusters(daemon).get(C3)) and c["last_reason"] == "forbidden"
                   and c, ROUNDS_S, "c0003 failing as forbidden")
    assert bad["last_error"].startswith("403 Forbidden: policies.platform.stackship.se")
    assert "\ufffd" in bad["last_error"]
    assert safe(bad["last_error"])

    # The phases read back: the NUL replaced, the object-typed phase reported as Unknown.
    nul = wait_for(lambda: (p := phases(daemon, C1)[POLICIES[0]])["ready_message"] and p,
                   ROUNDS_S, "c0001's condition message read back")
    assert (nul["phase"], nul["ready_message"]) == ("Enforcing", "ok\ufffd")
    malformed = wait_for(lambda: (p := phases(daemon, C2)[POLICIES[0]])["ready_reason"] and p,
                         ROUNDS_S, "c0002's malformed phase read back")
    assert (malformed["phase"], malformed["ready_reason"]) == ("Unknown", "Malformed")
    assert malformed["ready_message"].startswith("status.phase: expected a string, got an "
                                                 "object")

    # Still running and leading several rounds later, every round recorded.
    later = dt.datetime.now(dt.UTC).isoformat()
    wait_for(lambda: converged_since(daemon, C1, later), ROUNDS_S, "another round after that")
    assert daemon.proc.poll() is None, daemon.log()
    assert daemon.is_leader()
    doc = daemon.status()
    assert doc is not None
    assert doc["last_round"]["result"] == "partial"
    assert doc["last_round"]["error"] is None
    assert "Traceback" not in daemon.log()
    # A restart reads the same rows back without trouble.
    daemon.kill()
    again = world.start("bravo")
    wait_for(again.serving, STARTUP_S, "bravo serving")
    restarted = dt.datetime.now(dt.UTC).isoformat()
    wait_for(lambda: converged_since(again, C2, restarted), STARTUP_S + ROUNDS_S,
             "bravo leads and converges c0002")
    assert again.proc.poll() is None, again.log()
