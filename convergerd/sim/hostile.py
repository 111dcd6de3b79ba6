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
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Callable
from typing import Any

from aiohttp import web

from convergerd.sim.faults import Hostile

# What controlChars appends: NUL, BEL, an ANSI colour, CR LF, C1 CSI, RLO, a lone surrogate.
CONTROL = "\u0000\u0007\u001b[31m\r\nforged\u009b\u202e\ud800"
HOSTILE_KEY = "sim.stackship.se/hostile"
_PAD_CHUNK = 2**20
_TRICKLE_STEPS_PER_S = 10


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


async def answer(
    hostile: Hostile, request: web.BaseRequest, response: web.StreamResponse
) -> web.StreamResponse:
    """`response` as the hostile cluster sends it. Only complete answers with a body are
    changed (not watch streams, not a dropped connection)."""
    if not isinstance(response, web.Response) or not isinstance(response.body, bytes):
        return response
    body = response.body
    if hostile.mode == "oversized":
        return await _stream(request, response, lambda out: _pad(out, body, hostile.bytes))
    if hostile.mode == "trickle":
        return await _stream(request, response,
                             lambda out: _trickle(out, body, hostile.bytes_per_second))
    doc = _json_doc(response)
    if doc is None:
        return response
    rewrite: dict[str, Callable[[dict[str, Any]], bytes]] = {
        "controlChars": lambda d: _encode(control_chars(d)),
        "wrongTypes": lambda d: _encode(wrong_types(d, hostile.fields)),
        "invalidJson": _cut,
    }
    return _with_body(response, rewrite[hostile.mode](doc))


def _encode(doc: dict[str, Any]) -> bytes:
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
