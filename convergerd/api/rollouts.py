"""Rollouts, seen and operated: `GET /v1/rollouts` (every live rollout), `GET
/v1/policies/{id}/rollout` (a policy's rollout in force, else its latest: its waves, which
clusters hold which revision, what holds it now, its events), and `POST
/v1/policies/{id}/rollout/{pause,resume,approve,abort}` (the admin token). A boundary's tenant
sees the same documents for its policies only (`scopes.Scope.BOUNDARY`): `GET
/v1/boundaries/{boundary}/rollouts` and `GET /v1/boundaries/{boundary}/policies/{id}/rollout`
(another boundary's policy, or one that was in another boundary when its latest rollout ran,
is the same 404 as a policy without one). A policy's rollout covers its boundary's clusters
only, so the tenant's document lists what the admin's does. The web page's rollout page shows
`RolloutHandlers.document` (its lists of live rollouts are `/status`'s and the boundary view's).

A command is a transition like the gate job's (`core.gates.commanded`, written by
`Store.transition_rollout` with a compare-and-set on where the rollout was read), recorded
with who asked (`by` in the body, default the token's name); then the clusters it makes due
something else are written at once (`fanout.Saver.deliver_due`: an approved wave gets the new
revision, an abort sends every cluster back to its previous one), and the answer lists them.

| operation | answer |
|---|---|
| a view | 200; a policy without any rollout: 404 |
| a command done | 200: the rollout as it is now, `clusters` written |
| a bad id, body or field | 400 (413 over 16 KiB, 408 late) |
| the policy has no rollout in force | 404 |
| the rollout is not in a state the command applies to, or moved meanwhile | 409 |
| database unavailable | 503 |
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from aiohttp import web

from convergerd.api.auth import asked_by
from convergerd.api.boundaries import boundary_of
from convergerd.api.mutations import BadRequest, read_body, refusal_of
from convergerd.api.scopes import unknown_boundary
from convergerd.api.server import Views, error_response, policy_id_from_request
from convergerd.core.errors import ConvergerdError, DatabaseUnavailable
from convergerd.core.gates import Command, commanded, decide
from convergerd.core.model import ClusterId, PolicyId, RuleError
from convergerd.core.report import ClusterResult, utc_now
from convergerd.core.rollout import Rollout, Staged, State
from convergerd.core.shown import shown
from convergerd.delivery.fanout import Saver
from convergerd.delivery.rollouts import clusters_by_revision, gate_view, newly_due_clusters
from convergerd.status.reader import StatusReader
from convergerd.status.rollouts import CLUSTERS_NAMED, gate_of
from convergerd.status.views import iso

log = logging.getLogger(__name__)

_COMMAND_FIELDS: Mapping[str, type] = {"by": str}
EVENTS_SHOWN = 50
# A command's transition is not fenced by a Lease (any replica answers it, as any replica
# saves): its statement gets this long.
COMMAND_WRITE_S = 10.0


class RolloutSource(Protocol):
    """The rollouts (`convergerd.store.store.Store`); `boundary`: nothing of a policy while it
    is in another boundary."""

    async def live_rollouts(self) -> list[Rollout]: ...
    async def boundary_rollouts(self, boundary: str, /) -> list[Rollout] | None: ...
    async def staged_rollout(self, policy_id: str, /, *,
                             boundary: str | None = None) -> Staged | None: ...
    async def rollout_of(self, policy_id: str, /, *,
                         boundary: str | None = None) -> Rollout | None: ...
    async def rollout_events(self, rollout_id: int, limit: int, /) -> Sequence[Any]: ...
    async def transition_rollout(self, before: Rollout, after: Rollout, *, by: str, what: str,
                                 detail: str | None = None,
                                 remaining_s: Callable[[], float]) -> Rollout | None: ...


def rollout_json(rollout: Rollout) -> dict[str, Any]:
    """A rollout as every view shows it: where it is, and the gate that holds it (its reason
    says which: `gate: detail`)."""
    strategy = rollout.strategy
    wave = strategy.waves[rollout.wave]
    gate = gate_of(rollout)
    return {
        "id": rollout.id,
        "policy": rollout.policy,
        "to_revision": rollout.to_revision,
        "from_revision": rollout.from_revision,
        "strategy": strategy.id,
        "state": rollout.state.value,
        "wave": {"index": rollout.wave, "name": wave.name, "of": len(strategy.waves),
                 "warn_step": rollout.warn_step, "started_at": iso(rollout.wave_started_at),
                 "ready_at": iso(rollout.wave_ready_at)},
        "gate": gate.value if gate is not None else None,
        "reason": rollout.reason,
        "created_at": iso(rollout.created_at),
        "updated_at": iso(rollout.updated_at),
        "updated_by": rollout.updated_by,
    }


def staged_json(staged: Staged, state: StatusReader) -> dict[str, Any]:
    """A rollout in force with its waves (clusters in each, where each wave is), which
    revisions its clusters report (per wave, the first `CLUSTERS_NAMED` of each revision's
    clusters named), and what holds it now as the status state shows it (for a rollout in
    progress: a look as the gate job takes it, with its counts)."""
    rollout = staged.rollout
    doc = rollout_json(rollout)
    strategy = rollout.strategy
    doc["bake_seconds"] = strategy.bake_s
    doc["on_halt"] = strategy.on_halt.value
    per_wave: dict[int, list[ClusterId]] = {}
    for cluster, place in staged.placements.items():
        per_wave.setdefault(place.wave, []).append(cluster)
    held: dict[int | None, int] = {}
    waves = []
    for i, w in enumerate(strategy.waves):
        clusters = sorted(per_wave.get(i, ()))
        by_revision = clusters_by_revision(state, rollout.policy, clusters)
        for revision, named in by_revision.items():
            held[revision] = held.get(revision, 0) + len(named)
        waves.append({
            "index": i, "name": w.name,
            "selector": dict(w.selector) if w.selector is not None else None,
            "fraction": w.fraction, "warn_first": w.warn_first,
            "approval": w.name in strategy.approval,
            "progress": wave_progress(rollout, i),
            "clusters": len(clusters),
            "revisions": [{"revision": r, "clusters": len(named),
                           "named": named[:CLUSTERS_NAMED]}
                          for r, named in sorted(by_revision.items(),
                                                 key=lambda x: (x[0] is None, x[0] or 0))],
        })
    doc["waves"] = waves
    doc["clusters"] = {"new": held.get(rollout.to_revision, 0),
                       "old": sum(n for r, n in held.items()
                                  if r is not None and r != rollout.to_revision),
                       "none": held.get(None, 0)}
    if rollout.state is State.PROGRESSING:
        look = decide(rollout, gate_view(state, staged), state.clock())
        doc["now"] = {"gate": look.gate.value, "detail": look.detail}
    return doc


def wave_progress(rollout: Rollout, index: int) -> str:
    """Where wave `index` of a rollout in force is: `done` (passed), `current` (the rollout's
    state says how: progressing, waiting for approval, paused, halted), `waiting` (not reached
    yet), `sent_back` (its clusters returned to their previous revision: a reverted wave, and
    every wave an abort reached) or `not_reached` (the rollout ended before it)."""
    if index > rollout.wave:
        return "waiting" if rollout.live else "not_reached"
    if rollout.state is State.ABORTED or (rollout.state is State.REVERTED
                                          and index == rollout.wave):
        return "sent_back"
    return "done" if index < rollout.wave else "current"


def event_json(event: Any) -> dict[str, Any]:
    return {"at": iso(event.at), "by": event.by, "what": event.what, "wave": event.wave,
            "detail": event.detail}


class RolloutHandlers:
    """The views and the commands, over the server's `views` (its database gate and read
    budget, the status state), `source` (None: no database, 503) and `saver`."""

    def __init__(self, views: Views, source: RolloutSource | None, saver: Saver, *,
                 body_timeout_s: float) -> None:
        self._views = views
        self._source = source
        self._saver = saver
        self._body_timeout_s = body_timeout_s

    async def list(self, request: web.Request) -> web.StreamResponse:
        found = await self.listed(None)
        return found if isinstance(found, web.Response) else web.json_response(found)

    async def boundary_list(self, request: web.Request) -> web.StreamResponse:
        boundary = boundary_of(request)
        if isinstance(boundary, web.Response):
            return boundary
        found = await self.listed(boundary)
        return found if isinstance(found, web.Response) else web.json_response(found)

    async def listed(self, boundary: str | None) -> dict[str, Any] | web.Response:
        """The live rollouts (with `boundary`, of its policies: the 404 of `unknown_boundary`
        when there is no such boundary), or the error answer."""
        source = self._source
        if source is None:
            return error_response(503, "rollouts need the database", reason="database")
        views = self._views
        try:
            found = await views.read(source.live_rollouts if boundary is None
                                     else lambda: source.boundary_rollouts(boundary))
        except (TimeoutError, ConvergerdError, OSError) as exc:
            return error_response(503, f"database unavailable: {views.read_error(exc)}",
                                  reason="database")
        if found is None:
            assert boundary is not None
            status, body = unknown_boundary(boundary)
            return web.json_response(body, status=status)
        views.charge(len(found))
        doc = {"rollouts": [rollout_json(r) for r in found]}
        return doc if boundary is None else {"boundary": boundary, **doc}

    async def policy(self, request: web.Request) -> web.StreamResponse:
        pid = policy_id_from_request(request)
        if isinstance(pid, web.Response):
            return pid
        found = await self.document(pid, None)
        return found if isinstance(found, web.Response) else web.json_response(found)

    async def boundary_policy(self, request: web.Request) -> web.StreamResponse:
        boundary = boundary_of(request)
        if isinstance(boundary, web.Response):
            return boundary
        pid = policy_id_from_request(request)
        if isinstance(pid, web.Response):
            return pid
        found = await self.document(pid, boundary)
        return found if isinstance(found, web.Response) else web.json_response(found)

    async def document(self, pid: PolicyId,
                       boundary: str | None) -> dict[str, Any] | web.Response:
        """The policy's rollout in force, else its latest, with its events (with `boundary`:
        only while the policy is in it, see the module's doc), or the error answer: one 404
        for a policy without a rollout, one that does not exist and another boundary's."""
        source = self._source
        if source is None:
            return error_response(503, "rollouts need the database", reason="database")
        views = self._views
        try:
            staged = await views.read(lambda: source.staged_rollout(pid, boundary=boundary))
            rollout = staged.rollout if staged is not None else await views.read(
                lambda: source.rollout_of(pid, boundary=boundary))
            events = (await views.read(lambda: source.rollout_events(rollout.id, EVENTS_SHOWN))
                      if rollout is not None else [])
        except (TimeoutError, ConvergerdError, OSError) as exc:
            return error_response(503, f"database unavailable: {views.read_error(exc)}",
                                  policy=pid, reason="database")
        if rollout is None:
            if boundary is None:
                return error_response(404, f"policy {pid!r} has no rollout", policy=pid)
            return error_response(404, f"policy {pid!r} has no rollout in boundary "
                                       f"{boundary!r}", policy=pid, boundary=boundary)
        doc = (staged_json(staged, views.state) if staged is not None
               else rollout_json(rollout))
        doc["in_force"] = staged is not None
        doc["events"] = [event_json(e) for e in sorted(events, key=lambda e: e.at)]
        views.charge(len(staged.placements) if staged is not None else 1)
        return doc if boundary is None else {"boundary": boundary, **doc}

    def command(self, what: Command) -> Callable[[web.Request], Any]:
        async def handler(request: web.Request) -> web.StreamResponse:
            return await self._command(request, what)

        return handler

    async def _command(self, request: web.Request, what: Command) -> web.StreamResponse:
        pid = policy_id_from_request(request)
        if isinstance(pid, web.Response):
            return pid
        try:
            fields = await read_body(request, _COMMAND_FIELDS, timeout_s=self._body_timeout_s)
            by = asked_by(fields, request)
        except BadRequest as exc:
            return refusal_of(exc)
        except RuleError as exc:
            return error_response(400, f"body.{exc}")
        source = self._source
        if source is None:
            return error_response(503, "rollouts need the database", reason="database")
        try:
            return await self._run(source, pid, what, by)
        except DatabaseUnavailable as exc:
            return error_response(503, f"database unavailable: {exc}", reason="database",
                                  policy=pid)

    async def _run(self, source: RolloutSource, pid: PolicyId, what: Command,
                   by: str) -> web.StreamResponse:
        staged = await source.staged_rollout(pid)
        if staged is None:
            return error_response(404, f"policy {pid!r} has no rollout in force", policy=pid)
        before = staged.rollout
        after = commanded(before, what, by)
        if isinstance(after, str):
            return error_response(409, after, policy=pid, state=before.state.value)
        written = await source.transition_rollout(
            before, after, by=by, what=what.value, remaining_s=_unfenced(COMMAND_WRITE_S))
        if written is None:
            return error_response(409, f"rollout {before.id} of policy {pid!r} moved while "
                                       "this was asked: look at it again, and ask again",
                                  policy=pid)
        log.info("rollout %d of policy %s: %s by %s (now %s, wave %d)", before.id, pid,
                 what.value, shown(by, style="text"), written.state.value, written.wave,
                 extra={"policy": pid, "rollout": before.id, "rollout_step": what.value})
        due = newly_due_clusters(before, written, staged)
        results: list[ClusterResult] = []
        if due:
            report = await self._saver.deliver_due(pid, due, trigger=f"rollout {what.value}")
            results = report.results
        doc = rollout_json(written)
        doc["clusters_written"] = [r.as_json() for r in results]
        return web.json_response(doc)


def _unfenced(bound_s: float) -> Callable[[], float]:
    """What a command's write may take: `bound_s` from now, whoever leads."""
    deadline = utc_now().timestamp() + bound_s

    def remaining_s() -> float:
        return max(math.ulp(1.0), deadline - utc_now().timestamp())

    return remaining_s
