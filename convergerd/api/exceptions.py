"""The exception endpoints (docs/design.md, "Exceptions"):

- `GET /v1/exceptions` (`?policy=ID`): 200, every exception (of one policy), soonest expiry
  first, each with `state` `active` or `expired`.
- `POST /v1/policies/{id}/exceptions`: 201, granted (a new revision of the policy) and saved to
  its clusters at once (`save`, as `policy apply` answers); 400 naming the field and value (an
  expiry in the past or past `CONVERGERD_EXCEPTION_MAX_DAYS`, a name and a selector
  together); 404 no such policy; 409 the id taken, too many in force, or the policy being
  deleted.
- `DELETE /v1/policies/{id}/exceptions/{eid}`: 200, withdrawn (a new revision) and saved; the
  body `{"by": "who"}` is required; 404 no such exception.

Who may call them is `convergerd.api.scopes`' (checked by `convergerd.api.auth.Guard` before
these handlers): the mutating two need the admin token, as the save endpoint; the listing shows
every boundary's policies, so it is a fleet view. Every change is recorded in the database with
who (`approvedBy` of a grant, `by` of a withdrawal), when and what.
"""

from __future__ import annotations

import datetime as dt
import secrets
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from aiohttp import web

from convergerd.api.mutations import BadRequest, read_body, refusal_of, report_json
from convergerd.api.server import error_response, policy_id_from_request
from convergerd.core.errors import DatabaseUnavailable
from convergerd.core.exceptions import (
    check_exception_id,
    check_grant,
    parse_exception,
)
from convergerd.core.model import PolicyException, PolicyId, RuleError, check_policy_id
from convergerd.core.shown import shown
from convergerd.delivery.fanout import Saver
from convergerd.store.exceptions import PolicyGone, Refused, StoredException

_GRANT_FIELDS: Mapping[str, type] = {
    "id": str, "namespace": str, "name": str, "selector": dict, "reason": str,
    "requestedBy": str, "approvedBy": str, "expiresAt": str}
_WITHDRAW_FIELDS: Mapping[str, type] = {"by": str}
BY_MAX_CHARS = 128


class ExceptionSource(Protocol):
    """What the endpoints read and write (`convergerd.store.store.Store`)."""

    async def grant_exception(self, policy_id: str, exception: PolicyException, /) -> int: ...
    async def withdraw_exception(self, policy_id: str, exception_id: str, actor: str, /
                                 ) -> tuple[dict[str, Any], int] | None: ...
    async def list_exceptions(self, policy_id: str | None = None, /
                              ) -> list[StoredException]: ...


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def stored_json(found: StoredException) -> dict[str, Any]:
    return {"policy": found.policy, **found.spec,
            "state": "expired" if found.expired else "active",
            "grantedAt": found.granted_at.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "grantedRevision": found.granted_revision,
            "lapsedRevision": found.lapsed_revision}


def _no_store() -> web.Response:
    return error_response(503, "exceptions need the database", reason="database")


def _check_by(by: object) -> None:
    if not isinstance(by, str) or not by.strip() or len(by) > BY_MAX_CHARS \
            or not by.isprintable():
        raise RuleError(f"body.by: required: who withdraws it (a printable name of at most "
                        f"{BY_MAX_CHARS} characters), got {shown(by)}")


class ExceptionHandlers:
    """The exception endpoints over the database and the `Saver` (a change is saved at once,
    as `POST /v1/policies/{id}/apply` would); expiries are checked on `wall`, at most
    `max_days` ahead. Without a `store` (an app over no database) they answer 503."""

    def __init__(self, store: ExceptionSource | None, saver: Saver, *,
                 body_timeout_s: float, max_days: float,
                 wall: Callable[[], dt.datetime] = _utcnow) -> None:
        self._store = store
        self._saver = saver
        self._body_timeout_s = body_timeout_s
        self._max_days = max_days
        self._wall = wall

    async def listing(self, request: web.Request) -> web.StreamResponse:
        if self._store is None:
            return _no_store()
        policy = request.query.get("policy")
        if policy is not None:
            try:
                check_policy_id(policy)
            except RuleError as exc:
                return error_response(400, f"bad policy id: {shown(str(exc), style='text')}")
        try:
            found = await self._store.list_exceptions(policy)
        except DatabaseUnavailable as exc:
            return error_response(503, f"database unavailable: {exc}", reason="database")
        return web.json_response({"exceptions": [stored_json(f) for f in found]})

    async def _checked(self, request: web.Request, allowed: Mapping[str, type]
                       ) -> tuple[ExceptionSource, PolicyId, dict[str, Any]] | web.Response:
        if self._store is None:
            return _no_store()
        policy_id = policy_id_from_request(request)
        if isinstance(policy_id, web.Response):
            return policy_id
        try:
            return self._store, policy_id, await read_body(request, allowed,
                                                           timeout_s=self._body_timeout_s)
        except BadRequest as exc:
            return refusal_of(exc)

    async def grant(self, request: web.Request) -> web.StreamResponse:
        checked = await self._checked(request, _GRANT_FIELDS)
        if isinstance(checked, web.Response):
            return checked
        store, policy_id, body = checked
        body.setdefault("id", f"ex-{secrets.token_hex(4)}")
        try:
            exception = parse_exception(body, "body")
            check_grant(exception, now=self._wall(), max_days=self._max_days,
                        where="body.expiresAt")
        except RuleError as exc:
            return error_response(400, str(exc))
        try:
            revision = await store.grant_exception(policy_id, exception)
        except PolicyGone as exc:
            return error_response(409 if exc.deleting else 404, f"policy {policy_id!r}: {exc}")
        except Refused as exc:
            return error_response(409, str(exc))
        except DatabaseUnavailable as exc:
            return error_response(503, f"database unavailable: {exc}", reason="database")
        return await self._saved(policy_id, 201, {"granted": body | {
            "expiresAt": exception.expires_at.strftime("%Y-%m-%dT%H:%M:%SZ")},
            "revision": revision})

    async def withdraw(self, request: web.Request) -> web.StreamResponse:
        checked = await self._checked(request, _WITHDRAW_FIELDS)
        if isinstance(checked, web.Response):
            return checked
        store, policy_id, body = checked
        by = str(body.get("by", ""))
        try:
            exception_id = check_exception_id(request.match_info["eid"], "exception id")
            _check_by(by)
        except RuleError as exc:
            return error_response(400, str(exc))
        try:
            done = await store.withdraw_exception(policy_id, exception_id, by)
        except PolicyGone as exc:
            return error_response(409 if exc.deleting else 404, f"policy {policy_id!r}: {exc}")
        except DatabaseUnavailable as exc:
            return error_response(503, f"database unavailable: {exc}", reason="database")
        if done is None:
            return error_response(404, f"policy {policy_id!r} has no exception "
                                  f"{exception_id!r}")
        return await self._saved(policy_id, 200, {"withdrawn": done[0], "revision": done[1]})

    async def _saved(self, policy_id: PolicyId, status: int,
                     answer: dict[str, Any]) -> web.Response:
        """The change is stored; save the policy now (a database notification makes the leader
        save it too, which then finds the clusters done)."""
        try:
            report = await self._saver.save(policy_id)
        except DatabaseUnavailable as exc:
            answer["save"] = {"status": "failed", "error": f"database unavailable: {exc}"}
        else:
            answer["save"] = report_json(report)
        return web.json_response({"policy": policy_id, **answer}, status=status)
