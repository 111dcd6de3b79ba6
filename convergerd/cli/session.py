"""`policy eval`'s access to a cluster, and its session file: record the API exchanges of a
live evaluation, replay them with no cluster.

The evaluation reads a cluster through one small Protocol, `Transport` (one GET of a path
with a query, answered with a status and a JSON body). Three implementations:

- `LiveTransport`: the project's own `ClusterClient` (bounded reads, classified errors);
- `Recorder`: wraps another transport and keeps every exchange (`managedFields` dropped);
- `Replayer`: answers from a loaded `Session`, strictly in order, each request checked
  against the recorded one (method, path and query); the first difference, a session that
  ends early, or exchanges left over are a `SessionError` naming what differs. It never
  opens a connection.

The session file (`EvalSession`, documented in docs/design.md) is YAML, written atomically
(temporary file in the same directory, then rename) with mode 0600 (it holds the cluster's
objects), and loaded like every file a person hands over: `files.read_bounded` (at most
`MAX_SESSION_BYTES`), `store.yamlfile.load_yaml`, then `decode_session`, which checks every
field and names the first bad one with its value.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

import orjson
import yaml

from convergerd.core.decode import bounded_json
from convergerd.core.errors import BadFile, ClusterApiError, ConvergerdError, NotJSON
from convergerd.core.shown import shown
from convergerd.files import read_bounded
from convergerd.kube.client import ClusterClient
from convergerd.store.yamlfile import load_yaml

API_VERSION = "convergerd.stackship.se/v1alpha1"
KIND = "EvalSession"
# A session holds the objects of a boundary's namespaces: a few MiB for thousands of pods.
MAX_SESSION_BYTES = 64 * 1024 * 1024
MAX_EXCHANGES = 100_000
MAX_PATH_CHARS = 8192
_FIELDS = frozenset({"apiVersion", "kind", "policy", "context", "recordedAt", "pageSize",
                     "exchanges"})
_POLICY_FIELDS = frozenset({"id", "revision", "specSha256"})
_HEADER = f"""\
# A `convergerd policy eval --record` session ({KIND}, {API_VERSION}): every API request the
# evaluation made, in order, with the cluster's answer: its status and its JSON body
# (managedFields dropped).
# `convergerd policy eval --policy FILE --replay THIS-FILE` repeats the evaluation from it,
# with no cluster; a request that differs from the recorded one is an error (exit 2).
# It holds the objects of the boundary's namespaces: keep it as private as the cluster.
"""


class SessionError(ConvergerdError):
    """A session file that cannot be used, or that does not match the evaluation's
    requests; the message names the file and what differs."""


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Exchange:
    method: str
    path: str  # with the query, as `request_path` builds it
    status: int
    body: dict[str, Any]


@dataclass(frozen=True, slots=True)
class PolicyRef:
    """Which policy a session was recorded for: another policy is detected by the hash."""

    id: str
    revision: int
    spec_sha256: str

    def __str__(self) -> str:
        return f"policy {shown(self.id)} revision {self.revision} (spec sha256 " \
               f"{self.spec_sha256[:12]}...)"


@dataclass(frozen=True, slots=True)
class Session:
    policy: PolicyRef
    context: str
    recorded_at: str
    page_size: int
    exchanges: tuple[Exchange, ...] = field(default=())


class Transport(Protocol):
    """What the live evaluation asks a cluster: one GET. A 2xx or a 404 is answered; any
    other failure raises a `ClusterError`."""

    async def get(self, path: str, query: Mapping[str, str]) -> Response: ...


def request_path(path: str, query: Mapping[str, str]) -> str:
    """`path?query`, the query in the order given (the evaluation's order is fixed)."""
    return f"{path}?{urllib.parse.urlencode(list(query.items()))}" if query else path


def policy_ref(spec: Mapping[str, Any]) -> PolicyRef:
    """The policy's id, revision and the SHA-256 of its spec as canonical JSON."""
    canonical = json.dumps(spec, sort_keys=True, separators=(",", ":"), default=str)
    revision = spec.get("revision")
    return PolicyRef(str(spec.get("policyId")),
                     revision if isinstance(revision, int) and not isinstance(revision, bool)
                     else 0,
                     hashlib.sha256(canonical.encode()).hexdigest())


def without_managed_fields(body: Mapping[str, Any]) -> dict[str, Any]:
    """The answer as recorded: `metadata.managedFields` dropped from it and from its items
    (server-side apply bookkeeping, large, and no input to a policy)."""

    def strip(obj: Mapping[str, Any]) -> dict[str, Any]:
        meta = obj.get("metadata")
        if isinstance(meta, Mapping) and "managedFields" in meta:
            return dict(obj) | {"metadata": {k: v for k, v in meta.items()
                                             if k != "managedFields"}}
        return dict(obj)

    out = strip(body)
    items = out.get("items")
    if isinstance(items, list):
        out["items"] = [strip(i) if isinstance(i, Mapping) else i for i in items]
    return out


# --- the transports ----------------------------------------------------------------------------


class LiveTransport:
    """GETs over a `ClusterClient` (owned by the caller)."""

    def __init__(self, client: ClusterClient, *, timeout_s: float) -> None:
        self._client = client
        self._timeout_s = timeout_s

    async def get(self, path: str, query: Mapping[str, str]) -> Response:
        try:
            reply = await self._client.call("GET", path, verb="get", query=query,
                                            timeout_s=self._timeout_s)
        except ClusterApiError as exc:
            if exc.status != 404:
                raise
            # Discovery of a group version the cluster does not serve: an answer, not a failure.
            return Response(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                  "code": 404, "reason": exc.k8s_reason or "NotFound",
                                  "message": str(exc)})
        assert reply is not None
        return Response(reply.status, reply.object)


