"""Fault `hostile`: a cluster that answers, but with bytes no well-behaved apiserver sends.

What a client must survive, applied to a cluster's answers after the handler built them (watch
streams are left alone). The modes, as the admin API and the config file spell them:

- `controlChars`: NUL, other C0/C1 controls, an ANSI escape, a line break, a bidi override and
  a lone surrogate appended to strings: each Policy's `status.phase` and Ready condition
  (added when the object has no status), an annotation and a label on every object, a Status
  error body's `message` and `reason`, `/version`'s `gitVersion`.
- `wrongTypes`: the fields named in `fields` (default: all but `items`) get a JSON type the
  API never sends there: `status.phase` an object, `status.conditions` a string,
  `metadata.labels` a list, `metadata.generation` a string, `spec` a list, `items` gains a
  number and a string (the list as a whole unusable), a Status `message` an object,
  `gitVersion` a number.
- `invalidJson`: every JSON answer cut in half (no longer JSON).
- `oversized`: every answer padded with spaces to `bytes` (default 32 MiB, above the daemon's
  16 MiB cap), sent chunked without a Content-Length, so a client learns the size only by
  reading.
- `trickle`: every answer sent at `bytesPerSecond` (default 10).

What an attacker who owns a cluster's apiserver (or the path to it) tries next:

- `amplification`: a list answer's `items` become `{}`, `{}`, ... up to `bytes` (default
  15 MiB, under the daemon's 16 MiB cap): five million objects from 15 MB of JSON.
- `deepNesting`: every JSON answer gains a value nested `depth` arrays deep (default 100,000;
  two bytes a level, so far under the cap).
- `endlessContinue`: every list page carries a fresh `metadata.continue`, forever (the tokens
  it handed out are served as the first page again).
- `overLimit`: a list page carries `factor` (default 10) times the `limit` the client sent
  (the real items, then renamed copies of the first, or of a bare object of the list's kind).
- `redirect`: every request is answered with a `status` redirect (301, 302, 303, 307
  (default), 308), without being served: to the same path of another cluster behind the same
  front (`cluster`, default `home`), or to `location` (an http:// or https:// URL) followed by
  the request's path and query.
- `wrongObject`: an apply (any PATCH of a named object) is not stored but answered 200 with
  the applied object changed: `change` `kind` (a Lease), `name` (suffixed) or `revision`
  (`spec.revision` plus one, the default).
- `wrongList`: list answers of the wrong shape: `shape` `noItems` (no `items` at all, the
  default) or `otherKind` (`kind: LeaseList`, every item a Lease).
- `hugeVersion`: `/version` padded to `bytes` (default 15 MiB): in `gitVersion` as a build
  suffix (`field: gitVersion`, the default) or in a field of its own (`field: extra`).
- `hugeHeaders`: every answer carries `bytes` (default 1 MiB) of response headers, in headers
  of `headerBytes` (default 4096) each.
- `hugeValues`: every object carries values of `bytes` (default 1 MiB) in the `fields` named
  (default all): a label and an annotation, a Lease's `spec.holderIdentity`, a Policy's
  Ready condition message.
"""

from __future__ import annotations

import asyncio
import copy
import json
import secrets
from collections.abc import Callable
from typing import Any

from aiohttp import web

from convergerd.sim.faults import Hostile

# What controlChars appends: NUL, BEL, an ANSI colour, CR LF, C1 CSI, RLO, a lone surrogate.
CONTROL = "\u0000\u0007\u001b[31m\r\nforged\u009b\u202e\ud800"
HOSTILE_KEY = "sim.stackship.se/hostile"
_PAD_CHUNK = 2**20
_TRICKLE_STEPS_PER_S = 10
# endlessContinue's tokens start so; one of them in a request is served as the first page.
CONTINUE_PREFIX = "hostile-"
NESTED_KEY = "sim.stackship.se/nested"
_NAME_MARK = "sim.stackship.se/hostile-name"  # where overLimit puts each copy's name
_ITEMS = b'"items":[]'
_LEASE_API = "coordination.k8s.io/v1"
_CLUSTER_PREFIX = "/clusters/"


def _policy(obj: dict[str, Any]) -> bool:
    return obj.get("kind") == "Policy"


