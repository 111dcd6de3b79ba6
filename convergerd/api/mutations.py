"""The save and delete endpoints: `POST /v1/policies/{id}/apply`, `DELETE /v1/policies/{id}`.

Routed here by `convergerd.api.app`; the work is `convergerd.delivery.fanout.Saver`'s. Everything
in the request is checked before the database is touched: the admin token (`convergerd.api.auth`,
before the handler runs), the id (a DNS label of at most 50 characters), the body size, that the
body is a JSON object, and its fields and their types. A save's body may ask for a new
`enforcement` (Deny, Warn, Audit): it is stored first (a change is a new revision, `ModeStore`),
then saved like any other change. Answers:

| operation | answer |
|---|---|
| save done, every cluster reached | 200, `status: ok`, per-cluster results |
| save done, some clusters failed (recorded) | 200, `status: partial` |
| save of a policy that is invalid | 422 with the reason, nothing written |
| delete done everywhere, row deleted | 200, `status: ok` |
| delete not confirmed by every cluster | 409 naming them; the policy is kept, marked |
| save of a policy whose deletion has begun | 409 |
| no or a wrong bearer token | 401 (503 when no token is configured: the endpoints are off) |
| a boundary's read token | 403 |
| unknown policy | 404 |
| bad id, body or field | 400 (413 over 16 KiB, 408 when it does not arrive in time) |
| an `enforcement` that is not Deny, Warn or Audit | 400 naming the field and the value |
| database unavailable | 503 |
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Mapping
from typing import Any, Protocol

from aiohttp import StreamReader, web

from convergerd.api.server import error_response, policy_id_from_request
from convergerd.core.decode import bounded_json
from convergerd.core.errors import DatabaseUnavailable, NotJSON
from convergerd.core.model import Enforcement, PolicyId, RuleError, parse_enforcement
from convergerd.core.report import FanoutReport, FanoutStatus
from convergerd.core.shown import shown
from convergerd.delivery.fanout import Saver

MAX_BODY_BYTES = 16 * 1024
_SAVE_FIELDS: Mapping[str, type] = {"allow_mass_removal": bool, "enforcement": str}
_DELETE_FIELDS: Mapping[str, type] = {}


class ModeStore(Protocol):
    """Where a save's asked mode is stored (`convergerd.store.store.Store`)."""

    async def set_enforcement(self, policy_id: str, enforcement: Enforcement, /) -> None: ...


class BadRequest(Exception):
    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def check_fields(doc: Any, allowed: Mapping[str, type]) -> dict[str, Any]:
    """The body's fields, each known and of its type (pure)."""
    if not isinstance(doc, dict):
        raise BadRequest(f"body: expected a JSON object, got {type(doc).__name__}")
    unknown = sorted(str(k) for k in doc if k not in allowed)
    if unknown:
        known = ", ".join(allowed) or "none"
        raise BadRequest(f"body: unknown field(s) {', '.join(shown(k) for k in unknown)} "
                         f"(known: {known})")
    for key, kind in allowed.items():
        if key in doc and type(doc[key]) is not kind:
            raise BadRequest(f"body.{key}: expected {kind.__name__}, got {shown(doc[key])}")
    return dict(doc)


async def read_body(
    request: web.Request, allowed: Mapping[str, type], *, timeout_s: float
) -> dict[str, Any]:
    """The body's fields: read whole (however many segments it comes in) within `timeout_s`
    and `MAX_BODY_BYTES`, then `parse_body`."""
    return parse_body(await read_raw(request, timeout_s=timeout_s), allowed)


async def read_raw(request: web.Request, *, timeout_s: float) -> bytes:
    """The whole body, within `timeout_s` and `MAX_BODY_BYTES`, or `BadRequest` (408, 413,
    400) saying why not."""
    if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
        raise BadRequest(f"body: {request.content_length} bytes, at most {MAX_BODY_BYTES}", 413)
    try:
        async with asyncio.timeout(timeout_s):
            raw = await _read_capped(request.content)
    except TimeoutError:
        raise BadRequest(f"body: not received within {timeout_s:g} s "
                         "(CONVERGERD_HTTP_BODY_TIMEOUT_SECONDS)", 408) from None
    except ConnectionError:
        raise BadRequest("body: the client closed the connection before sending it all",
                         400) from None
    return raw


async def _read_capped(content: StreamReader) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while chunk := await content.read(MAX_BODY_BYTES + 1 - size):
        chunks.append(chunk)
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise BadRequest(f"body: more than {MAX_BODY_BYTES} bytes", 413)
    return b"".join(chunks)


def parse_body(raw: bytes, allowed: Mapping[str, type]) -> dict[str, Any]:
    """The fields of a whole body (pure): empty is none; otherwise a JSON object (read by
    `bounded_json`) of known fields of their types, or `BadRequest` (400) saying why not."""
    if not raw.strip():
        return {}
    try:
        doc = bounded_json(raw)
    except NotJSON as exc:
        raise BadRequest(f"body: {exc}") from None
    return check_fields(doc, allowed)