class Recorder:
    """Another transport, with every exchange kept in order."""

    def __init__(self, inner: Transport) -> None:
        self._inner = inner
        self.exchanges: list[Exchange] = []

    async def get(self, path: str, query: Mapping[str, str]) -> Response:
        response = await self._inner.get(path, query)
        body = without_managed_fields(response.body)
        self.exchanges.append(Exchange("GET", request_path(path, query), response.status, body))
        return Response(response.status, body)


class Replayer:
    """Answers from a session, in order, checking each request against the recorded one."""

    def __init__(self, session: Session, source: str) -> None:
        self._session = session
        self._source = source
        self._next = 0

    @property
    def position(self) -> int:
        """The index of the last exchange answered."""
        return max(0, self._next - 1)

    async def get(self, path: str, query: Mapping[str, str]) -> Response:
        exchanges = self._session.exchanges
        asked = f"GET {request_path(path, query)}"
        if self._next >= len(exchanges):
            raise SessionError(
                f"{self._source}: the evaluation's request {self._next + 1} ({asked}) is not "
                f"in the session: it ends after {len(exchanges)} exchange(s) (truncated, or "
                "recorded for another cluster state or policy)")
        recorded = exchanges[self._next]
        self._next += 1
        if (recorded.method, recorded.path) != ("GET", request_path(path, query)):
            raise SessionError(
                f"{self._source}: exchanges[{self._next - 1}]: the evaluation asks {asked}, "
                f"the session recorded {shown(f'{recorded.method} {recorded.path}')}")
        if recorded.status != 404 and not 200 <= recorded.status < 300:
            raise SessionError(
                f"{self._source}: exchanges[{self._next - 1}].response.status: "
                f"{recorded.status}: a recording holds only answered requests (2xx, or 404 "
                "for a group version not served)")
        return Response(recorded.status, recorded.body)

    def finish(self) -> None:
        """The session must hold no exchange the evaluation did not make."""
        left = len(self._session.exchanges) - self._next
        if left:
            extra = self._session.exchanges[self._next]
            raise SessionError(
                f"{self._source}: {left} recorded exchange(s) the evaluation did not make, "
                f"from exchanges[{self._next}] ({shown(f'{extra.method} {extra.path}')})")


# --- the file ----------------------------------------------------------------------------------


class _JsonText(str):
    """A body's JSON, written as a YAML literal block: readable and diffable line by line,
    and read back by the JSON decoder rather than node by node by the (pure-Python, bounded)
    YAML loader, several times faster for a list of thousands of pods."""

    __slots__ = ()


_DUMPER_BASE: Any = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


class _Dumper(_DUMPER_BASE):  # type: ignore[misc]
    pass


def _literal(dumper: yaml.SafeDumper, value: _JsonText) -> yaml.ScalarNode:
    # The emitter falls back to a quoted scalar when a literal block cannot hold the text.
    return dumper.represent_scalar("tag:yaml.org,2002:str", str(value), style="|")


_Dumper.add_representer(_JsonText, _literal)


def _json_text(body: Mapping[str, Any]) -> _JsonText:
    try:
        return _JsonText(orjson.dumps(body, option=orjson.OPT_INDENT_2).decode())
    except orjson.JSONEncodeError:
        # A lone surrogate (`bounded_json` keeps one a server escaped): orjson will not
        # encode it; escaped as \udXXX it reads back as it was read.
        return _JsonText(json.dumps(body, indent=2, ensure_ascii=True))


def session_document(session: Session) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION, "kind": KIND,
        "policy": {"id": session.policy.id, "revision": session.policy.revision,
                   "specSha256": session.policy.spec_sha256},
        "context": session.context, "recordedAt": session.recorded_at,
        "pageSize": session.page_size,
        "exchanges": [{"request": {"method": e.method, "path": e.path},
                       "response": {"status": e.status, "body": _json_text(e.body)}}
                      for e in session.exchanges],
    }