def _objects(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The objects an answer carries: a list's items, or the answer itself."""
    items = doc.get("items")
    if isinstance(items, list):
        return [i for i in items if isinstance(i, dict)]
    return [doc] if isinstance(doc.get("metadata"), dict) else []


def _list_kind(doc: dict[str, Any]) -> bool:
    return isinstance(doc.get("items"), list)


def _status(doc: dict[str, Any]) -> bool:
    return doc.get("kind") == "Status"


def control_chars(doc: dict[str, Any]) -> dict[str, Any]:
    """A copy of `doc` with `CONTROL` in its strings (see the module docstring)."""
    doc = copy.deepcopy(doc)
    if _status(doc):
        for key in ("message", "reason"):
            if isinstance(doc.get(key), str):
                doc[key] += CONTROL
        return doc
    if isinstance(doc.get("gitVersion"), str):
        doc["gitVersion"] += CONTROL
    for obj in _objects(doc):
        meta = obj["metadata"]
        meta.setdefault("annotations", {})[HOSTILE_KEY] = "note" + CONTROL
        meta.setdefault("labels", {})[HOSTILE_KEY] = "x" + CONTROL
        if _policy(obj):
            status = obj.setdefault("status", {})
            status["phase"] = str(status.get("phase") or "Ready") + CONTROL
            conditions = status.get("conditions")
            if not isinstance(conditions, list) or not conditions:
                conditions = status["conditions"] = [
                    {"type": "Ready", "status": "True", "reason": "Reconciled", "message": "ok"}]
            for condition in conditions:
                if isinstance(condition, dict):
                    for key in ("reason", "message"):
                        condition[key] = str(condition.get(key, "")) + CONTROL
    return doc


def _wrong_object(obj: dict[str, Any], fields: frozenset[str]) -> None:
    meta = obj["metadata"]
    if "metadata.labels" in fields:
        meta["labels"] = [f"{k}={v}" for k, v in (meta.get("labels") or {}).items()]
    if "metadata.generation" in fields:
        meta["generation"] = str(meta.get("generation", 1))
    if "spec" in fields:
        obj["spec"] = ["not", "an", "object"]
    if not _policy(obj):
        return
    status = obj.setdefault("status", {})
    if "status.phase" in fields:
        status["phase"] = {"nested": "object"}
    if "status.conditions" in fields:
        status["conditions"] = "Ready"


def wrong_types(doc: dict[str, Any], fields: frozenset[str]) -> dict[str, Any]:
    """A copy of `doc` with the named fields of the wrong JSON type."""
    doc = copy.deepcopy(doc)
    if _status(doc):
        if "message" in fields:
            doc["message"] = {"not": "a string"}
        return doc
    if "gitVersion" in fields and "gitVersion" in doc:
        doc["gitVersion"] = 132
    for obj in _objects(doc):
        _wrong_object(obj, fields)
    if "items" in fields and _list_kind(doc):
        doc["items"].extend([42, "not an object"])
    return doc


def _json_doc(response: web.Response) -> dict[str, Any] | None:
    if response.content_type != "application/json" or not isinstance(response.body, bytes):
        return None
    try:
        doc = json.loads(response.body)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def _with_body(response: web.Response, body: bytes) -> web.Response:
    headers = {k: v for k, v in response.headers.items() if k.lower() != "content-length"}
    return web.Response(body=body, status=response.status, headers=headers)


async def _stream(request: web.BaseRequest, response: web.Response,
                  chunks: Callable[[web.StreamResponse], Any]) -> web.StreamResponse:
    headers = {k: v for k, v in response.headers.items() if k.lower() != "content-length"}
    out = web.StreamResponse(status=response.status, headers=headers)
    out.enable_chunked_encoding()
    await out.prepare(request)
    try:
        await chunks(out)
        await out.write_eof()
    except ConnectionError:
        pass  # the client stopped reading (what a capped client does): nothing to finish
    return out


def _cut(doc: dict[str, Any]) -> bytes:
    body = _encode(doc)
    return body[: len(body) // 2]


def served_request(hostile: Hostile, request: web.BaseRequest) -> web.BaseRequest:
    """The request the cluster serves: under `endlessContinue`, one carrying a token it made
    up is served as the first page (the store would refuse the token)."""
    token = request.query.get("continue", "")
    if hostile.mode != "endlessContinue" or not token.startswith(CONTINUE_PREFIX):
        return request
    query = request.url.query.copy()
    del query["continue"]
    return request.clone(rel_url=request.rel_url.with_query(query))


async def intercept(hostile: Hostile, request: web.BaseRequest, rel_qs: str,
                    named_object: bool) -> web.Response | None:
    """The answer sent instead of serving the request (`redirect`, `wrongObject` on a PATCH),
    or None: the request is served and `answer` rewrites what the chain built. `rel_qs` is the
    path below the cluster's prefix, with its query."""
    if hostile.mode == "redirect":
        target = (hostile.location + request.path_qs if hostile.location is not None
                  else f"{_CLUSTER_PREFIX}{hostile.redirect_cluster}{rel_qs}")
        return web.Response(status=hostile.status, headers={"Location": target})
    if hostile.mode == "wrongObject" and request.method == "PATCH" and named_object:
        try:
            applied = json.loads(await request.read())
        except ValueError:
            return None  # YAML, or no object: served as it is
        if isinstance(applied, dict) and isinstance(applied.get("metadata"), dict):
            return web.Response(body=_encode(wrong_object(applied, hostile.change)),
                                headers={"Content-Type": "application/json"})
    return None


def wrong_object(applied: dict[str, Any], change: str) -> dict[str, Any]:
    """An answer to the apply of `applied` that is another object (see the module docstring),
    with the fields a stored object has."""
    obj = copy.deepcopy(applied)
    meta = obj["metadata"]
    meta.update(uid="00000000-0000-4000-8000-000000000000", resourceVersion="1", generation=1,
                creationTimestamp="2026-01-01T00:00:00Z")
    if change == "kind":
        obj.update(apiVersion=_LEASE_API, kind="Lease")
    elif change == "name":
        meta["name"] = f"{meta.get('name', '')}-other"
    else:
        spec = obj.get("spec")
        if isinstance(spec, dict):
            revision = spec.get("revision")
            spec["revision"] = revision + 1 if isinstance(revision, int) else 1
    return obj


async def answer(
    hostile: Hostile, request: web.BaseRequest, response: web.StreamResponse
) -> web.StreamResponse:
    """`response` as the hostile cluster sends it. Only complete answers with a body are
    changed (not watch streams, not a dropped connection)."""
    if not isinstance(response, web.Response) or not isinstance(response.body, bytes):
        return response
    body = response.body
    if hostile.mode == "oversized":
        return await _stream(request, response, lambda out: _pad(out, body, hostile.size))
    if hostile.mode == "trickle":
        return await _stream(request, response,
                             lambda out: _trickle(out, body, hostile.bytes_per_second))
    if hostile.mode == "hugeHeaders":
        return _with_headers(response, huge_headers(hostile.size, hostile.header_bytes))
    doc = _json_doc(response)
    if doc is None:
        return response
    limit = request.query.get("limit", "")
    rewrite: dict[str, Callable[[dict[str, Any]], bytes | None]] = {
        "controlChars": lambda d: _encode(control_chars(d)),
        "wrongTypes": lambda d: _encode(wrong_types(d, hostile.chosen_fields)),
        "invalidJson": _cut,
        "amplification": lambda d: amplified(d, hostile.size) if _list_kind(d) else None,
        "deepNesting": lambda d: nested(d, hostile.depth),
        "endlessContinue": lambda d: _encode(endless(d)) if _list_kind(d) else None,
        "overLimit": lambda d: (over_limit(d, int(limit) if limit.isdigit() else 0,
                                           hostile.factor) if _list_kind(d) else None),
        "wrongList": lambda d: _encode(wrong_list(d, hostile.shape)) if _list_kind(d) else None,
        "hugeVersion": lambda d: (huge_version(d, hostile.size, hostile.field)
                                  if isinstance(d.get("gitVersion"), str) else None),
        "hugeValues": lambda d: _encode(huge_values(d, hostile.size, hostile.chosen_fields)),
    }
    new = rewrite[hostile.mode](doc) if hostile.mode in rewrite else None
    return response if new is None else _with_body(response, new)


def amplified(doc: dict[str, Any], total: int) -> bytes:
    """`doc` with `items` as many `{}` as fit in `total` bytes (at least one)."""
    head, _, tail = _encode({**doc, "items": []}).partition(_ITEMS)
    count = max(1, (total - len(head) - len(tail) - len(_ITEMS)) // 3)
    return b"".join((head, b'"items":[', b"{}," * (count - 1), b"{}]", tail))


def nested(doc: dict[str, Any], depth: int) -> bytes:
    """`doc` with one more key whose value is `depth` arrays, one inside the other."""
    value = b"[" * depth + b"]" * depth
    body = _encode({k: v for k, v in doc.items() if k != NESTED_KEY})
    sep = b"" if body == b"{}" else b","
    return b"".join((body[:-1], sep, json.dumps(NESTED_KEY).encode(), b":", value, b"}"))


def endless(doc: dict[str, Any]) -> dict[str, Any]:
    """A copy of the list `doc` that says there is always another page."""
    doc = copy.deepcopy(doc)
    meta = doc.get("metadata")
    if not isinstance(meta, dict):
        meta = doc["metadata"] = {}
    meta["continue"] = CONTINUE_PREFIX + secrets.token_urlsafe(12)
    meta.pop("remainingItemCount", None)
    return doc


def over_limit(doc: dict[str, Any], limit: int, factor: int) -> bytes:
    """The list `doc` with `factor` x `limit` items (x 1 without a limit), encoded. Built as
    bytes: tens of thousands of copies must not hold the simulator's loop (every cluster of
    the fleet answers on it)."""
    items: list[Any] = doc["items"]
    template = copy.deepcopy(next((i for i in items if isinstance(i, dict)), None)
                             or _bare_item(doc))
    meta = template.setdefault("metadata", {})
    base = str(meta.get("name") or "object")
    meta["name"] = _NAME_MARK
    meta.pop("uid", None)
    before, _, after = _encode(template).partition(json.dumps(_NAME_MARK).encode())
    extra = [before + json.dumps(f"{base}-hostile-{n}").encode() + after
             for n in range(len(items), max(limit, 1) * factor)]
    head, _, tail = _encode({**doc, "items": []}).partition(_ITEMS)
    real = _encode(items)[1:-1]
    return b"".join((head, b'"items":[', b",".join([real, *extra] if real else extra), b"]",
                     tail))


def _bare_item(doc: dict[str, Any]) -> dict[str, Any]:
    kind = str(doc.get("kind") or "List").removesuffix("List") or "Object"
    return {"apiVersion": doc.get("apiVersion", "v1"), "kind": kind, "metadata": {}}


def wrong_list(doc: dict[str, Any], shape: str) -> dict[str, Any]:
    """A copy of the list `doc` without `items`, or as a LeaseList of Leases."""
    doc = copy.deepcopy(doc)
    if shape == "noItems":
        del doc["items"]
        return doc
    doc.update(apiVersion=_LEASE_API, kind="LeaseList")
    for item in _objects(doc):
        item.update(apiVersion=_LEASE_API, kind="Lease")
    return doc


def huge_version(doc: dict[str, Any], total: int, field: str) -> bytes:
    """`/version` padded to about `total` bytes: `gitVersion` gains a build suffix of that
    length, or a field of its own holds it."""
    doc = dict(doc)
    pad = max(0, total - len(_encode(doc)) - 32)
    if field == "gitVersion":
        doc["gitVersion"] = f"{doc['gitVersion']}+{'x' * pad}"
    else:
        doc["extra"] = "x" * pad
    return _encode(doc)


def huge_headers(total: int, each: int) -> dict[str, str]:
    """Response headers of `total` bytes of values, `each` bytes per header."""
    count = max(1, -(-total // each))
    return {f"X-Hostile-{n}": "x" * min(each, total - n * each) or "x" for n in range(count)}


def _with_headers(response: web.Response, extra: dict[str, str]) -> web.Response:
    headers = {k: v for k, v in response.headers.items() if k.lower() != "content-length"}
    headers.update(extra)
    return web.Response(body=response.body, status=response.status, headers=headers)


def huge_values(doc: dict[str, Any], size: int, fields: frozenset[str]) -> dict[str, Any]:
    """A copy of `doc` with values of `size` bytes in the named fields of every object."""
    doc = copy.deepcopy(doc)
    value = "x" * size
    for obj in _objects(doc):
        meta = obj["metadata"]
        if "metadata.labels" in fields:
            meta.setdefault("labels", {})[HOSTILE_KEY] = value
        if "metadata.annotations" in fields:
            meta.setdefault("annotations", {})[HOSTILE_KEY] = value
        spec = obj.get("spec")
        if "spec.holderIdentity" in fields and obj.get("kind") == "Lease" and isinstance(
                spec, dict):
            spec["holderIdentity"] = value
        if "status.conditions" in fields and _policy(obj):
            status = obj.setdefault("status", {})
            status["conditions"] = [{"type": "Ready", "status": "True",
                                     "reason": "Reconciled", "message": value}]
    return doc


def _encode(doc: Any) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


async def _pad(out: web.StreamResponse, body: bytes, total: int) -> None:
    await out.write(body)
    left = total - len(body)
    spaces = b" " * _PAD_CHUNK
    while left > 0:
        await out.write(spaces[:left])
        left -= _PAD_CHUNK


async def _trickle(out: web.StreamResponse, body: bytes, per_second: int) -> None:
    step = max(1, per_second // _TRICKLE_STEPS_PER_S)
    for start in range(0, len(body), step):
        await out.write(body[start : start + step])
        await asyncio.sleep(step / per_second)
