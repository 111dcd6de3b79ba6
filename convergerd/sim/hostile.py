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
  15 MiB, under the daemon's 16 MiB cap): five million objects from 15 MB of JSON; with
  `shape` `bracketStrings`, `["["]`, ...: a list and a string holding a bracket each.
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

What only the in-cluster operator reads of its own cluster, broken so (every other answer is
served as it is):

- `hostileMetrics`: `/metrics` (the admission counters, `convergerd.sim.apimetrics`), by
  `shape`: `huge` (`bytes`, default 48 MiB, of other series around ours, as a big
  kube-apiserver has), `repeated` (each of our lines `count` times, default 100,000),
  `longLine` (one line of `bytes` before ours, starting as our counter does), `badValues`
  (every counter's value is `value`: `NaN` (default), `-1`, `1e308`, `+Inf`, `1.5`, `0x10`,
  `one`, `9007199254740993`), `manyPolicies` (`count` made-up `stackship-fake-N` policies
  before ours), `trickle` (sent at `bytesPerSecond`, default 10), `notText` (an HTML page, as
  a proxy's sign-in page), `restarts` (`process_start_time_seconds` is the time of the read:
  a restart at every read, the counters unchanged), `backwards` (every counter is far above
  what was counted and goes down at every read, the start time unchanged), `labelEscapes`
  (our lines again with escaped quotes, backslashes and line breaks, control characters and
  invalid UTF-8 in label values, and made-up policies whose names differ from ours only so).
- `hostileWarnings`: the `Warning` headers of every dry-run answer, by `shape`: `many` (the
  real ones, then `count` more, default 50, of `bytes` each, default 4096), `huge` (the real
  ones, then `count` of `bytes` each past what a client reads in one header), `malformed`
  (the real ones, then `count` that are not `299 - "text"`), `controlChars`, `rawControls`
  and `invalidUtf8` (the real ones with a C1 CSI, bidi controls and a tab; an ANSI escape,
  NUL, BEL and DEL, which an HTTP parser refuses; or bytes that are not UTF-8, in their text:
  sent as raw bytes, as aiohttp refuses to).
"""

from __future__ import annotations

import asyncio
import copy
import functools
import json
import re
import secrets
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

from convergerd.sim.apimetrics import CHECK_TOTAL
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
    if hostile.mode in ("hostileMetrics", "hostileWarnings"):
        return await _operator_read(hostile, request, response, body)
    streamed: dict[str, Callable[[web.StreamResponse], Any]] = {
        "oversized": lambda out: _pad(out, body, hostile.size),
        "trickle": lambda out: _trickle(out, body, hostile.bytes_per_second),
    }
    if hostile.mode in streamed:
        return await _stream(request, response, streamed[hostile.mode])
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
        "amplification": lambda d: (amplified(d, hostile.size, hostile.chosen_shape)
                                    if _list_kind(d) else None),
        "deepNesting": lambda d: nested(d, hostile.depth),
        "endlessContinue": lambda d: _encode(endless(d)) if _list_kind(d) else None,
        "overLimit": lambda d: (over_limit(d, int(limit) if limit.isdigit() else 0,
                                           hostile.factor) if _list_kind(d) else None),
        "wrongList": lambda d: (_encode(wrong_list(d, hostile.chosen_shape))
                                if _list_kind(d) else None),
        "hugeVersion": lambda d: (huge_version(d, hostile.size, hostile.field)
                                  if isinstance(d.get("gitVersion"), str) else None),
        "hugeValues": lambda d: _encode(huge_values(d, hostile.size, hostile.chosen_fields)),
    }
    new = rewrite[hostile.mode](doc) if hostile.mode in rewrite else None
    return response if new is None else _with_body(response, new)


# What each amplification shape fills `items` with.
_AMPLIFYING_ITEMS = {"objects": b"{}", "bracketStrings": b'["["]'}


def amplified(doc: dict[str, Any], total: int, shape: str = "objects") -> bytes:
    """`doc` with `items` as many copies of the shape's item (`{}`, or `["["]`) as fit in
    `total` bytes (at least one)."""
    item = _AMPLIFYING_ITEMS[shape]
    head, _, tail = _encode({**doc, "items": []}).partition(_ITEMS)
    count = max(1, (total - len(head) - len(tail) - len(_ITEMS)) // (len(item) + 1))
    return b"".join((head, b'"items":[', (item + b",") * (count - 1), item + b"]", tail))


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


# -- hostileMetrics -------------------------------------------------------------------------

_VALUE = re.compile(rb"^(" + CHECK_TOTAL.encode() + rb"\{[^\n]*\}) (\S+)$", re.M)
_START_VALUE = re.compile(rb"^process_start_time_seconds (\S+)$", re.M)
_BACKWARDS_FROM = 2**52  # backwards: counters start here and fall by one a microsecond
_HTML = (b"<!DOCTYPE html>\n<html><head><title>Sign in</title></head>\n<body><form method=post>"
         b"<input name=user><input name=password type=password></form></body></html>\n")


def _ours(body: bytes) -> list[bytes]:
    """Our counter's lines of an exposition (`convergerd.sim.apimetrics`), with newlines."""
    return [m.group(0) + b"\n" for m in _VALUE.finditer(body)]