def dump_session(session: Session) -> bytes:
    text = yaml.dump(session_document(session), Dumper=_Dumper, sort_keys=False,
                     allow_unicode=True, width=100)
    return (_HEADER + text).encode()


def write_session(path: Path, session: Session) -> None:
    """Atomically: a reader (or a crash) sees the old file or the whole new one."""
    data = dump_session(session)
    directory = path.parent if str(path.parent) else Path()
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_session(path: Path) -> Session:
    try:
        doc = load_yaml(read_bounded(path, MAX_SESSION_BYTES, setting="the session file cap"))
    except BadFile as exc:
        raise SessionError(f"{path}: {exc}") from None
    return decode_session(doc, str(path))


def _bad(source: str, where: str, expected: str, value: object) -> SessionError:
    return SessionError(f"{source}: {where}: expected {expected}, got {shown(value)}")


def _mapping(source: str, where: str, value: object, fields: frozenset[str],
             required: Sequence[str]) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise _bad(source, where, "a mapping", value)
    unknown = sorted(str(k) for k in value if k not in fields)
    if unknown:
        raise SessionError(f"{source}: {where}: unknown field(s) {shown(unknown)}")
    missing = [k for k in required if k not in value]
    if missing:
        raise SessionError(f"{source}: {where}: missing field(s) {shown(missing)}")
    return value


def _text(source: str, where: str, value: object, *, max_chars: int = 253) -> str:
    if not isinstance(value, str) or not value or len(value) > max_chars:
        raise _bad(source, where, f"a non-empty string of at most {max_chars} characters",
                   value)
    return value


def _int(source: str, where: str, value: object, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise _bad(source, where, f"an integer from {low} to {high}", value)
    return value


def decode_session(doc: Any, source: str) -> Session:
    """A loaded session document, every field checked; `SessionError` names the first bad
    field and its value."""
    top = _mapping(source, "the document", doc, _FIELDS, sorted(_FIELDS))
    if top["apiVersion"] != API_VERSION or top["kind"] != KIND:
        raise SessionError(
            f"{source}: not a policy eval session: apiVersion {shown(top['apiVersion'])}, kind "
            f"{shown(top['kind'])} (expected {API_VERSION}, {KIND})")
    pol = _mapping(source, "policy", top["policy"], _POLICY_FIELDS, sorted(_POLICY_FIELDS))
    sha = pol["specSha256"]
    if not isinstance(sha, str) or len(sha) != 64 or set(sha) - set("0123456789abcdef"):
        raise _bad(source, "policy.specSha256", "64 lowercase hex digits", sha)
    policy = PolicyRef(_text(source, "policy.id", pol["id"]),
                       _int(source, "policy.revision", pol["revision"], 0, 2**63 - 1), sha)
    recorded_at = top["recordedAt"]
    if isinstance(recorded_at, datetime):  # an unquoted timestamp, as YAML reads it
        recorded_at = recorded_at.isoformat()
    exchanges = top["exchanges"]
    if not isinstance(exchanges, list):
        raise _bad(source, "exchanges", "a list", exchanges)
    if len(exchanges) > MAX_EXCHANGES:
        raise SessionError(f"{source}: exchanges: more than {MAX_EXCHANGES}")
    return Session(
        policy=policy,
        context=_text(source, "context", top["context"]),
        recorded_at=_text(source, "recordedAt", recorded_at, max_chars=64),
        page_size=_int(source, "pageSize", top["pageSize"], 1, 100_000),
        exchanges=tuple(_exchange(source, i, e) for i, e in enumerate(exchanges)),
    )


def _exchange(source: str, index: int, value: object) -> Exchange:
    where = f"exchanges[{index}]"
    both = frozenset({"request", "response"})
    entry = _mapping(source, where, value, both, sorted(both))
    request = _mapping(source, f"{where}.request", entry["request"],
                       frozenset({"method", "path"}), ("method", "path"))
    response = _mapping(source, f"{where}.response", entry["response"],
                        frozenset({"status", "body"}), ("status", "body"))
    method = request["method"]
    if method != "GET":
        raise _bad(source, f"{where}.request.method", "GET (the evaluation only reads)", method)
    path = _text(source, f"{where}.request.path", request["path"], max_chars=MAX_PATH_CHARS)
    if not path.startswith("/"):
        raise _bad(source, f"{where}.request.path", "a path starting with /", path)
    text = response["body"]
    if not isinstance(text, str):
        raise _bad(source, f"{where}.response.body", "the answer's JSON text (a string)", text)
    try:
        body = bounded_json(text)
    except NotJSON as exc:
        raise SessionError(f"{source}: {where}.response.body: {exc}: the recorded answer was "
                           "cut short (a truncated file) or edited") from None
    if not isinstance(body, dict):
        raise _bad(source, f"{where}.response.body", "a JSON object", body)
    status = _int(source, f"{where}.response.status", response["status"], 100, 599)
    return Exchange("GET", path, status, body)
