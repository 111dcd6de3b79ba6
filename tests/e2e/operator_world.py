"""A real `convergerd operator` whose own cluster answers what only it reads with garbage, and
the invariants every such answer must leave true (tests/e2e/test_operator_hostile_grammar.py
asserts them).

The daemon's hostile grammar (`hostile_world`) covers what the daemon reads; the operator
also reads two things of its own cluster's API server that nothing else does: `/metrics` (the
admission counts, `status.admission`) and the `Warning` headers of its enforcement probes'
dry-run answers (a Warn binding's failures: `Verified` True `Warned`). The simulator's
`hostileMetrics` and `hostileWarnings` modes break those (and only those) answers;
`GRAMMAR` is what a case draws from.

The simulator runs in this process and its store is read directly (a cluster that lies in
its answers is not asked what it holds); the operator is `convergerd operator --context
c0001` in a process of its own (its RSS, its event loop, its log). One boundary, two
Policies: `p1` (Deny) and `w1` (Warn). No tenant sends a request, so every admission the API
server counts is one of the operator's own probes, which it takes out: a count other than
zero is one the garbage made up. A case:

1. make `c0001` hostile, then save both Policies at a new revision (what the daemon's save
   does: the operator installs it, probes it, and counts it from its install);
2. wait until both are Enforcing at the new generation with a Verified decided by a probe
   of this case, and at least `MIN_CASE_S` (several reads of `/metrics`);
3. check the invariants (`World._check`), clear the fault, and wait until `/metrics` is read
   again for the new revision.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import re
import subprocess
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from convergerd.sim.faults import Faults
from convergerd.sim.fleet import Fleet
from convergerd.sim.resources import NAMESPACES, POLICIES
from convergerd.sim.status import ApiError
from tests.e2e.harness import CONVERGERD, stop_gently
from tests.e2e.hostile_world import Case, now_iso, proc_mb, reset_peak
from tests.fixtures.fleet import free_port

MiB = 2**20
CLUSTER = "c0001"
BOUNDARY = "b1"
NAMESPACE = "team-a"
POLICY_IDS = ("p1", "w1")  # p1: Deny, w1: Warn
MAX_COUNT = 2**53  # admissioncounts.MAX_VALUE: no count is beyond what a float holds exactly
# RSS budget of the operator (VmHWM, reset before every case): at rest it measures ~86 MB
# (2026-12-06); what is above it is an answer held whole that should have been streamed.
RSS_BUDGET_MB = 160.0
# How long the operator's own /healthz may take to answer: longer is its loop blocked.
LOOP_BUDGET_S = 1.0
# Lines the operator may log in a case (a few a second: transitions, probes, throttled
# warnings), and the longest one.
LOG_LINES_BUDGET = 60
LOG_LINE_CHARS = 3000
# A condition's message: a probe's verdict with one warning of at most 500 characters.
MESSAGE_CHARS = 1200
CASE_S = 15.0
MIN_CASE_S = 3.0  # six reads of /metrics at least
RECOVER_S = 15.0
STARTUP_S = 30.0
POLL_S = 0.1
ENV = {
    "CONVERGERD_OPERATOR_PROBE_DELAY_SECONDS": "0.2",
    "CONVERGERD_OPERATOR_PROBE_MINUTES": "0.02",  # a probe every 1.2 s
    "CONVERGERD_OPERATOR_ADMISSION_READ_SECONDS": "0.5",
    "CONVERGERD_IDENTITY": "op-hostile",
    "PYTHONUNBUFFERED": "1",
}
# What is not text a user can read: controls (line breaks and tabs included: a message is one
# line), DEL, C1, the bidi controls, lone surrogates, and U+FFFD's absence is not required.
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")

# The grammar: mode -> parameter -> the values a case draws from.
GRAMMAR: dict[str, dict[str, tuple[Any, ...]]] = {
    "hostileMetrics": {
        "shape": ("huge", "repeated", "longLine", "badValues", "manyPolicies", "trickle",
                  "notText", "restarts", "backwards", "labelEscapes"),
        "bytes": (24 * MiB, 10 * MiB),
        "count": (1_000, 20_000, 100_000, 1_000_000),
        "value": ("NaN", "-1", "1e308", "+Inf", "1.5", "0x10", "9007199254740993"),
    },
    "hostileWarnings": {
        "shape": ("many", "huge", "malformed", "controlChars", "rawControls", "invalidUtf8"),
        "count": (20, 100, 300),
        "bytes": (100, 4000, 20_000),
    },
}
# Not in the grammar: no fault at all, the control a harness change is checked with.
HEALTHY = "healthy"
# Parameters a shape does not read are not part of its case (`case_of`).
_USES = {"huge": ("bytes",), "longLine": ("bytes",), "repeated": ("count",),
         "manyPolicies": ("count",), "badValues": ("value",), "many": ("count", "bytes"),
         "huge-warnings": ("count", "bytes"), "malformed": ("count",)}
# /metrics shapes that carry the real counters among the garbage: the operator must still
# read them (a new revision's figures are written during the case).
READABLE = ("huge", "longLine", "labelEscapes")
# /metrics shapes no API server sends (a series twice, values that are not counts, a body
# that never ends in time, an HTML page): nothing is taken from them, so nothing is written
# for the new revision during the case.
REFUSED = ("repeated", "badValues", "trickle", "notText")
# Shapes that lie about the counters in a way no reader can tell from the truth (a restart
# at every read; a reset at every read): the figures may move, but only marked (`resets`,
# `note`: a lower bound).
LIES = ("restarts", "backwards")


def case_of(mode: str, params: Mapping[str, Any]) -> Case:
    """The case of a draw, without the parameters its shape does not read."""
    shape = params["shape"]
    key = "huge-warnings" if mode == "hostileWarnings" and shape == "huge" else shape
    used = {"shape": shape, **{k: params[k] for k in _USES.get(key, ()) if k in params}}
    return Case.of(mode, used)


def warnings_readable(case: Case) -> bool:
    """An HTTP client reads the dry-run answers of this case (aiohttp: at most 128 headers,
    8,190 bytes each, no control but tab): the real warning, sent first, must be found."""
    if case.mode != "hostileWarnings":
        return True
    shape = case.param("shape")
    params = dict(case.params)
    if shape == "many":
        return bool(params["count"] < 100 and params["bytes"] < 8000)
    return shape in ("malformed", "controlChars", "invalidUtf8")


@dataclass
class Outcome:
    """What one case found: the invariants it broke and the figures it measured."""

    case: Case
    violations: list[str] = field(default_factory=list)
    seconds: float = 0.0
    peak_mb: float = 0.0
    loop_s: float = 0.0  # the longest /healthz answer of the operator during the case
    log_lines: int = 0
    verified: dict[str, str] = field(default_factory=dict)

    def line(self) -> str:
        broke = "; ".join(self.violations) or "ok"
        return (f"{self.case}: {self.seconds:.1f} s, RSS peak {self.peak_mb:.0f} MB, /healthz "
                f"max {self.loop_s * 1000:.0f} ms, {self.log_lines} log lines, Verified "
                f"{self.verified}: {broke}")


def admission_problems(found: Any) -> list[str]:
    """What is nonsense in one `status.admission` (as written, whatever the case)."""
    if found is None:
        return []
    if not isinstance(found, dict):
        return [f"not an object: {str(found)[:100]}"]
    problems = []
    for where, doc in (("", found), ("lastHour.", found.get("lastHour"))):
        if not isinstance(doc, dict):
            problems.append(f"{where or 'lastHour'}: not an object")
            continue
        for key in ("denied", "warned", "audited"):
            value = doc.get(key)
            if type(value) is not int or not 0 <= value <= MAX_COUNT:
                problems.append(f"{where}{key}: {value!r} is not a count")
    for key in ("resets", "probesExcluded"):
        value = found.get(key)
        if type(value) is not int or value < 0:
            problems.append(f"{key}: {value!r} is not a count")
    note = found.get("note")
    if note is not None and (not isinstance(note, str) or len(note) > 500
                             or CONTROL.search(note)):
        problems.append(f"note: {note!r:.200}")
    problems.extend(f"{key}: {found.get(key)!r:.100}" for key in ("since", "readAt")
                    if not isinstance(found.get(key), str) or len(found[key]) > 40)
    return problems


def figures(found: Mapping[str, Any]) -> tuple[Any, ...]:
    return found.get("denied"), found.get("warned"), found.get("audited")


class World:
    """The simulator, the operator process and what a case needs of both."""

    def __init__(self, workdir: Path, fleet: Fleet, http: aiohttp.ClientSession) -> None:
        self.workdir = workdir
        self.fleet = fleet
        self.http = http
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.log_path = workdir / "operator.log"
        self.revision = 1

    # -- the operator -----------------------------------------------------------------------

    def start(self) -> None:
        self.port = free_port()
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("CONVERGERD_", "Policies__", "KUBERNETES_SERVICE"))}
        env.update(ENV)
        env.update({"CONVERGERD_KUBECONFIG": str(self.fleet.kubeconfig_path),
                    "CONVERGERD_OPERATOR_HTTP_ADDR": f"127.0.0.1:{self.port}"})
        with self.log_path.open("wb") as out:
            self.proc = subprocess.Popen([*CONVERGERD, "operator", "--context", CLUSTER],
                                         stdout=out, stderr=subprocess.STDOUT, env=env)

    def stop(self) -> None:
        stop_gently(self.proc)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_lines(self) -> list[str]:
        if not self.log_path.exists():
            return []
        return self.log_path.read_bytes().decode("utf-8", "surrogateescape").splitlines()

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_lines()[-lines:])

    async def health_s(self) -> float:
        """How long the operator's /healthz took to answer (its loop's responsiveness)."""
        started = time.monotonic()
        with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
            async with self.http.get(f"http://127.0.0.1:{self.port}/healthz") as resp:
                await resp.read()
        return time.monotonic() - started

    async def leading(self) -> bool:
        try:
            async with self.http.get(f"http://127.0.0.1:{self.port}/readyz") as resp:
                return resp.status == 200 and (await resp.json()).get("leader") is True
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError):
            return False

    # -- the cluster, read from its store ---------------------------------------------------

    def policy(self, pid: str) -> dict[str, Any] | None:
        try:
            return self.fleet.store(CLUSTER).get(POLICIES, None, f"policy-{pid}")
        except ApiError:
            return None

    def put_namespace(self) -> None:
        body = {"apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": NAMESPACE, "labels": {
                    "platform.stackship.se/boundary": BOUNDARY}}}
        self.fleet.store(CLUSTER).create(NAMESPACES, None, body, manager="test")

    def save_policies(self) -> None:
        """Both Policies at `self.revision`, applied as the daemon's save does."""
        rules = {"p1": ({"type": "ForbidLatestTag"}, None),
                 "w1": ({"type": "RequiredLabels", "labels": ["team"]}, "Warn")}
        for pid, (rule, enforcement) in rules.items():
            spec: dict[str, Any] = {"policyId": pid, "boundary": BOUNDARY, "enabled": True,
                                    "revision": self.revision, "rule": rule}
            if enforcement is not None:
                spec["enforcement"] = enforcement
            body = {"apiVersion": "platform.stackship.se/v1alpha1", "kind": "Policy",
                    "metadata": {"name": f"policy-{pid}", "labels": {
                        "platform.stackship.se/boundary": BOUNDARY,
                        "app.kubernetes.io/managed-by": "convergerd"}},
                    "spec": spec}
            self.fleet.store(CLUSTER).patch(
                POLICIES, None, f"policy-{pid}", json.dumps(body).encode(),
                content_type="application/apply-patch+yaml", manager="stackship-platform",
                force=True)

    def settled(self, since: str) -> dict[str, dict[str, Any]] | None:
        """Both Policies Enforcing at their generation with a Verified decided by a probe
        since `since` (their Verified conditions), else None."""
        found = {}
        for pid in POLICY_IDS:
            policy = self.policy(pid) or {}
            status = policy.get("status") or {}
            if (status.get("phase") != "Enforcing" or status.get("observedGeneration")
                    != policy.get("metadata", {}).get("generation")):
                return None
            verified = next((c for c in status.get("conditions") or []
                             if c.get("type") == "Verified"), None)
            if (verified is None or verified.get("status") not in ("True", "False")
                    or str(verified.get("lastProbeTime") or "") < since[:19]):
                return None
            found[pid] = verified
        return found

    def admission(self, pid: str) -> Any:
        return ((self.policy(pid) or {}).get("status") or {}).get("admission")

    # -- a case -----------------------------------------------------------------------------

    async def wait_ready(self) -> None:
        deadline = time.monotonic() + STARTUP_S
        self.put_namespace()
        self.save_policies()
        while not (self.settled("") and await self.leading()
                   and all(self.admission(p) for p in POLICY_IDS)):
            if not self.alive() or time.monotonic() > deadline:
                raise AssertionError(f"the operator is not leading with both Policies "
                                     f"verified and counted:\n{self.log_tail()}")
            await asyncio.sleep(POLL_S)

    async def run(self, case: Case) -> Outcome:
        out = Outcome(case)
        started = time.monotonic()
        before = {pid: self.admission(pid) for pid in POLICY_IDS}
        log_at = len(self.log_lines())
        reset_peak(self.pid)
        since = now_iso()
        if case.mode != HEALTHY:
            self.fleet.set_faults(CLUSTER, Faults.from_mapping(
                {"hostile": {"mode": case.mode, **dict(case.params)}}))
        try:
            self.revision += 1
            self.save_policies()
            verified = await self._watch(out, since, started)
            out.peak_mb = proc_mb(self.pid, "VmHWM")
            self._check(out, before, verified, self.log_lines()[log_at:])
        finally:
            self.fleet.set_faults(CLUSTER, Faults())
        out.seconds = time.monotonic() - started
        await self._recover(out)
        return out

    async def _watch(self, out: Outcome, since: str, started: float
                     ) -> dict[str, dict[str, Any]]:
        """Poll until both Policies settled at the new revision and `MIN_CASE_S` passed,
        checking the operator's leadership and loop at every poll."""
        verified: dict[str, dict[str, Any]] = {}
        while True:
            if not self.alive():
                code = self.proc.returncode if self.proc is not None else None
                out.violations.append(f"exited: the operator exited ({code})")
                return verified
            out.loop_s = max(out.loop_s, await self.health_s())
            if not await self.leading() and not any(v.startswith("lead")
                                                    for v in out.violations):
                out.violations.append("lead: the operator stopped leading during the case")
            verified = self.settled(since) or verified
            elapsed = time.monotonic() - started
            if verified and elapsed >= MIN_CASE_S:
                return verified
            if elapsed > CASE_S:
                states = {pid: ((self.policy(pid) or {}).get("status") or {}).get("phase")
                          for pid in POLICY_IDS}
                out.violations.append(f"reconcile: the Policies did not settle at revision "
                                      f"{self.revision} with a new Verified within {CASE_S:g}"
                                      f" s: {states}")
                return verified
            await asyncio.sleep(POLL_S)

    def _check(self, out: Outcome, before: Mapping[str, Any],
               verified: Mapping[str, Mapping[str, Any]], logged: list[str]) -> None:
        shape = dict(out.case.params).get("shape", HEALTHY)
        if out.peak_mb > RSS_BUDGET_MB:
            out.violations.append(f"rss: peak {out.peak_mb:.0f} MB over the budget "
                                  f"{RSS_BUDGET_MB:g} MB")
        if out.loop_s > LOOP_BUDGET_S:
            out.violations.append(f"loop: /healthz took {out.loop_s:.2f} s")
        for pid in POLICY_IDS:
            self._check_admission(out, pid, before[pid], shape)
        self._check_verified(out, verified)
        self._check_log(out, logged)

    def _check_admission(self, out: Outcome, pid: str, before: Any, shape: str) -> None:
        """`status.admission` of one Policy: counts only, none made up, unchanged by answers
        that cannot be used, marked when taken from a lie (module docstring)."""
        case = out.case
        found = self.admission(pid)
        out.violations.extend(f"admission: {pid}: {p}" for p in admission_problems(found))
        if isinstance(found, dict):
            fresh = found.get("revision") == self.revision
            if not fresh and found != before:
                out.violations.append(f"admission: {pid}: changed but not for revision "
                                      f"{self.revision}: {json.dumps(found)[:300]}")
            if case.mode == "hostileMetrics" and shape in REFUSED and fresh:
                out.violations.append(f"admission: {pid}: written from answers that are not "
                                      f"an API server's counters: {json.dumps(found)[:300]}")
            if case.mode == "hostileMetrics" and shape in READABLE and not fresh:
                out.violations.append(f"admission: {pid}: revision {self.revision} not "
                                      f"counted through garbage that carries the counters")
            if fresh and shape not in LIES and (
                    any(figures(found)) or found.get("resets") or found.get("note")):
                out.violations.append(f"admission: {pid}: counts no tenant made, or marked "
                                      f"for no reason: {json.dumps(found)[:300]}")
            if fresh and shape in LIES and any(figures(found)) and not (
                    found.get("resets") or found.get("note")):
                out.violations.append(f"admission: {pid}: counts taken from a lie, not "
                                      f"marked: {json.dumps(found)[:300]}")

    def _check_verified(self, out: Outcome, verified: Mapping[str, Mapping[str, Any]]) -> None:
        for pid, condition in verified.items():
            out.verified[pid] = f"{condition.get('status')} {condition.get('reason')}"
            message = str(condition.get("message", ""))
            if len(message) > MESSAGE_CHARS or CONTROL.search(message):
                out.violations.append(f"verified: {pid}: message not bounded or not clean: "
                                      f"{message[:200]!r} ({len(message)} characters)")
        if warnings_readable(out.case) and verified and (
                out.verified.get("p1") != "True Denied"
                or out.verified.get("w1") != "True Warned"):
            out.violations.append(f"verified: readable answers, yet {out.verified}")

    def _check_log(self, out: Outcome, logged: list[str]) -> None:
        out.log_lines = len(logged)
        if len(logged) > LOG_LINES_BUDGET:
            out.violations.append(f"log: {len(logged)} lines in one case (first: "
                                  f"{logged[0][:200]!r})")
        bad = [line for line in logged
               if len(line) > LOG_LINE_CHARS or CONTROL.search(line.replace("\t", " "))]
        if bad:
            out.violations.append(f"log: {len(bad)} line(s) too long or with controls; "
                                  f"first: {bad[0][:300]!r}")

    async def _recover(self, out: Outcome) -> None:
        """Once the fault is cleared, /metrics is read again for the new revision."""
        cleared = now_iso()
        deadline = time.monotonic() + RECOVER_S
        while True:
            found = [self.admission(pid) or {} for pid in POLICY_IDS]
            if all(f.get("revision") == self.revision and str(f.get("readAt")) >= cleared[:19]
                   for f in found):
                self._check_recovered(out, found)
                return
            if time.monotonic() > deadline or not self.alive():
                out.violations.append(f"recover: status.admission not read again "
                                      f"{RECOVER_S:g} s after the fault cleared: {found}")
                return
            await asyncio.sleep(POLL_S)


    def _check_recovered(self, out: Outcome, found: list[dict[str, Any]]) -> None:
        """Read again from an honest server, the figures are still what the tenants did (no
        count, no reset), unless the case lied: what a garbage read left behind (a series
        missing, read as a reset; a value read as another) shows here as counts again."""
        shape = dict(out.case.params).get("shape", HEALTHY)
        for pid, figures_now in zip(POLICY_IDS, found, strict=True):
            out.violations.extend(f"recover: {pid}: {p}"
                                  for p in admission_problems(figures_now))
            if shape not in LIES and (any(figures(figures_now)) or figures_now.get("resets")
                                      or figures_now.get("note")):
                out.violations.append(f"recover: {pid}: counts no tenant made once read "
                                      f"again: {json.dumps(figures_now)[:300]}")


@contextlib.asynccontextmanager
async def open_world(workdir: Path) -> AsyncIterator[World]:
    """The simulator (one member and home), the operator leading with both Policies verified
    and counted; everything stopped afterwards."""
    async with (
        Fleet(clusters=1, kubeconfig_path=workdir / "kubeconfig", rng=random.Random(20261207),
              bookmark_interval_s=1.0) as fleet,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http,
    ):
        world = World(workdir, fleet, http)
        world.start()
        try:
            await world.wait_ready()
            yield world
        finally:
            world.stop()