def refusal_of(exc: BadRequest) -> web.Response:
    response = error_response(exc.status, str(exc))
    if exc.status in (408, 413):  # the rest of the body may still be coming: no next request
        response.force_close()
    return response


def report_json(report: FanoutReport) -> dict[str, Any]:
    return {
        "operation": report.operation,
        "policy": report.policy,
        "status": report.status.value,
        "revision": report.revision,
        "clusters": [r.as_json() for r in report.results],
        "skipped_reason": report.skipped_reason,
    } | ({"rollout": report.rollout} if report.rollout is not None else {})


def asked_enforcement(fields: Mapping[str, Any]) -> Enforcement | None:
    """The mode a save's body asks for (None: none asked); `BadRequest` naming the field and
    the value when it is not one (pure)."""
    if "enforcement" not in fields:
        return None
    try:
        return parse_enforcement(fields["enforcement"])
    except RuleError as exc:
        raise BadRequest(f"body.{exc}") from None


def answer(report: FanoutReport, enforcement: Enforcement | None = None,
           **extra: Any) -> web.Response:
    """A save's or a deletion's answer: its status from the report's, `extra` in the body."""
    body = report_json(report) | extra
    if enforcement is not None:
        body["enforcement"] = enforcement.value
    if report.status in (FanoutStatus.OK, FanoutStatus.PARTIAL):
        return web.json_response(body)
    if report.status is FanoutStatus.NOT_FOUND:
        return _refusal(404, f"unknown policy {report.policy!r}", body)
    if report.status is FanoutStatus.INVALID:
        return _refusal(422, f"policy {report.policy!r} is invalid: {report.error}", body)
    if report.status is FanoutStatus.DELETING:
        return _refusal(409, f"policy {report.policy!r}: {report.error}", body)
    if not report.failed:
        return _refusal(409, f"policy {report.policy!r} not deleted: {report.error}; it is kept "
                        "(rounds no longer deliver it) and a retry finishes the deletion", body)
    holding = ", ".join(f"{r.cluster} ({r.reason}: {r.error})" for r in report.failed)
    return _refusal(
        409, f"policy {report.policy!r} not deleted: still held by {holding}; it is kept "
        "(rounds no longer deliver it) and a retry finishes the deletion; GET "
        f"/v1/policies/{report.policy}/status shows where it is still held", body)


def _refusal(status: int, message: str, body: dict[str, Any]) -> web.Response:
    return web.json_response({"error": message, **body}, status=status)


class SaveHandlers:
    """The save and delete handlers, over `saver`; a body must arrive within `body_timeout_s`
    (`HttpLimits.body_timeout_s`). The admin token was checked before (`auth.Guard`, by the
    routes' scope). A mode a save asks for is stored in `modes`; without it (an app over no
    database that takes one) such a save is refused with 503."""

    def __init__(self, saver: Saver, *, body_timeout_s: float,
                 modes: ModeStore | None = None) -> None:
        self._saver = saver
        self._body_timeout_s = body_timeout_s
        self._modes = modes

    async def _request(self, request: web.Request, allowed: Mapping[str, type]
                       ) -> tuple[PolicyId, dict[str, Any]] | web.Response:
        """The path's policy id and the body checked, in that order: the id and the fields,
        or the answer that refuses the request."""
        policy_id = policy_id_from_request(request)
        if isinstance(policy_id, web.Response):
            return policy_id
        try:
            fields = await read_body(request, allowed, timeout_s=self._body_timeout_s)
        except BadRequest as exc:
            return refusal_of(exc)
        return policy_id, fields

    async def apply(self, request: web.Request) -> web.StreamResponse:
        checked = await self._request(request, _SAVE_FIELDS)
        if isinstance(checked, web.Response):
            return checked
        policy_id, fields = checked
        allow = fields.get("allow_mass_removal", False)
        try:
            enforcement = asked_enforcement(fields)
        except BadRequest as exc:
            return refusal_of(exc)
        if enforcement is not None:
            if self._modes is None:
                return error_response(503, "this server cannot store a policy's enforcement")
            try:
                await self._modes.set_enforcement(policy_id, enforcement)
            except DatabaseUnavailable as exc:
                return error_response(503, f"database unavailable: {exc}", reason="database")
        return await _answered(self._saver.save(policy_id, allow_mass_removal=allow),
                               enforcement)

    async def delete(self, request: web.Request) -> web.StreamResponse:
        checked = await self._request(request, _DELETE_FIELDS)
        if isinstance(checked, web.Response):
            return checked
        return await _answered(self._saver.delete(checked[0]))


async def _answered(work: Awaitable[FanoutReport],
                    enforcement: Enforcement | None = None) -> web.Response:
    try:
        report = await work
    except DatabaseUnavailable as exc:
        return error_response(503, f"database unavailable: {exc}", reason="database")
    return answer(report, enforcement)
