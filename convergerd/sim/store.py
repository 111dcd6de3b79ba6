"""One simulated cluster's objects: the storage and registry-strategy half of a kube-apiserver.

Pure Python, no I/O. The HTTP server parses requests, calls these methods and renders the
returned dicts or raised `ApiError`s. A stored object is kept frozen, as its compact JSON bytes
(about a sixth of the memory of the same object as nested dicts, which matters at a million
objects): history, watch queues and list snapshots share those bytes, and every reader decodes
its own fresh dict from them, so nothing handed out can change what is stored.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import bisect
import builtins
import datetime
import json
import random
import re
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from convergerd.admission.labels import LabelSelector
from convergerd.sim import patches, ssa, status, wire
from convergerd.sim.notes import RequestNotes
from convergerd.sim.resources import LEASES, NAMESPACES, PODS, ResourceType, served
from convergerd.sim.selectors import (
    DNS_SUBDOMAIN_RE,
    SUBDOMAIN_MSG,
    FieldSelector,
    parse_field_selector,
    parse_label_selector,
)
from convergerd.sim.validation import validate

Key = tuple[str, str]  # (namespace or "", name)
Obj = dict[str, Any]
Frozen = bytes  # a stored object: its compact JSON, decoded afresh by every reader
KeyList = list[Key]  # spelled out here: inside ClusterStore, `list` is the method

APPLY_PATCH = "application/apply-patch+yaml"
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
BOOTSTRAP_NAMESPACES = ("default", "kube-node-lease", "kube-public", "kube-system")
_SYSTEM_MANAGER = "kube-apiserver"
_MAX_MANAGER_LEN = 128
_NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"  # apiserver's generateName alphabet
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_MSG = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', "
    "and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', "
    "regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)
_MICRO_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}(Z|[+-]\d{2}:\d{2})$")
_MICRO_LAYOUT = "2006-01-02T15:04:05.000000Z07:00"
# Never taken from a request body: set by the server (FillObjectMetaSystemFields & strategies).
_SYSTEM_META = ("uid", "creationTimestamp", "generation", "resourceVersion", "selfLink")


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _timestamp(now: datetime.datetime) -> str:
    """metav1.Time as JSON: RFC 3339 in UTC, whole seconds."""
    utc = now.astimezone(datetime.UTC)
    return (f"{utc.year:04d}-{utc.month:02d}-{utc.day:02d}T"
            f"{utc.hour:02d}:{utc.minute:02d}:{utc.second:02d}Z")


def _freeze(obj: Obj) -> Frozen:
    return wire.dumps_to_keep(obj)


def _thaw(data: Frozen) -> Obj:
    """A fresh dict of a stored object (the C decoder: faster than `clone` of the dicts)."""
    return wire.loads(data)  # type: ignore[no-any-return]


def clone(value: Any) -> Any:
    """Deep copy of JSON data, several times faster than copy.deepcopy."""
    if type(value) is dict:
        return {k: clone(v) for k, v in value.items()}
    if type(value) is list:
        return [clone(v) for v in value]
    return value


@dataclass(frozen=True, slots=True)
class AdmissionRequest:
    """What the admission hook sees (`convergerd.sim.vap`): it raises the Status of a denial
    and adds warnings and audit annotations to `notes`, the request's own."""

    operation: str  # CREATE, UPDATE or DELETE
    rt: ResourceType
    namespace: str | None
    name: str
    object: Obj | None  # None on DELETE; read-only
    old_object: Obj | None  # None on CREATE; read-only
    subresource: str | None = None
    dry_run: bool = False
    notes: RequestNotes | None = None


@dataclass(frozen=True, slots=True)
class _Event:
    rv: int
    type: str  # ADDED, MODIFIED, DELETED
    rt: ResourceType
    key: Key
    obj: Frozen  # the new state; for DELETED the last state with the deletion's RV
    old: Frozen | None
    at: float  # monotonic seconds when committed


