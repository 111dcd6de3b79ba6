"""A policy's kept revisions and the rollback: `GET /v1/policies/{id}/revisions` (the fleet's
scope), `GET /v1/boundaries/{boundary}/policies/{id}/revisions` (that boundary's: no content,
change or name of another boundary shows), and `POST /v1/policies/{id}/rollback` (the admin
token).

A rollback writes the content of an old revision as the policy's new revision (in the database,
recorded as saved by who asked), then saves it like any save (`fanout.Saver`: every cluster
in scope at once, or through the policy's rollout strategy when it has one: the first wave at
once, the others as the rollout goes), and answers the save's report. `{"to": REV}`; `now:
true` skips the waves (an emergency: every cluster in scope at once, a rollout in progress
ended, recorded in its events);
`by` says who asks (default: the token's name).

| operation | answer |
|---|---|
| history | 200, newest first, a page (`?limit=&before=`) |
| rolled back, saved | 200 (`status: ok` or `partial`), `rolled_back_to`, `changed` |
| a bad id, body, field, `limit` or `before` | 400 (413 over 16 KiB, 408 late) |
| no such policy, no such revision kept | 404 |
| that revision is a deletion; the policy's deletion has begun | 409 |
| that revision's content is not a valid policy now (nothing written) | 422 |
| database unavailable | 503 |
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from aiohttp import web

from convergerd.api.auth import asked_by
from convergerd.api.boundaries import boundary_of
from convergerd.api.mutations import BadRequest, answer, read_body, refusal_of
from convergerd.api.server import Views, error_response, policy_id_from_request
from convergerd.config import RevisionRetention
from convergerd.core.errors import ConvergerdError, DatabaseRejected, DatabaseUnavailable
from convergerd.core.model import PolicyId, RuleError
from convergerd.core.revisions import (
    PAGE_DEFAULT,
    PAGE_MAX,
    Diff,
    History,
    Kind,
    Refused,
    Revision,
    Rollback,
    history,
    in_boundary,
)
from convergerd.core.shown import shown
from convergerd.delivery.fanout import Saver
from convergerd.status.views import iso

log = logging.getLogger(__name__)

_ROLLBACK_FIELDS: Mapping[str, type] = {"to": int, "now": bool, "by": str}
# A revision is a PostgreSQL bigint.
_REVISION_MAX = 2**63 - 1
_REFUSED_STATUS = {
    Refused.UNKNOWN_POLICY: 404, Refused.UNKNOWN_REVISION: 404, Refused.DELETION: 409,
    Refused.DELETING: 409, Refused.UNREADABLE: 422, Refused.INVALID: 422,
}


class RevisionSource(Protocol):
    """The kept revisions (`convergerd.store.store.Store`)."""

    async def revision_history(self, policy_id: str, *, before: int | None,
                               limit: int) -> History | None: ...
    async def rollback(self, policy_id: str, to: int, *, actor: str) -> Rollback: ...


def revision_number(value: object, name: str) -> int:
    """A revision number as a request gives it (an int, or the digits of a query parameter);
    `BadRequest` naming `name` and the value."""
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 19:
        value = int(value)
    if type(value) is not int or not 1 <= value <= _REVISION_MAX:
        raise BadRequest(f"{name}: expected a revision number (a whole number from 1), got "
                         f"{shown(value, style='json')}")
    return value


def page_of(query: Mapping[str, str]) -> tuple[int, int | None]:
    """`?limit=` (1 to `PAGE_MAX`, default `PAGE_DEFAULT`) and `?before=` (a revision)."""
    limit = PAGE_DEFAULT
    if "limit" in query:
        limit = revision_number(query["limit"], "limit")
        if limit > PAGE_MAX:
            raise BadRequest(f"limit: at most {PAGE_MAX}, got {limit}")
    before = revision_number(query["before"], "before") if "before" in query else None
    return limit, before


def revision_view(revision: Revision, diff: Diff) -> dict[str, Any]:
    """A kept revision as the API shows it; one from another boundary (a boundary's view)
    without its content and who saved it."""
    elsewhere = diff.kind is Kind.ELSEWHERE
    return {
        "revision": revision.revision,
        "operation": revision.operation.value,
        "saved_at": iso(revision.saved_at),
        "saved_by": None if elsewhere else revision.saved_by,
        "deleted": revision.deleted,
        "readable": revision.readable,
        "content": None if elsewhere else revision.content,
        "what_changed": diff.as_json(),
    }


class RevisionHandlers:
    """The three handlers, over the server's `views` (its database gate and read budget),
    `source` (None: no database, 503) and `saver` (the save after a rollback)."""

    def __init__(self, views: Views, source: RevisionSource | None, saver: Saver, *,
                 retention: RevisionRetention, body_timeout_s: float) -> None:
        self._views = views
        self._source = source
        self._saver = saver
        self._retention = retention
        self._body_timeout_s = body_timeout_s

    async def history(self, request: web.Request) -> web.StreamResponse:
        return await self._history(request, None)

    async def boundary_history(self, request: web.Request) -> web.StreamResponse:
        boundary = boundary_of(request)
        if isinstance(boundary, web.Response):
            return boundary
        return await self._history(request, boundary)

    async def _history(self, request: web.Request,
                       boundary: str | None) -> web.StreamResponse:
        pid = policy_id_from_request(request)
        if isinstance(pid, web.Response):
            return pid
        try:
            limit, before = page_of(request.query)
        except BadRequest as exc:
            return error_response(400, str(exc), reason="query")
        source = self._source
        if source is None:
            return error_response(503, "revisions need the database", reason="database")
        views = self._views
        try:
            found = await views.read(lambda: source.revision_history(
                pid, before=before, limit=limit + 1))
        except (TimeoutError, ConvergerdError, OSError) as exc:
            return error_response(503, f"database unavailable: {views.read_error(exc)}",
                                  policy=pid, reason="database")
        # Another boundary's policy is not there: the same 404 as a policy that is not.
        if found is None or (boundary is not None and found.boundary != boundary):
            where = f" in boundary {boundary!r}" if boundary is not None else ""
            return error_response(404, f"unknown policy {pid!r}{where}", policy=pid)
        views.charge(len(found.newest_first))
        return web.json_response(self._document(found, limit, boundary, request.path))

    def _document(self, found: History, limit: int, boundary: str | None,
                  path: str) -> dict[str, Any]:
        visible: Callable[[Revision], bool] | None = (
            in_boundary(boundary) if boundary is not None else None)
        page, more = history(found.newest_first, limit, visible=visible)
        following = (f"{path}?limit={limit}&before={page[-1][0].revision}"
                     if more and page else None)
        r = self._retention
        return {
            "policy": found.policy,
            "boundary": found.boundary,
            "retention": {"keep_last": r.keep_last,
                          "max_age_days": r.max_age_days if r.max_age_days > 0 else None},
            "revisions": [revision_view(rev, diff) for rev, diff in page],
            "listing": {"complete": not more, "next": following},
        }

    async def rollback(self, request: web.Request) -> web.StreamResponse:
        asked = await self._rollback_request(request)
        if isinstance(asked, web.Response):
            return asked
        pid, to, by, now = asked
        done = await self._roll_back(pid, to, by)
        if isinstance(done, web.Response):
            return done
        try:
            report = await self._saver.save(pid, now=now)
        except DatabaseUnavailable as exc:
            return error_response(
                503, f"policy {pid!r} was rolled back to revision {to}'s content (revision "
                f"{done.revision}), but its save could not read it: {exc}; the leader saves "
                "it on the database's notification, a round at the latest",
                reason="database", rolled_back_to=to, revision=done.revision)
        return answer(report, rolled_back_to=to, changed=done.changed, now=now)

    async def _rollback_request(self, request: web.Request
                                ) -> tuple[PolicyId, int, str, bool] | web.Response:
        """The id, `to`, who asks and `now`, checked in that order; or the refusal."""
        pid = policy_id_from_request(request)
        if isinstance(pid, web.Response):
            return pid
        try:
            fields = await read_body(request, _ROLLBACK_FIELDS, timeout_s=self._body_timeout_s)
            to = revision_number(fields.get("to"), "body.to")
            by = asked_by(fields, request)
        except BadRequest as exc:
            return refusal_of(exc)
        except RuleError as exc:
            return error_response(400, f"body.{exc}")
        if self._source is None:
            return error_response(503, "a rollback needs the database", reason="database")
        return pid, to, by, bool(fields.get("now", False))

    async def _roll_back(self, pid: PolicyId, to: int, by: str) -> Rollback | web.Response:
        """The rollback written, or the answer saying why not."""
        assert self._source is not None
        try:
            done = await self._source.rollback(pid, to, actor=f"{by} (rollback to {to})")
        except DatabaseRejected as exc:
            return error_response(422, f"the database refused revision {to}'s content for "
                                       f"policy {pid!r}: {exc}", reason="database", to=to)
        except ConvergerdError as exc:
            return error_response(503, f"database unavailable: {exc}", reason="database")
        if done.refused is not None:
            return error_response(_REFUSED_STATUS[done.refused],
                                  done.refusal(keep_last=self._retention.keep_last),
                                  reason=done.refused.value, policy=pid, to=to,
                                  invalid=done.reason)
        log.info("policy %s rolled back to revision %d%s by %s", pid, to,
                 f" as revision {done.revision}" if done.changed else " (it had that content)",
                 shown(by, style="text"), extra={"policy": pid})
        return done
