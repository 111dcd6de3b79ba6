"""`convergerd demo` as a user runs it: with an operator per simulated cluster, `/status` shows
the phases and the enforcement probe's verdicts that a real fleet reports."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path
from typing import Any

from tests.fixtures.fleet import free_port
from tests.integration.rounds_helpers import wait_for
from tests.integration.test_cli_secrets import _clean_env, _demo

SEEN_S = 80.0  # rounds every 3 s, the first probe 1 s after a policy is Enforcing; a busy box


def _get(url: str) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 - loopback
            return json.loads(response.read())
    except OSError:
        return None


async def test_the_demo_shows_real_phases_and_verified_policies(
    tmp_path: Path, database_url: str
) -> None:
    port = free_port()
    env = _clean_env(CONVERGERD_DATABASE_URL=database_url,
                     Policies__ConvergeIntervalMinutes="0.05",
                     CONVERGERD_OPERATOR_PROBE_DELAY_SECONDS="1")
    base = f"http://127.0.0.1:{port}"
    async with _demo(tmp_path, env, "--http-addr", f"127.0.0.1:{port}") as (_proc, banner):
        text = "\n".join(banner)
        assert "operators:" in text
        assert "VERIFIED" in text
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
        policy = await asyncio.to_thread(_get, f"{base}/v1/policies/no-latest/status")
        verdicts = {c["cluster"]: c["verified"] for c in policy["clusters"]}
        assert any(v and v["status"] == "True" and v["reason"] == "Denied"
                   for v in verdicts.values()), verdicts
        assert verdicts["c0007"] is not None
        assert verdicts["c0007"]["reason"] == "NotEnforcing"  # Unsupported: nothing to verify
        assert verdicts["c0003"] is None  # down: no operator, nothing read back
    log = (tmp_path / "demo.log").read_text()
    assert "the demo's operator for cluster" not in log  # none of them failed
