"""The read-token endpoints (the admin token only, `scopes.Scope.ADMIN`): `POST /v1/tokens`
creates a boundary's read token and answers it once, `GET /v1/tokens` lists them (never the
tokens themselves), `DELETE /v1/tokens/{name}` revokes one. Who asked is what the body's `by`
says (the admin token is one shared secret), recorded with the database's time.

| operation | answer |
|---|---|
| created | 201 with `token` (shown this once) and the record |
| listed | 200, `tokens` by name (`?revoked=true`: the revoked ones too) |
| revoked | 200 with the record (`revoked_at`, `revoked_by`) |
| a bad name, field or expiry | 400 |
| no token of that name to revoke | 404 |
| the name is taken by a token not revoked, or too many tokens | 409 |
| the boundary does not exist | 422 |
| database unavailable | 503 |
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Protocol

from aiohttp import web

from convergerd.api.auth import TokenBook, asked_by
from convergerd.api.mutations import BadRequest, read_body, refusal_of
from convergerd.api.server import error_response
from convergerd.core.errors import ConvergerdError
from convergerd.core.model import RuleError
from convergerd.core.report import utc_now
from convergerd.core.shown import shown
from convergerd.core.tokens import (
    TokenRecord,
    check_boundary,
    check_token_name,
    new_token,
    parse_time,
    token_digest,
)
from convergerd.status.views import iso
from convergerd.store.tenants import MAX_LIVE_TOKENS, Refused

log = logging.getLogger(__name__)

_CREATE_FIELDS: Mapping[str, type] = {"boundary": str, "name": str, "expires_at": str,
                                      "by": str}
_REVOKE_FIELDS: Mapping[str, type] = {"by": str}


class TokenStore(Protocol):
    """The read tokens' rows (`convergerd.store.store.Store`)."""

    async def create_token(self, *, name: str, boundary: str, digest: bytes, by: str,
                           expires_at: Any) -> TokenRecord | Refused: ...
    async def tokens(self, *, revoked: bool = False) -> list[TokenRecord]: ...
    async def revoke_token(self, name: str, *, by: str) -> TokenRecord | None: ...


def token_view(record: TokenRecord) -> dict[str, Any]:
    """A token as the API shows it: everything but the token."""
    return {"name": record.name, "boundary": record.boundary,
            "created_by": record.created_by, "created_at": iso(record.created_at),
            "expires_at": iso(record.expires_at), "expired": record.expired(utc_now()),
            "revoked_by": record.revoked_by, "revoked_at": iso(record.revoked_at)}


def _no_store() -> web.Response:
    return error_response(503, "read tokens need the database", reason="database")


def _unavailable(exc: Exception) -> web.Response:
    return error_response(503, f"database unavailable: {exc}", reason="database")


_REFUSED = {
    Refused.UNKNOWN_BOUNDARY: (422, "unknown boundary {boundary!r}: create it first "
                                    "(convergerd import)"),
    Refused.NAME_TAKEN: (409, "a token named {name!r} exists: revoke it first, or choose "
                              "another name"),
    Refused.TOO_MANY: (409, f"{MAX_LIVE_TOKENS} tokens are live, the most kept: revoke some "
                            "first"),
}


class TokenHandlers:
    """The handlers, over `store`; `book` is read again after each change, so this replica
    takes it at once (the others on the table's notification)."""

    def __init__(self, store: TokenStore | None, book: TokenBook, *,
                 body_timeout_s: float) -> None:
        self._store = store
        self._book = book
        self._body_timeout_s = body_timeout_s

    async def _reload(self) -> None:
        try:
            await self._book.reload()
        except (ConvergerdError, OSError) as exc:  # it is read again soon anyway
            log.warning("read tokens changed, reading them again failed: %s", exc)

    async def create(self, request: web.Request) -> web.StreamResponse:
        if self._store is None:
            return _no_store()
        try:
            fields = await read_body(request, _CREATE_FIELDS, timeout_s=self._body_timeout_s)
            boundary = check_boundary(fields.get("boundary"))
            name = check_token_name(fields.get("name"))
            expires = (parse_time(fields["expires_at"], now=utc_now())
                       if "expires_at" in fields else None)
            by = asked_by(fields, request)
        except BadRequest as exc:
            return refusal_of(exc)
        except RuleError as exc:
            return error_response(400, f"body.{exc}")
        token = new_token()
        digest = token_digest(token)
        assert digest is not None  # one of ours
        try:
            made = await self._store.create_token(name=name, boundary=boundary, digest=digest,
                                                  by=by, expires_at=expires)
        except ConvergerdError as exc:
            return _unavailable(exc)
        if isinstance(made, Refused):
            status, message = _REFUSED[made]
            return error_response(status, message.format(boundary=boundary, name=name),
                                  reason=made.value)
        await self._reload()
        log.info("read token %s of boundary %s created by %s", name, boundary,
                 shown(by, style="text"))
        return web.json_response({"token": token, **token_view(made)}, status=201)

    async def list(self, request: web.Request) -> web.StreamResponse:
        if self._store is None:
            return _no_store()
        revoked = request.query.get("revoked", "false")
        if revoked not in ("true", "false"):
            return error_response(400, f"revoked: must be true or false, got "
                                       f"{shown(revoked, style='text')}", reason="query")
        try:
            found = await self._store.tokens(revoked=revoked == "true")
        except ConvergerdError as exc:
            return _unavailable(exc)
        return web.json_response({"tokens": [token_view(r) for r in found]})

    async def revoke(self, request: web.Request) -> web.StreamResponse:
        if self._store is None:
            return _no_store()
        raw = request.match_info["name"]
        try:
            name = check_token_name(raw)
            fields = await read_body(request, _REVOKE_FIELDS, timeout_s=self._body_timeout_s)
            by = asked_by(fields, request)
        except BadRequest as exc:
            return refusal_of(exc)
        except RuleError as exc:
            return error_response(400, str(exc), name=shown(raw, style="text"))
        try:
            revoked = await self._store.revoke_token(name, by=by)
        except ConvergerdError as exc:
            return _unavailable(exc)
        if revoked is None:
            return error_response(404, f"no live token named {name!r}", name=name)
        await self._reload()
        log.info("read token %s of boundary %s revoked by %s", name, revoked.boundary,
                 shown(by, style="text"))
        return web.json_response({"revoked": token_view(revoked)})