@functools.cache
def _filler_block() -> bytes:
    """About 1 MiB of other series, as a kube-apiserver exports hundreds of them."""
    lines = [b"# HELP apiserver_request_duration_seconds [STABLE] Response latency.",
             b"# TYPE apiserver_request_duration_seconds histogram"]
    n = 0
    while sum(map(len, lines)) < 2**20:
        lines.append(b'apiserver_request_duration_seconds_bucket{component="apiserver",'
                     b'group="",resource="pods",scope="namespace",verb="LIST",version="v1",'
                     b'le="%d"} %d' % (n % 40, n * 7))
        n += 1
    return b"\n".join(lines) + b"\n"


async def _filler(out: web.StreamResponse, total: int) -> None:
    block = _filler_block()
    while total > 0:
        await out.write(block[:total])
        total -= len(block)


async def _lines(out: web.StreamResponse, lines: list[bytes], count: int) -> None:
    """`lines`, each `count` times, in writes of about 1 MiB."""
    unit = b"".join(lines)
    per = max(1, 2**20 // max(1, len(unit)))
    left = count
    while left > 0:
        await out.write(unit * min(per, left))
        left -= per


def _values(body: bytes, value: Callable[[bytes], bytes]) -> bytes:
    return _VALUE.sub(lambda m: m.group(1) + b" " + value(m.group(2)), body)


# labelEscapes: what follows our policy's name in a made-up policy's label (escaped quote,
# line break and backslash; invalid UTF-8; an ANSI escape; NUL), and a value with our label
# inside it.
_TWINS = (rb"\"", rb"\n", rb"\\", b"\xc3\x28", b"\x1b[0m", b"\x00", b"\xff")
_POLICY_LABEL = re.compile(rb'policy="([^"\\]*)"')


def _escaped_lines(body: bytes) -> bytes:
    """`body` after lines of made-up policies named like ours but not ours (module
    docstring), each counting a million."""
    out: list[bytes] = []
    for match in _VALUE.finditer(body):
        labels = match.group(1)
        out.extend(_POLICY_LABEL.sub(lambda m, t=twin: b'policy="' + m.group(1) + t + b'"',
                                     labels, count=1) + b" 1e+06\n" for twin in _TWINS)
        out.append(_POLICY_LABEL.sub(lambda m: b'policy="x\\",policy=\\"' + m.group(1) + b'"',
                                     labels, count=1) + b" 1e+06\n")
    return b"".join(out) + body


async def _operator_read(hostile: Hostile, request: web.BaseRequest, response: web.Response,
                         body: bytes) -> web.StreamResponse:
    """hostileMetrics and hostileWarnings: only `/metrics` and dry-run answers are changed."""
    if hostile.mode == "hostileWarnings":
        return (warnings_answer(hostile, response) if request.query.get("dryRun") == "All"
                else response)
    if not request.path.endswith("/metrics") or response.status != 200:
        return response
    return await metrics_answer(hostile, request, response, body)


async def metrics_answer(hostile: Hostile, request: web.BaseRequest, response: web.Response,
                         body: bytes) -> web.StreamResponse:
    """The `/metrics` answer `body` broken as `hostile.chosen_shape` says (module docstring)."""
    shape, size, count = hostile.chosen_shape, hostile.size, hostile.times
    streamed: dict[str, Callable[[web.StreamResponse], Any]] = {
        "huge": lambda out: _huge(out, body, size),
        "repeated": lambda out: _repeated(out, body, count),
        "longLine": lambda out: _long_line(out, body, size),
        "manyPolicies": lambda out: _many_policies(out, body, count),
        "trickle": lambda out: _trickle(out, body, hostile.bytes_per_second),
    }
    if shape in streamed:
        return await _stream(request, response, streamed[shape])
    if shape == "notText":
        headers = {k: v for k, v in response.headers.items()
                   if k.lower() not in ("content-length", "content-type")}
        return web.Response(body=_HTML, status=200, headers={
            **headers, "Content-Type": "text/html; charset=utf-8"})
    fall = int(time.time() * 1_000_000) % _BACKWARDS_FROM
    rewrite: dict[str, Callable[[], bytes]] = {
        "badValues": lambda: _values(body, lambda _: hostile.value.encode()),
        "restarts": lambda: _START_VALUE.sub(
            b"process_start_time_seconds %.3f" % time.time(), body),
        "backwards": lambda: _values(
            body, lambda v: b"%d" % (_BACKWARDS_FROM + int(float(v)) - fall)),
        "labelEscapes": lambda: _escaped_lines(body),
    }
    return _with_body(response, rewrite[shape]())


async def _huge(out: web.StreamResponse, body: bytes, size: int) -> None:
    await _filler(out, size // 2)
    await out.write(body)
    await _filler(out, size - size // 2)


async def _long_line(out: web.StreamResponse, body: bytes, size: int) -> None:
    await out.write(CHECK_TOTAL.encode() + b'{policy="stackship-')
    await _xs(out, size)
    await out.write(b'"} 1\n' + body)


async def _many_policies(out: web.StreamResponse, body: bytes, count: int) -> None:
    for start in range(0, count, 5000):
        await out.write(b"".join(
            b'%s{enforcement_action="deny",error_type="no_error",policy="stackship-fake-%07d",'
            b'policy_binding="stackship-fake-%07d"} 1\n' % (CHECK_TOTAL.encode(), n, n)
            for n in range(start, min(count, start + 5000))))
    await out.write(body)


async def _xs(out: web.StreamResponse, total: int) -> None:
    chunk = b"x" * _PAD_CHUNK
    while total > 0:
        await out.write(chunk[:total])
        total -= _PAD_CHUNK


async def _repeated(out: web.StreamResponse, body: bytes, count: int) -> None:
    start = [m.group(0) + b"\n" for m in _START_VALUE.finditer(body)]
    await _lines(out, _ours(body) or start, count)
    await out.write(body)


# -- hostileWarnings ------------------------------------------------------------------------

# What controlChars, rawControls and invalidUtf8 put in a warning's text (raw bytes on the
# wire): a C1 CSI, bidi overrides and a tab (what an HTTP parser passes on); an ANSI escape,
# NUL, BEL and DEL (what it refuses: the whole answer is unreadable); bytes that are not UTF-8.
WARNING_BYTES = {
    "controlChars": b"\xc2\x9b31m\xe2\x80\xae\xe2\x81\xa6\t",
    "rawControls": b"\x1b[31m\x00\x07\x7f",
    "invalidUtf8": b"\xff\xfe\xc3\x28\xed\xa0\x80",
}
_MALFORMED = ("299 - unquoted text", "299", '"only text"', "abc def", '299 - "unterminated',
              '199 - "not code 299"', '299 - "' + "\\" * 100 + '"', "299 -", ",,,,",
              '299 - "a" "not a date" trailing')


def warnings_answer(hostile: Hostile, response: web.Response) -> web.Response:
    """A dry-run answer with its `Warning` headers broken as `hostile.chosen_shape` says."""
    real = response.headers.getall("Warning", [])
    headers = [(k, v) for k, v in response.headers.items()
               if k.lower() not in ("content-length", "warning")]
    shape = hostile.chosen_shape
    if shape in WARNING_BYTES:
        extra = WARNING_BYTES[shape]
        raw = [_inserted(w.encode(), extra) for w in real] or [b'299 - "' + extra + b'"']
        return _RawWarnings(raw, body=response.body, status=response.status, headers=headers)
    added = (_MALFORMED[n % len(_MALFORMED)] if shape == "malformed"
             else f'299 - "{n}:{"w" * hostile.size}"' for n in range(hostile.times))
    out = web.Response(body=response.body, status=response.status, headers=headers)
    for value in (*real, *added):
        out.headers.add("Warning", value)
    return out


def _inserted(warning: bytes, extra: bytes) -> bytes:
    """`extra` in a `299 - "text"` warning's text, after its first 60 bytes (the prefix the
    operator matches stays whole) and at its end."""
    head, quote, tail = warning.partition(b' "')
    if not quote:
        return warning + extra
    text = tail[:-1] if tail.endswith(b'"') else tail
    cut = min(len(text), 60 + text[60:].find(b": ") + 2) if b": " in text[60:] else len(text)
    return head + quote + text[:cut] + extra + text[cut:] + extra + b'"'


class _RawWarnings(web.Response):
    """An answer whose `Warning` headers are raw bytes aiohttp would refuse to send (control
    characters, invalid UTF-8): added to the header block once aiohttp has built it."""

    def __init__(self, raw: list[bytes], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._raw = b"".join(b"Warning: " + w + b"\r\n" for w in raw)

    async def _write_headers(self) -> None:
        await super()._write_headers()
        writer = self._payload_writer
        block = getattr(writer, "_headers_buf", None)
        if not isinstance(block, bytes) or not block.endswith(b"\r\n\r\n"):
            raise RuntimeError("aiohttp's header block is not where hostileWarnings expects it")
        writer._headers_buf = block[:-2] + self._raw + b"\r\n"  # type: ignore[union-attr]
