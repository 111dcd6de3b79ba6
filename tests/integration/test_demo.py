"""`convergerd demo` as a user runs it: with an operator per simulated cluster, `/status` shows
the phases and the enforcement probe's verdicts that a real fleet reports."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from convergerd.demo import WARN_POLICY
from tests.fixtures.fleet import free_port
from tests.integration.process_helpers import CONVERGERD, clean_env, run_demo
from tests.integration.rounds_helpers import wait_for

SEEN_S = 80.0  # rounds every 3 s, the first probe 1 s after a policy is Enforcing; a busy box
# The enabled, delivered policies of convergerd/demo/tenants.yaml; team-a has two (registries
# and labels): each probe pod must satisfy the other to be denied by its own.
ENFORCED = ("no-latest", "team-a-registries", "team-a-labels", "team-b-registries")


def _get(url: str) -> Any:
    """The JSON at `url`, None while the daemon does not answer; a 429 (the status budget,
    spent by this test's polling) is waited out as its Retry-After says, as a client must."""
    for _ in range(10):
        try:
            with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 - loopback
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            if exc.code != 429:
                return None
            time.sleep(float(exc.headers.get("Retry-After", "1")))
        except OSError:
            return None
    return None


def _kubectl(kubeconfig: Path, context: str, *args: str) -> list[str]:
    done = subprocess.run(["kubectl", "--kubeconfig", str(kubeconfig), "--context", context,
                           *args], capture_output=True, text=True, timeout=30, check=True)
    return sorted(done.stdout.split())


async def test_the_demo_shows_real_phases_and_verified_policies(
    tmp_path: Path, database_url: str
) -> None:
    port = free_port()
    env = clean_env(CONVERGERD_DATABASE_URL=database_url,
                     Policies__ConvergeIntervalMinutes="0.05",
                     CONVERGERD_OPERATOR_PROBE_DELAY_SECONDS="1")
    base = f"http://127.0.0.1:{port}"
    async with run_demo(tmp_path, env, "--http-addr", f"127.0.0.1:{port}") as (_proc, banner):
        text = "\n".join(banner)
        assert "operators:" in text
        assert "VERIFIED" in text
        assert "VIOLATIONS" in text
        workdir = tmp_path / "demo"
        policy_file, session = workdir / "no-latest.policy.yaml", workdir / "no-latest.session"
        assert (f"convergerd policy eval --policy {policy_file} --context c0002 \\\n"
                f"                   --kubeconfig {workdir / 'kubeconfig'} --record {session}"
                in text), text
        assert f"convergerd policy eval --policy {policy_file} --replay {session}" in text
        assert policy_file.read_text().startswith("id: no-latest")
        if shutil.which("kubectl"):  # the workloads that predate the policies are there
            assert await asyncio.to_thread(
                _kubectl, workdir / "kubeconfig", "c0002", "get", "deployments,pods", "-A",
                "-o", "name") == ["deployment.apps/legacy-web", "pod/adhoc-debug"]
        seen: dict[str, Any] = {}

        async def phases_shown() -> bool:
            doc = await asyncio.to_thread(_get, f"{base}/status")
            if not doc:
                return False
            clusters = {c["id"]: c for c in doc["clusters"]}
            phases = {p for c in clusters.values() for p, n in (c.get("phases") or {}).items()
                      if n}
            verified = sum((c.get("verification") or {}).get("verified", 0)
                           for c in clusters.values())
            seen.update(phases=phases, verified=verified,
                        c0007=(clusters.get("c0007") or {}).get("phases"))
            return ({"Enforcing", "Inert"} <= phases and verified > 0
                    and "Unsupported" in (seen["c0007"] or {}))

        await wait_for(phases_shown, timeout_s=SEEN_S,
                       what=f"Enforcing, Inert, Unsupported and verified in /status ({seen})")
        # The web page's address and team-a's read token: what that tenant may see.
        assert f"web page:      {base}/ui/   sign in with team-a's read token" in text
        tenant = re.search(r"^ +(cvg_b_\S+)$", text, re.M)
        assert tenant, text
        request = urllib.request.Request(  # noqa: S310 - loopback
            f"{base}/v1/boundaries/team-a", headers={"Authorization": f"Bearer {tenant[1]}"})
        with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310 - loopback
            assert {p["id"] for p in json.loads(response.read())["policies"]} == {
                "team-a-registries", "team-a-labels"}
        with urllib.request.urlopen(f"{base}/ui/", timeout=5) as response:  # noqa: S310
            assert 'action="/ui/login"' in response.read().decode()
        policy = await asyncio.to_thread(_get, f"{base}/v1/policies/no-latest/status")
        verdicts = {c["cluster"]: c["verified"] for c in policy["clusters"]}
        assert any(v and v["status"] == "True" and v["reason"] == "Denied"
                   for v in verdicts.values()), verdicts
        assert verdicts["c0007"] is not None
        assert verdicts["c0007"]["reason"] == "NotEnforcing"  # Unsupported: nothing to verify
        assert verdicts["c0003"] is None  # down: no operator, nothing read back

        # Every policy, on every cluster where it is Enforcing (the demo makes the boundary's
        # namespace in each), ends Verified True by its own denial; never ProbeFailed.
        found: dict[str, dict[str, Any]] = {}
        failed: set[tuple[str, str, str]] = set()

        async def all_verified() -> bool:
            for pid in ENFORCED:
                doc = await asyncio.to_thread(_get, f"{base}/v1/policies/{pid}/status")
                found[pid] = {c["cluster"]: (c.get("verified") or {}).get("reason")
                              for c in (doc or {}).get("clusters", [])
                              if c.get("phase") == "Enforcing"}
                failed.update((pid, c, r) for c, r in found[pid].items()
                              if r not in (None, "Pending", "Denied"))
            return bool(failed) or all(found[pid] and set(found[pid].values()) == {"Denied"}
                                       for pid in ENFORCED)

        try:
            await wait_for(all_verified, timeout_s=SEEN_S)
        except AssertionError:
            raise AssertionError(f"not every Enforcing policy Verified Denied: {found}") from None
        assert not failed, failed  # (policy, cluster, reason)
        assert set(found["team-a-labels"]) == {"c0001", "c0002", "c0004"}, found
    log = (tmp_path / "demo.log").read_text()
    assert "the demo's operator for cluster" not in log  # none of them failed
    # Ten operators share the demo's log: each of their lines says which cluster it is about.
    lines = [line for line in log.splitlines() if "convergerd.operator.controller:" in line]
    assert lines
    unnamed = [line for line in lines if not re.search(r"\bcluster c00\d\d\b", line)]
    assert not unnamed, unnamed[:3]


# The workloads of convergerd.demo.operators.LEGACY_WORKLOADS that a policy would deny, and the
# policies' totals over the fleet.
EXPECTED_VIOLATIONS = {"no-latest": 2, "team-a-registries": 1, "team-a-labels": 2,
                       "team-b-registries": 1, "team-b-owner": 1}


@pytest.mark.skipif(importlib.util.find_spec("convergerd.operator.audit") is None,
                    reason="needs the operator's audit (status.audit, convergerd.operator.audit)")
async def test_the_demo_shows_violations_of_workloads_that_predate_the_policies(
    tmp_path: Path, database_url: str
) -> None:
    port = free_port()
    env = clean_env(CONVERGERD_DATABASE_URL=database_url,
                     Policies__ConvergeIntervalMinutes="0.05")
    base = f"http://127.0.0.1:{port}"
    async with run_demo(tmp_path, env, "--http-addr", f"127.0.0.1:{port}"):
        seen: dict[str, Any] = {}

        async def counted() -> bool:
            doc = await asyncio.to_thread(_get, f"{base}/status")
            policies = {p["id"]: p["violations"]
                        for p in ((doc or {}).get("audit") or {}).get("policies", [])}
            seen.update(policies=policies)
            return policies == EXPECTED_VIOLATIONS

        await wait_for(counted, timeout_s=SEEN_S, what=f"the audits' totals ({seen})")
        policy = await asyncio.to_thread(_get, f"{base}/v1/policies/no-latest/status")
        per_cluster = {c["cluster"]: (c["audit"] or {}).get("violations")
                       for c in policy["clusters"]}
        assert per_cluster["c0001"] == 1
        assert per_cluster["c0002"] == 1
        assert {s["name"] for s in policy["audit"]["sample"]} == {"legacy-cache", "legacy-web"}
        out = await asyncio.create_subprocess_exec(
            *CONVERGERD, "status", "--addr", base, stdout=asyncio.subprocess.PIPE)
        table = (await out.communicate())[0].decode()
        assert "VIOLATIONS" in table
        assert "  no-latest: 2 on 2 clusters" in table.splitlines(), table
        # The sample tenants' exception, with when it expires (30 days: "in 29d23h").
        [excepted] = [line for line in table.splitlines()
                      if line.startswith("  team-b-registries: 1, ")]
        assert re.search(r"first to expire vendor-agent \(namespace team-b\) at "
                         r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC, in (29d|30d)", excepted), excepted
        # The Warn policy's mode beside the phases, and on its line of admission's counts.
        assert "MODES" in table
        assert any(line.startswith(f"  {WARN_POLICY}: ") and "in force as" in line
                   and "Warn=" in line for line in table.splitlines()), table


async def test_the_demo_halts_a_rollout_at_its_canary_then_rolls_a_fixed_revision_through(
    tmp_path: Path, database_url: str
) -> None:
    """Issue 37, item 6: the demo's rollout story (convergerd/demo/rollout.py), seen through the
    rollouts' API and `convergerd rollout status`."""
    port = free_port()
    env = clean_env(CONVERGERD_DATABASE_URL=database_url,
                     Policies__ConvergeIntervalMinutes="0.05",
                     CONVERGERD_OPERATOR_PROBE_DELAY_SECONDS="1",
                     CONVERGERD_ROLLOUT_GATE_SECONDS="1")
    base = f"http://127.0.0.1:{port}"
    async with run_demo(tmp_path, env, "--http-addr", f"127.0.0.1:{port}") as (_proc, banner):
        text = "\n".join(banner)
        assert f"convergerd rollout status team-c-registries \\\n                   --addr {base}" \
            in text, text
        seen: dict[str, Any] = {}

        async def completed() -> bool:
            doc = await asyncio.to_thread(_get, f"{base}/v1/policies/team-c-registries/rollout")
            seen.update(doc or {})
            return bool(doc) and doc["state"] == "completed" and doc["id"] > 1

        await wait_for(completed, timeout_s=4 * SEEN_S,
                       what=f"the fixed revision rolled through ({seen.get('state')})")
        assert seen["to_revision"] == 3
        assert [{k: r[k] for k in ("revision", "clusters")}  # the canary
                for r in seen["waves"][0]["revisions"]] == [{"revision": 3, "clusters": 1}]
        shown = await asyncio.to_thread(
            subprocess.run, [*CONVERGERD, "rollout", "status", "team-c-registries", "--addr",
                             base], capture_output=True, text=True, timeout=30)
        assert shown.returncode == 0, shown.stderr
        assert shown.stdout.startswith(
            f"policy team-c-registries: rollout {seen['id']} of revision 3 (from 2), strategy "
            "careful: completed (ended), wave 3/3 rest"), shown.stdout
        # The first rollout: halted at the canary by its audit, the canary sent back.
        log = (tmp_path / "demo.log").read_text()
        reverted = re.search(r"rollout story: rollout 1 of revision 2 is (\w+): (.*)", log)
        assert reverted, log[-3000:]
        assert reverted[1] == "reverted"
        assert reverted[2].startswith("new_violations: 1 cluster(s) with more than 0 audit "
                                      "violation(s) at revision 2: c0009 (1)"), reverted[2]