class ClusterStore:
    """The objects of one simulated cluster, with a cluster-wide resourceVersion."""

    def __init__(
        self,
        *,
        now: Callable[[], datetime.datetime] = _utcnow,
        history_limit: int = 1000,
        page_token_ttl_s: float = 300.0,
        served_minor: Callable[[], int] = lambda: 32,
        watch_buffer_limit: int = 10_000,
        history_window_s: float = 300.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """History (what watches resume from and old list pages are rebuilt from) keeps at
        most `history_limit` events, none older than `history_window_s` (etcd compacts every
        5 minutes: an older resourceVersion gets 410 Expired there too)."""
        self._now = now
        self._history_limit = history_limit
        self._history_window_s = history_window_s
        self._monotonic = monotonic
        self._page_token_ttl_s = page_token_ttl_s
        self._served_minor = served_minor
        self._watch_buffer_limit = watch_buffer_limit
        self.admission: Callable[[AdmissionRequest], None] | None = None
        self._rv = 0
        # Created lazily on the first call, so that an idle cluster is a handful of slots.
        self._objects: dict[ResourceType, dict[Key, Frozen]] | None = None
        self._sorted: dict[ResourceType, KeyList] = {}
        self._history: deque[_Event] = deque()
        self._history_floor = 0  # every event with rv > floor is still in history
        self._watchers: dict[ResourceType, set[Watcher]] = {}

    # --- bookkeeping ---------------------------------------------------------------------------

    @property
    def resource_version(self) -> int:
        self._ensure_started()
        return self._rv

    def object_count(self) -> int:
        return sum(len(m) for m in self._tables().values())

    def _tables(self) -> dict[ResourceType, dict[Key, Frozen]]:
        if self._objects is None:
            self._objects = {}
            self._bootstrap()
        return self._objects

    def _ensure_started(self) -> None:
        self._tables()

    def _bootstrap(self) -> None:
        """The namespaces every real cluster has, as kube-apiserver creates them."""
        for name in BOOTSTRAP_NAMESPACES:
            obj = self._prepare_new(NAMESPACES, None, {"metadata": {"name": name}})
            outcome = ssa.update(
                None, obj, manager=_SYSTEM_MANAGER, api_version="v1", subresource="", now=self._ts()
            )
            self._commit(NAMESPACES, ("", name), outcome.obj, None)

    def _table(self, rt: ResourceType) -> dict[Key, Frozen]:
        tables = self._tables()
        table = tables.get(rt)
        if table is None:
            table = tables[rt] = {}
        return table

    def _ts(self) -> str:
        return _timestamp(self._now())

    def _check_served(self, rt: ResourceType, subresource: str | None = None) -> None:
        if not served(rt, self._served_minor()):
            raise status.path_not_found()
        if subresource is not None and (subresource != "status" or not rt.has_status):
            raise status.path_not_found()

    @staticmethod
    def _key(rt: ResourceType, namespace: str | None, name: str) -> Key:
        return ((namespace or "") if rt.namespaced else "", name)

    def _sorted_keys(self, rt: ResourceType) -> KeyList:
        keys = self._sorted.get(rt)
        if keys is None:
            keys = self._sorted[rt] = sorted(self._table(rt))
        return keys

    def _commit(self, rt: ResourceType, key: Key, new: Obj | None, old: Obj | None) -> Obj:
        """Persist one change: bump the RV, store, record history and notify watchers.

        Returns the object as stored, a dict the caller may hand out (nothing stored refers
        to it); `old` is the decoded current object (None on create)."""
        self._rv += 1
        table = self._table(rt)
        old_frozen = table.get(key)
        if new is None:
            assert old is not None
            event_type = "DELETED"
            obj = _with_rv(old, self._rv)
            frozen = _freeze(obj)
            del table[key]
            self._sorted.pop(rt, None)
        else:
            event_type = "MODIFIED" if old_frozen is not None else "ADDED"
            obj = _with_rv(new, self._rv)
            frozen = _freeze(obj)
            if old_frozen is None:
                self._sorted.pop(rt, None)
            table[key] = frozen
        at = self._monotonic()
        event = _Event(self._rv, event_type, rt, key, frozen, old_frozen, at)
        history = self._history
        history.append(event)
        if len(history) > self._history_limit:
            self._history_floor = history.popleft().rv
        # Compacted on write: an idle cluster keeps what it has (at most `history_limit`).
        while history[0].at < at - self._history_window_s:
            self._history_floor = history.popleft().rv
        for watcher in tuple(self._watchers.get(rt, ())):
            watcher._offer(event)
        return obj

    def _admit(self, request: AdmissionRequest) -> None:
        if self.admission is not None:
            self.admission(request)

    # --- reads for admission -----------------------------------------------------------------

    def serves(self, rt: ResourceType) -> bool:
        """Whether this cluster's version serves `rt`."""
        return served(rt, self._served_minor())

    def stored_objects(self, rt: ResourceType) -> builtins.list[Obj]:
        """The stored objects of `rt` (fresh copies)."""
        return [_thaw(data) for data in self._table(rt).values()]

    def stored_object(self, rt: ResourceType, namespace: str | None, name: str) -> Obj | None:
        """One stored object (a fresh copy) or None."""
        return self._stored(rt, self._key(rt, namespace, name))

    def _stored(self, rt: ResourceType, key: Key) -> Obj | None:
        data = self._table(rt).get(key)
        return None if data is None else _thaw(data)

    # --- reads ---------------------------------------------------------------------------------

    def get(self, rt: ResourceType, namespace: str | None, name: str) -> Obj:
        self._check_served(rt)
        obj = self._stored(rt, self._key(rt, namespace, name))
        if obj is None:
            raise status.not_found(rt, name)
        return obj

    def list(
        self,
        rt: ResourceType,
        namespace: str | None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int | None = None,
        continue_token: str | None = None,
    ) -> Obj:
        """A full List object, items sorted by namespace/name, paged with limit/continue.

        Every page of one list is served at the first page's resourceVersion (rebuilt from
        history, as etcd serves an old revision); a token older than history or than
        `page_token_ttl_s` gets 410 Expired with a fresh token that continues inconsistently.
        """
        self._check_served(rt)
        labels = parse_label_selector(label_selector or "")
        fields = parse_field_selector(field_selector or "", rt)
        start: Key | None = None
        list_rv = self._rv
        if continue_token:
            token_rv, start = self._decode_continue(continue_token)
            if token_rv >= 0:
                list_rv = token_rv
        table, keys = self._snapshot(rt, list_rv)
        ns = namespace if rt.namespaced and namespace else None
        lo, hi = _key_range(keys, ns, start)
        items: builtins.list[Obj] = []
        page_limit = limit if limit and limit > 0 else None
        last: Key | None = None
        i = lo
        while i < hi:
            obj = _thaw(table[keys[i]])
            i += 1
            if _matches(obj, labels, fields):
                if page_limit is not None and len(items) == page_limit:
                    i -= 1
                    break
                items.append(_list_item(rt, obj))
                last = keys[i - 1]
        meta: Obj = {"resourceVersion": str(list_rv)}
        if i < hi and last is not None:
            meta["continue"] = self._encode_continue(list_rv, last)
            if labels.empty and fields.empty:
                meta["remainingItemCount"] = hi - i
        return {
            "kind": rt.list_kind,
            "apiVersion": rt.api_version,
            "metadata": meta,
            "items": items,
        }

    def _snapshot(self, rt: ResourceType, rv: int) -> tuple[dict[Key, Frozen], KeyList]:
        """The table as it was at `rv`: the current one with later events undone."""
        later: builtins.list[_Event] = [e for e in self._history if e.rv > rv and e.rt is rt]
        if not later:
            return self._table(rt), self._sorted_keys(rt)
        table = dict(self._table(rt))
        for event in reversed(later):
            if event.old is None:
                table.pop(event.key, None)
            else:
                table[event.key] = event.old
        return table, sorted(table)

    def _encode_continue(self, rv: int, last: Key) -> str:
        data = {"v": "meta.k8s.io/v1", "rv": rv, "start": f"{last[0]}/{last[1]}\x00"}
        data["t"] = round(time.monotonic(), 3)
        raw = json.dumps(data, separators=(",", ":")).encode()
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    def _decode_continue(self, token: str) -> tuple[int, Key]:
        try:
            raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
            data = json.loads(raw)
            rv, start, issued = int(data["rv"]), str(data["start"]), float(data.get("t", 0))
            namespace, _, name = start.rstrip("\x00").partition("/")
        except (binascii.Error, ValueError, KeyError, TypeError):
            raise status.bad_request("invalid continue token: continue key is not valid") from None
        key = (namespace, name)
        too_old = rv >= 0 and (
            rv < self._history_floor or time.monotonic() - issued > self._page_token_ttl_s
        )
        if too_old:
            fresh = json.dumps({"v": "meta.k8s.io/v1", "rv": -1, "start": data["start"]})
            token = base64.urlsafe_b64encode(fresh.encode()).decode().rstrip("=")
            raise status.inconsistent_continue(token)
        return rv, key

    # --- create ----------------------------------------------------------------------------

    def create(
        self,
        rt: ResourceType,
        namespace: str | None,
        body: Obj,
        *,
        manager: str,
        dry_run: bool = False,
        notes: RequestNotes | None = None,
    ) -> Obj:
        """`notes`: where admission puts the request's warnings and audit annotations."""
        self._check_served(rt)
        obj = self._prepare_new(rt, namespace, body)
        outcome = ssa.update(
            None, obj, manager=manager, api_version=rt.api_version, subresource="", now=self._ts()
        )
        return self._finish_create(rt, namespace, outcome.obj, dry_run=dry_run, notes=notes)

    def _prepare_new(self, rt: ResourceType, namespace: str | None, body: Mapping[str, Any]) -> Obj:
        """Decode, validate and fill in a new object the way a create strategy does."""
        if not isinstance(body, Mapping):
            raise status.bad_request("the body of the request is not a JSON object")
        obj = self._decode(rt, namespace, body)
        meta = obj["metadata"]
        if not meta.get("name") and meta.get("generateName"):
            suffix = "".join(random.choice(_NAME_CHARS) for _ in range(5))
            meta["name"] = str(meta["generateName"]) + suffix
        _validate_name(rt, meta.get("name"))
        for field in (*_SYSTEM_META, "managedFields"):
            meta.pop(field, None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = self._ts()
        if rt.has_generation:
            meta["generation"] = 1
        _prepare_for_create(rt, obj)
        return obj

    def _finish_create(
        self, rt: ResourceType, namespace: str | None, obj: Obj, *, dry_run: bool,
        notes: RequestNotes | None,
    ) -> Obj:
        name = obj["metadata"]["name"]
        key = self._key(rt, namespace, name)
        if rt.namespaced:
            self._require_namespace(key[0])
        validate(rt, obj)
        self._admit(AdmissionRequest("CREATE", rt, namespace, name, obj, None, None, dry_run,
                                     notes))
        if key in self._table(rt):
            raise status.already_exists(rt, name)
        if dry_run:
            return clone(obj)  # type: ignore[no-any-return]
        return self._commit(rt, key, obj, None)

    def _require_namespace(self, namespace: str) -> None:
        if ("", namespace) not in self._table(NAMESPACES):
            raise status.namespace_not_found(namespace)

    def _decode(
        self, rt: ResourceType, namespace: str | None, body: Mapping[str, Any], *,
        owned: bool = False,
    ) -> Obj:
        """A fresh, normalised copy of a request body (typed-decoding checks included);
        `owned`: the body was decoded for this request alone, so it needs no deep copy."""
        api_version = body.get("apiVersion")
        if api_version not in (None, "", rt.api_version):
            raise status.bad_request(
                f"the API version in the data ({api_version}) does not match the expected "
                f"API version ({rt.api_version})"
            )
        kind = body.get("kind")
        if kind not in (None, "", rt.kind):
            raise status.bad_request(
                f"the kind in the data ({kind}) does not match the expected kind ({rt.kind})"
            )
        obj: Obj = dict(body) if owned else clone(dict(body))
        obj["apiVersion"], obj["kind"] = rt.api_version, rt.kind
        meta = obj.get("metadata")
        meta = dict(meta) if isinstance(meta, Mapping) else {}
        obj["metadata"] = meta
        if rt.namespaced:
            if meta.get("namespace") not in (None, "", namespace):
                raise status.bad_request(
                    "the namespace of the provided object does not match the namespace sent "
                    "on the request"
                )
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        if rt is LEASES:
            _decode_lease_spec(obj)
        return _move_apiversion_kind_first(obj)

    # --- update (PUT) ----------------------------------------------------------------------

    def update(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        body: Obj,
        *,
        manager: str,
        subresource: str | None = None,
        dry_run: bool = False,
        notes: RequestNotes | None = None,
    ) -> tuple[Obj, bool]:
        """PUT: (object, created). Strategy quirks per kube-apiserver."""
        self._check_served(rt, subresource)
        if not isinstance(body, Mapping):
            raise status.bad_request("the body of the request is not a JSON object")
        body_name = (body.get("metadata") or {}).get("name")
        if body_name not in (None, "", name):
            raise status.bad_request(
                f"the name of the object ({body_name}) does not match the name on the URL ({name})"
            )
        key = self._key(rt, namespace, name)
        existing = self._stored(rt, key)
        if existing is None:
            if not rt.allow_create_on_update or subresource is not None:
                raise status.not_found(rt, name)
            named = clone(dict(body))
            named.setdefault("metadata", {})
            named["metadata"] = dict(named["metadata"]) | {"name": name}
            return self.create(rt, namespace, named, manager=manager, dry_run=dry_run,
                               notes=notes), True
        body_rv = (body.get("metadata") or {}).get("resourceVersion")
        if not body_rv:
            if not rt.allow_unconditional_update:
                raise status.rv_required_for_update(rt, name)
        elif str(body_rv) != existing["metadata"]["resourceVersion"]:
            raise status.conflict(rt, name)
        new = self._decode(rt, namespace, body)
        new["metadata"]["name"] = name
        return self._write_update(
            rt, key, existing, new, manager=manager, subresource=subresource, dry_run=dry_run,
            notes=notes,
        ), False

    def _write_update(
        self,
        rt: ResourceType,
        key: Key,
        existing: Obj,
        new: Obj,
        *,
        manager: str,
        subresource: str | None,
        dry_run: bool,
        notes: RequestNotes | None,
    ) -> Obj:
        """The shared tail of PUT and non-apply PATCH: strategy, managedFields, persist."""
        new = _prepare_for_update(rt, existing, new, subresource)
        outcome = ssa.update(
            existing,
            new,
            manager=manager,
            api_version=rt.api_version,
            subresource=subresource or "",
            now=self._ts(),
        )
        return self._persist_update(
            rt, key, existing, outcome.obj, subresource=subresource, dry_run=dry_run,
            notes=notes,
        )

    def _persist_update(
        self,
        rt: ResourceType,
        key: Key,
        existing: Obj,
        new: Obj,
        *,
        subresource: str | None,
        dry_run: bool,
        notes: RequestNotes | None,
    ) -> Obj:
        new = _move_apiversion_kind_first(new)
        if subresource is None:
            validate(rt, new)
        request = AdmissionRequest(
            "UPDATE", rt, key[0] or None, key[1], new, existing, subresource, dry_run, notes
        )
        self._admit(request)
        # etcd3 GuaranteedUpdate skips a write whose bytes equal the stored ones: no new RV
        if ssa.json_equal(new, existing) or dry_run:
            return clone(new)  # type: ignore[no-any-return]
        return self._commit(rt, key, new, existing)

    # --- patch -----------------------------------------------------------------------------

    def patch(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        body: bytes,
        *,
        content_type: str,
        manager: str | None,
        force: bool | None,
        subresource: str | None = None,
        dry_run: bool = False,
        notes: RequestNotes | None = None,
    ) -> tuple[Obj, bool]:
        """PATCH in its four flavours: (object, created); only apply can create."""
        self._check_served(rt, subresource)
        media = content_type.split(";", 1)[0].strip().lower()
        if media not in (APPLY_PATCH, MERGE_PATCH, JSON_PATCH, STRATEGIC_MERGE_PATCH) or (
            media == STRATEGIC_MERGE_PATCH and not rt.builtin
        ):
            raise status.unsupported_media_type(strategic_merge=rt.builtin)
        # ValidatePatchOptions runs before the object is looked up
        if media == APPLY_PATCH:
            if not manager:
                raise status.field_manager_required()
        elif force is not None:
            raise status.force_on_non_apply()
        if manager and len(manager) > _MAX_MANAGER_LEN:
            raise status.field_manager_too_long(manager)
        if media == APPLY_PATCH:
            assert manager
            return self._apply(
                rt,
                namespace,
                name,
                body,
                manager=manager,
                force=bool(force),
                subresource=subresource,
                dry_run=dry_run,
                notes=notes,
            )
        key = self._key(rt, namespace, name)
        existing = self._stored(rt, key)
        if existing is None:
            raise status.not_found(rt, name)
        patched = _patched(existing, body, media)
        if not isinstance(patched, dict):
            raise status.bad_request("the patched object is not a JSON object")
        patched_rv = (patched.get("metadata") or {}).get("resourceVersion")
        if patched_rv and str(patched_rv) != existing["metadata"]["resourceVersion"]:
            raise status.conflict(rt, name)
        new = self._decode(rt, namespace, patched)
        new["metadata"]["name"] = name
        mgr = manager or "unknown"
        return self._write_update(
            rt, key, existing, new, manager=mgr, subresource=subresource, dry_run=dry_run,
            notes=notes,
        ), False

    def _apply(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        body: bytes,
        *,
        manager: str,
        force: bool,
        subresource: str | None,
        dry_run: bool,
        notes: RequestNotes | None,
    ) -> tuple[Obj, bool]:
        config = _decode_apply(rt, body)
        meta = config.get("metadata")
        meta = dict(meta) if isinstance(meta, Mapping) else {}
        if meta.get("name") not in (None, "", name):
            raise status.bad_request(
                f"the name of the object ({meta['name']}) does not match the name on the URL "
                f"({name})"
            )
        config = self._decode(rt, namespace, config, owned=True)  # just parsed from `body`
        key = self._key(rt, namespace, name)
        existing = self._stored(rt, key)
        config_rv = config["metadata"].get("resourceVersion")
        if existing is None:
            if subresource is not None or config_rv:
                raise status.not_found(rt, name)
            return self._apply_create(
                rt, namespace, name, config, manager=manager, dry_run=dry_run, notes=notes
            ), True
        if config_rv and str(config_rv) != existing["metadata"]["resourceVersion"]:
            raise status.conflict(rt, name)
        outcome = ssa.apply(
            existing,
            _apply_scope(rt, config, subresource),
            manager=manager,
            api_version=rt.api_version,
            subresource=subresource or "",
            force=force,
            now=self._ts(),
        )
        new = _restore_system_meta(outcome.obj, existing)
        new = _prepare_for_update(rt, existing, new, subresource)
        new["metadata"]["managedFields"] = outcome.obj["metadata"].get("managedFields")
        if not new["metadata"]["managedFields"]:
            del new["metadata"]["managedFields"]
        return self._persist_update(
            rt, key, existing, new, subresource=subresource, dry_run=dry_run, notes=notes
        ), False

    def _apply_create(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        config: Obj,
        *,
        manager: str,
        dry_run: bool,
        notes: RequestNotes | None,
    ) -> Obj:
        """Apply to a missing object creates it, whatever AllowCreateOnUpdate says."""
        config["metadata"]["name"] = name
        scoped = _apply_scope(rt, config, None)
        obj = self._prepare_new(rt, namespace, scoped)
        outcome = ssa.apply(
            {},
            _strip_system_meta(scoped),
            manager=manager,
            api_version=rt.api_version,
            subresource="",
            force=True,
            now=self._ts(),
        )
        obj["metadata"]["managedFields"] = outcome.obj["metadata"].get("managedFields", [])
        if not obj["metadata"]["managedFields"]:
            del obj["metadata"]["managedFields"]
        return self._finish_create(rt, namespace, obj, dry_run=dry_run, notes=notes)

    # --- delete ----------------------------------------------------------------------------

    def delete(
        self, rt: ResourceType, namespace: str | None, name: str, *, dry_run: bool = False,
        notes: RequestNotes | None = None,
    ) -> Obj:
        """DELETE: the response body. Pods and namespaces answer with the object
        (ReturnDeletedObject); leases, custom resources and VAP with a Success Status."""
        self._check_served(rt)
        key = self._key(rt, namespace, name)
        existing = self._stored(rt, key)
        if existing is None:
            raise status.not_found(rt, name)
        request = AdmissionRequest(
            "DELETE", rt, key[0] or None, name, None, existing, None, dry_run, notes
        )
        self._admit(request)
        if dry_run:
            deleted = existing
        else:
            if rt is NAMESPACES:
                self._delete_namespace_contents(name)
            deleted = self._commit(rt, key, None, existing)
        if rt.delete_returns_object:
            return deleted
        return status.success_status(rt, name, existing["metadata"].get("uid", ""))

    def _delete_namespace_contents(self, namespace: str) -> None:
        """The namespace controller's job, done at once: a namespace takes its objects along."""
        for rt, table in list(self._tables().items()):
            if not rt.namespaced:
                continue
            for key in [k for k in table if k[0] == namespace]:
                self._commit(rt, key, None, _thaw(table[key]))

    # --- watch -----------------------------------------------------------------------------

    def watch(
        self,
        rt: ResourceType,
        namespace: str | None,
        *,
        resource_version: str | None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> Watcher:
        """Start a watch. RV unset or "0": synthetic ADDED for what exists, then changes;
        RV N: the changes after N, or 410 Expired when N is older than the history kept."""
        self._check_served(rt)
        labels = parse_label_selector(label_selector or "")
        fields = parse_field_selector(field_selector or "", rt)
        ns = namespace if rt.namespaced and namespace else None
        watcher = Watcher(
            self,
            rt,
            namespace=ns,
            labels=labels,
            fields=fields,
            limit=self._watch_buffer_limit,
        )
        if resource_version in (None, "", "0"):
            table = self._table(rt)
            for key in self._sorted_keys(rt):
                data = table[key]
                if watcher._wants(_thaw(data)):
                    watcher._push("ADDED", data)
        else:
            start = _parse_rv(resource_version)
            if start < self._history_floor:
                raise status.expired(f"too old resource version: {start} ({self._history_floor})")
            for event in self._history:
                if event.rv > start and event.rt is rt:
                    watcher._offer(event)
        watcher._limit += len(watcher._buffer)  # the replay itself never counts as lag
        self._watchers.setdefault(rt, set()).add(watcher)
        return watcher

    def _unsubscribe(self, watcher: Watcher) -> None:
        watchers = self._watchers.get(watcher.rt)
        if watchers is not None:
            watchers.discard(watcher)
            if not watchers:
                del self._watchers[watcher.rt]

    def watcher_count(self) -> int:
        return sum(len(w) for w in self._watchers.values())


class Watcher:
    """One watch stream's queue. Obtain from `ClusterStore.watch`; the server loops:

        while not watcher.done:
            event = await watcher.next(timeout)   # None: time for a BOOKMARK (if asked for)
    and calls `close()` when the client goes away. A watcher that falls more than the buffer
    limit behind gets a 410 ERROR event instead of unbounded memory, and then ends.
    """

    def __init__(
        self,
        store: ClusterStore,
        rt: ResourceType,
        *,
        namespace: str | None,
        labels: LabelSelector,
        fields: FieldSelector,
        limit: int,
    ) -> None:
        self.rt = rt
        self._store = store
        self._namespace = namespace
        self._labels = labels
        self._fields = fields
        self._limit = limit
        self._buffer: deque[tuple[str, Frozen]] = deque()
        self._wakeup = asyncio.Event()
        self._closed = False
        self._last_rv = store.resource_version

    @property
    def done(self) -> bool:
        """Closed and drained: the server should end the response."""
        return self._closed and not self._buffer

    def _wants(self, obj: Obj) -> bool:
        if self._namespace is not None and obj["metadata"].get("namespace") != self._namespace:
            return False
        return _matches(obj, self._labels, self._fields)

    def _push(self, event_type: str, obj: Frozen) -> None:
        self._buffer.append((event_type, obj))
        self._wakeup.set()

    def _offer(self, event: _Event) -> None:
        """Filter one store event for this watch (cache_watcher.go convertToWatchEvent)."""
        if self._closed:
            return
        self._last_rv = event.rv
        now = event.type != "DELETED" and self._wants(_thaw(event.obj))
        old = None if event.old is None else _thaw(event.old)
        before = old is not None and self._wants(old)
        if event.type == "DELETED":
            if before:
                self._push("DELETED", event.obj)
        elif now and before:
            self._push("MODIFIED", event.obj)
        elif now:
            self._push("ADDED", event.obj)
        elif before:
            # left the selector: DELETED carrying the previous content at the new RV
            assert old is not None
            self._push("DELETED", _freeze(_with_rv(old, event.rv)))
        if len(self._buffer) > self._limit:
            self._overflow()

    def _overflow(self) -> None:
        self._buffer.clear()
        error = status.expired(f"too old resource version: {self._last_rv} ({self._last_rv})")
        self._buffer.append(("ERROR", _freeze(error.status)))
        self._closed = True
        self._store._unsubscribe(self)
        self._wakeup.set()

    async def next(self, timeout: float) -> Obj | None:  # noqa: ASYNC109 - None drives bookmarks
        """The next event as {"type","object"}, or None after `timeout` seconds (or when done)."""
        if not self._buffer and not self._closed:
            self._wakeup.clear()
            try:
                await asyncio.wait_for(self._wakeup.wait(), timeout)
            except TimeoutError:
                return None
        if not self._buffer:
            return None
        event_type, obj = self._buffer.popleft()
        return {"type": event_type, "object": _thaw(obj)}

    def bookmark(self) -> Obj:
        """A BOOKMARK at the newest RV this watch has seen (only valid with an empty queue)."""
        rv = self._store.resource_version if not self._buffer else self._last_rv
        return {
            "type": "BOOKMARK",
            "object": {
                "kind": self.rt.kind,
                "apiVersion": self.rt.api_version,
                "metadata": {"resourceVersion": str(rv)},
            },
        }

    def close(self) -> None:
        self._closed = True
        self._buffer.clear()
        self._store._unsubscribe(self)
        self._wakeup.set()


# --- helpers: matching, listing ----------------------------------------------------------------


def _matches(obj: Obj, labels: LabelSelector, fields: FieldSelector) -> bool:
    if not labels.empty and not labels.matches(obj["metadata"].get("labels")):
        return False
    return fields.empty or fields.matches(obj)


def _key_range(keys: list[Key], namespace: str | None, start: Key | None) -> tuple[int, int]:
    if namespace is None:
        lo, hi = 0, len(keys)
    else:
        lo = bisect.bisect_left(keys, (namespace, ""))
        hi = bisect.bisect_left(keys, (namespace + "\x00", ""))
    if start is not None:
        lo = max(lo, bisect.bisect_right(keys, start))
    return lo, hi


def _list_item(rt: ResourceType, obj: Obj) -> Obj:
    """`obj` (a fresh copy) as a list item."""
    item = obj
    if rt.builtin:
        item.pop("kind", None)
        item.pop("apiVersion", None)
    return item


_META_ORDER = {
    k: i
    for i, k in enumerate(
        (
            "name",
            "generateName",
            "namespace",
            "selfLink",
            "uid",
            "resourceVersion",
            "generation",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "labels",
            "annotations",
            "ownerReferences",
            "finalizers",
            "managedFields",
        )
    )
}


def _with_rv(obj: Obj, rv: int) -> Obj:
    """A copy with a new resourceVersion, metadata keys in ObjectMeta's wire order."""
    meta = dict(obj["metadata"]) | {"resourceVersion": str(rv)}
    out = dict(obj)
    out["metadata"] = {k: meta[k] for k in sorted(meta, key=lambda k: _META_ORDER.get(k, 99))}
    return out


def _parse_rv(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise status.bad_request(f"invalid resource version: {text}") from None
    if value < 0:
        raise status.bad_request(f"invalid resource version: {text}")
    return value


def _move_apiversion_kind_first(obj: Obj) -> Obj:
    """Typed objects serialise apiVersion/kind first and metadata next; keep that order."""
    head = {k: obj[k] for k in ("apiVersion", "kind", "metadata") if k in obj}
    if list(obj)[: len(head)] == list(head):
        return obj
    return head | {k: v for k, v in obj.items() if k not in head}


# --- helpers: strategies ---------------------------------------------------------------------


def _validate_name(rt: ResourceType, name: Any) -> None:
    if not name:
        cause = status.field_error("metadata.name", "Required", "name or generateName is required")
        raise status.invalid_object(rt, "", [cause])
    name = str(name)
    limit, pattern, msg = (
        (63, _DNS_LABEL, _LABEL_MSG)
        if rt.name_is_dns_label
        else (253, DNS_SUBDOMAIN_RE, SUBDOMAIN_MSG)
    )
    problems = []
    if len(name) > limit:
        problems.append(f"must be no more than {limit} characters")
    if not pattern.match(name):
        problems.append(msg)
    if problems:
        causes = [
            status.field_error("metadata.name", "Invalid", p, value=status._q(name))
            for p in problems
        ]
        raise status.invalid_object(rt, name, causes)


def _prepare_for_create(rt: ResourceType, obj: Obj) -> None:
    """PrepareForCreate of each strategy (the parts a client can observe)."""
    if rt.has_status and (not rt.builtin or rt.has_generation):
        obj.pop("status", None)  # CRs and VAP: status is reset on create
    if rt is NAMESPACES:
        _namespace_defaults(obj)
        obj["spec"] = {"finalizers": ["kubernetes"]}
        obj["status"] = {"phase": "Active"}
    elif rt is PODS:
        obj["status"] = {"phase": "Pending"}


def _namespace_defaults(obj: Obj) -> None:
    # the namespace strategy keeps this label equal to the name (since 1.21)
    meta = obj["metadata"]
    meta["labels"] = dict(meta.get("labels") or {}) | {"kubernetes.io/metadata.name": meta["name"]}


def _prepare_for_update(rt: ResourceType, existing: Obj, new: Obj, subresource: str | None) -> Obj:
    """PrepareForUpdate: what an update may touch, system metadata and generation."""
    if subresource == "status":
        # status strategy: the old object plus the new status; nothing else moves
        out = dict(existing)
        if "status" in new:
            out["status"] = new["status"]
        else:
            out.pop("status", None)
        out["metadata"] = dict(existing["metadata"])
        if "managedFields" in new["metadata"]:
            out["metadata"]["managedFields"] = new["metadata"]["managedFields"]
        return out
    out = _restore_system_meta(new, existing)
    if rt.has_status:
        if "status" in existing:
            out["status"] = existing["status"]
        else:
            out.pop("status", None)
    if rt is NAMESPACES:
        _namespace_defaults(out)
    if rt.has_generation:
        out["metadata"]["generation"] = existing["metadata"].get("generation", 1) + (
            0 if _same_outside_metadata(rt, existing, out) else 1
        )
    return out


def _same_outside_metadata(rt: ResourceType, old: Obj, new: Obj) -> bool:
    skip = {"metadata", "status"} if rt.has_status else {"metadata"}
    a = {k: v for k, v in old.items() if k not in skip}
    b = {k: v for k, v in new.items() if k not in skip}
    return ssa.json_equal(a, b)


def _restore_system_meta(new: Obj, existing: Obj) -> Obj:
    out = dict(new)
    meta = dict(new.get("metadata") or {})
    for field in _SYSTEM_META:
        if field in existing["metadata"]:
            meta[field] = existing["metadata"][field]
        else:
            meta.pop(field, None)
    meta["name"] = existing["metadata"]["name"]
    if "namespace" in existing["metadata"]:
        meta["namespace"] = existing["metadata"]["namespace"]
    out["metadata"] = meta
    return out


def _strip_system_meta(config: Obj) -> Obj:
    out = dict(config)
    out["metadata"] = {
        k: v for k, v in config["metadata"].items() if k not in (*_SYSTEM_META, "managedFields")
    }
    return out


def _apply_scope(rt: ResourceType, config: Obj, subresource: str | None) -> Obj:
    """Cut an applied config to what the endpoint may set (the strategies' reset fields)."""
    if subresource == "status":
        scoped: Obj = {k: config[k] for k in ("apiVersion", "kind") if k in config}
        scoped["metadata"] = {
            k: v for k, v in config["metadata"].items() if k in ("name", "namespace")
        }
        if "status" in config:
            scoped["status"] = config["status"]
        return scoped
    if rt.has_status and "status" in config:
        return {k: v for k, v in config.items() if k != "status"}
    return config


# --- helpers: bodies ---------------------------------------------------------------------


def _decode_apply(rt: ResourceType, body: bytes) -> Obj:
    """Apply-patch body checks, in the order patch.go and the field manager run them."""
    try:
        config = _load_yaml_or_json(body)
    except (yaml.YAMLError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
        raise status.bad_request(f"error decoding YAML: {exc}") from None
    if not isinstance(config, dict):
        raise status.bad_request(
            "error decoding YAML: error unmarshaling JSON: while decoding JSON: "
            "Object 'Kind' is missing in '" + body.decode("utf-8", "replace")[:64] + "'"
        )
    meta = config.get("metadata")
    if isinstance(meta, Mapping) and meta.get("managedFields") is not None:
        raise status.bad_request("metadata.managedFields must be nil")
    group_version = str(config.get("apiVersion") or "")
    kind = str(config.get("kind") or "")
    if group_version != rt.api_version or kind != rt.kind:
        group, _, version = group_version.rpartition("/")
        raise status.bad_request(f"invalid object type: {group}/{version}, Kind={kind}")
    return config


_YAML_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _load_yaml_or_json(body: bytes) -> Any:
    """JSON is valid YAML, and most appliers send JSON: parse it with the fast JSON parser,
    and only fall back to (much slower) YAML when that fails."""
    text = body.decode("utf-8").strip()
    if not text:
        return None
    if text.startswith("{"):
        try:
            return wire.loads_request(text)
        except ValueError:
            pass
    return wire.loads_yaml_request(text, _YAML_LOADER)


def _patched(existing: Obj, body: bytes, media: str) -> Any:
    try:
        patch = wire.loads_request(body) if body.strip() else None
    except (ValueError, UnicodeDecodeError) as exc:
        raise status.bad_request(f"error decoding patch: {exc}") from None
    if media == JSON_PATCH:
        if not isinstance(patch, list):
            raise status.bad_request(
                "json: cannot unmarshal object into Go value of type jsonpatch.Patch"
            )
        try:
            return patches.json_patch(existing, patch)
        except patches.PatchError:
            raise status.patch_rejected() from None
    if not isinstance(patch, dict):
        raise status.bad_request("error decoding patch: the patch is not a JSON object")
    # strategic merge patch on built-ins is treated as a JSON merge patch: for the fields we
    # serve (maps and atomic lists) the two agree
    return patches.merge_patch(existing, patch)


_INT32_MAX = 2**31 - 1
# The typed fields of coordination.k8s.io/v1 LeaseSpec this simulator checks (Go type names).
_LEASE_FIELDS = {"holderIdentity": "string", "leaseDurationSeconds": "int32",
                 "leaseTransitions": "int32"}


def _decode_lease_spec(obj: Obj) -> None:
    """A Lease's spec as kube-apiserver decodes and validates it: typed fields (a wrong JSON
    type or an int32 out of range is a 400 decode error), MicroTimes parsed exactly RFC3339
    with six fractional digits and stored in UTC (400 otherwise), then `ValidateLeaseSpec`
    (422: a duration not > 0, transitions < 0)."""
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return
    for field, go_type in _LEASE_FIELDS.items():
        value = spec.get(field)
        if value is not None:
            _check_go_type(field, value, go_type)
    for field in ("acquireTime", "renewTime"):
        value = spec.get(field)
        if value is None:
            continue
        spec[field] = _parse_micro_time(value)
    causes = []
    duration, transitions = spec.get("leaseDurationSeconds"), spec.get("leaseTransitions")
    if duration is not None and duration <= 0:
        causes.append(status.field_error("spec.leaseDurationSeconds", "Invalid",
                                         "must be greater than 0", value=str(duration)))
    if transitions is not None and transitions < 0:
        causes.append(status.field_error("spec.leaseTransitions", "Invalid",
                                         "must be greater than or equal to 0",
                                         value=str(transitions)))
    if causes:
        raise status.invalid_object(LEASES, str(obj["metadata"].get("name") or ""), causes)


def _check_go_type(field: str, value: Any, go_type: str) -> None:
    """encoding/json's UnmarshalTypeError for a typed struct field."""
    if go_type == "string":
        ok, shown = isinstance(value, str), _json_kind(value)
    else:
        ok = isinstance(value, int) and not isinstance(value, bool)
        ok = ok and -_INT32_MAX - 1 <= value <= _INT32_MAX
        number = isinstance(value, int | float) and not isinstance(value, bool)
        shown = f"number {json.dumps(value)}" if number else _json_kind(value)
    if not ok:
        raise _lease_decode_error(f"json: cannot unmarshal {shown[:64]} into Go struct field "
                                  f"LeaseSpec.spec.{field} of type {go_type}")


def _json_kind(value: Any) -> str:
    kinds = ((bool, "bool"), (str, "string"), (int | float, "number"), (list, "array"))
    return next((name for kind, name in kinds if isinstance(value, kind)), "object")


def _parse_micro_time(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    if not isinstance(value, str):
        detail = f"json: cannot unmarshal {type(value).__name__} into Go value of type string"
        raise _lease_decode_error(detail)
    if not _MICRO_TIME.match(text):
        raise _lease_decode_error(_micro_time_parse_error(text))
    try:
        parsed = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise _lease_decode_error(f"parsing time {json.dumps(text)}: day out of range") from None
    try:
        utc = parsed.astimezone(datetime.UTC)
    except OverflowError:
        # An offset carrying it before year 1 or past 9999 (a known deviation: Go holds it).
        raise _lease_decode_error(
            f"parsing time {json.dumps(text)}: year outside of range [0,9999]") from None
    return f"{utc.year:04d}-{utc:%m-%dT%H:%M:%S.%f}Z"


def _micro_time_parse_error(text: str) -> str:
    """Approximates Go's time.ParseError for the RFC3339Micro layout."""
    prefix = f"parsing time {json.dumps(text)} as {json.dumps(_MICRO_LAYOUT)}"
    seconds = re.match(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}", text)
    if seconds is None:
        return f'{prefix}: cannot parse {json.dumps(text)} as "2006"'
    rest = text[seconds.end() :]
    if not re.match(r"^\.\d{6}", rest):
        return f'{prefix}: cannot parse {json.dumps(rest)} as ".000000"'
    return f'{prefix}: cannot parse {json.dumps(rest[7:])} as "Z07:00"'


def _lease_decode_error(detail: str) -> status.ApiError:
    # handlers' transformDecodeError for a typed body
    return status.bad_request(f'Lease in version "v1" cannot be handled as a Lease: {detail}')
