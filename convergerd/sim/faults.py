"""Per-cluster fault settings, as the admin API and the `--config` file spell them (pure).

A `Faults` value describes how one simulated cluster misbehaves right now. It is immutable:
the admin API replaces a cluster's value wholesale, so a request in flight sees one consistent
setting.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# The Kubernetes version a cluster reports unless told otherwise; kubectl 1.32 is the client.
DEFAULT_VERSION = "v1.32.0"
ERROR_STATUSES = frozenset({429, 500, 502, 503, 504})
# The admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy API went GA in 1.30.
VAP_MIN_MINOR = 30
MAX_LATENCY_MS = 600_000

# JSON key -> dataclass field. The JSON spelling is the public one (admin API, config file).
_JSON_FIELDS = {
    "down": "down",
    "hang": "hang",
    "latencyMs": "latency_ms",
    "errorRate": "error_rate",
    "errorStatus": "error_status",
    "retryAfterSeconds": "retry_after_seconds",
    "version": "version",
    "readOnly": "read_only",
    "crd": "crd",
    "admission": "admission",
    "metrics": "metrics",
    "hostile": "hostile",
}
# Fault `hostile` (convergerd.sim.hostile): its modes and, per mode, its parameters.
HOSTILE_MODES = ("controlChars", "wrongTypes", "invalidJson", "oversized", "trickle",
                 "amplification", "deepNesting", "endlessContinue", "overLimit", "redirect",
                 "wrongObject", "wrongList", "hugeVersion", "hugeHeaders", "hugeValues",
                 "hostileMetrics", "hostileWarnings")
WRONG_TYPE_FIELDS = ("status.phase", "status.conditions", "metadata.labels",
                     "metadata.generation", "spec", "items", "message", "gitVersion")
HUGE_VALUE_FIELDS = ("metadata.labels", "metadata.annotations", "spec.holderIdentity",
                     "status.conditions")
WRONG_OBJECT_CHANGES = ("kind", "name", "revision")
WRONG_LIST_SHAPES = ("noItems", "otherKind")
# amplification: what fills `items`: empty objects, or lists holding a string of one bracket
# (each item costs a container and a string the client must tell from one).
AMPLIFICATION_SHAPES = ("objects", "bracketStrings")
# hostileMetrics (what `/metrics` answers) and hostileWarnings (the `Warning` headers of
# dry-run answers): the operator's reads of its own cluster (convergerd.sim.hostile).
METRICS_SHAPES = ("huge", "repeated", "longLine", "badValues", "manyPolicies", "trickle",
                  "notText", "restarts", "backwards", "labelEscapes")
WARNING_SHAPES = ("many", "huge", "malformed", "controlChars", "rawControls", "invalidUtf8")
BAD_METRIC_VALUES = ("NaN", "-1", "1e308", "+Inf", "1.5", "0x10", "one", "9007199254740993")
SHAPES = {"wrongList": WRONG_LIST_SHAPES, "amplification": AMPLIFICATION_SHAPES,
          "hostileMetrics": METRICS_SHAPES,
          "hostileWarnings": WARNING_SHAPES}
HUGE_VERSION_FIELDS = ("gitVersion", "extra")
REDIRECT_STATUSES = (301, 302, 303, 307, 308)
MiB = 2**20
DEFAULT_OVERSIZED_BYTES = 32 * MiB  # above the daemon's default 16 MiB cap
MAX_OVERSIZED_BYTES = 2**33
DEFAULT_TRICKLE_BYTES_PER_S = 10
# `bytes` of the modes that fill an answer up to a size: just under the daemon's default
# 16 MiB cap (amplification, hugeVersion), or what one header block or value costs.
DEFAULT_BYTES = {
    "oversized": DEFAULT_OVERSIZED_BYTES,
    "amplification": 15 * MiB,
    "hugeVersion": 15 * MiB,
    "hugeHeaders": 1 * MiB,
    "hugeValues": 1 * MiB,
    "hostileMetrics": 48 * MiB,  # huge: the other series; longLine: the one line
    "hostileWarnings": 4096,  # each Warning's text
}
# `count`: hostileMetrics repeated (times each of our lines) and manyPolicies (fake policies);
# hostileWarnings: the Warning headers added.
DEFAULT_COUNT = {"hostileMetrics": 100_000, "hostileWarnings": 50}
MAX_COUNT = 10_000_000
DEFAULT_DEPTH = 100_000  # deepNesting: 200 KB of brackets, far past any parser's limit
MAX_DEPTH = 8 * MiB
DEFAULT_HEADER_BYTES = 4096  # hugeHeaders: each header's value (aiohttp reads up to 8190)
DEFAULT_OVER_LIMIT_FACTOR = 10
MAX_OVER_LIMIT_FACTOR = 10_000


class FaultsError(ValueError):
    """A fault document that cannot be applied; the message names the field and the value."""


@dataclass(frozen=True)
class Version:
    """A parsed `vMAJOR.MINOR.PATCH[-pre][+build]` version string."""

    major: int
    minor: int
    patch: int
    git_version: str

    @classmethod
    def parse(cls, text: str) -> Version:
        if not text.startswith("v"):
            raise FaultsError(f'version: invalid value "{text}": must look like "v1.29.4"')
        core = text[1:].split("+", 1)[0].split("-", 1)[0]
        parts = core.split(".")
        if len(parts) != 3 or not all(p.isdigit() for p in parts):
            raise FaultsError(f'version: invalid value "{text}": must look like "v1.29.4"')
        major, minor, patch = (int(p) for p in parts)
        if major != 1:
            raise FaultsError(f'version: invalid value "{text}": only Kubernetes 1.x is simulated')
        return cls(major=major, minor=minor, patch=patch, git_version=text)


@dataclass(frozen=True)
class Hostile:
    """Fault `hostile`: answers no well-behaved apiserver sends (see convergerd.sim.hostile)."""

    mode: str
    # oversized, amplification, hugeVersion: the answer's size; hugeHeaders: the headers';
    # hugeValues: each value's. None: the mode's default (`DEFAULT_BYTES`).
    bytes: int | None = None
    bytes_per_second: int = DEFAULT_TRICKLE_BYTES_PER_S  # trickle
    # wrongTypes: which fields get the wrong type (default: all but items); hugeValues: which
    # get the huge value (default: all of HUGE_VALUE_FIELDS).
    fields: frozenset[str] | None = None
    depth: int = DEFAULT_DEPTH  # deepNesting
    header_bytes: int = DEFAULT_HEADER_BYTES  # hugeHeaders
    factor: int = DEFAULT_OVER_LIMIT_FACTOR  # overLimit: items = factor x the request's limit
    status: int = 307  # redirect
    cluster: str | None = None  # redirect: same origin, this cluster's path (default: home)
    location: str | None = None  # redirect: this URL (http or https) + the request's path
    change: str = "revision"  # wrongObject
    # amplification, wrongList, hostileMetrics, hostileWarnings (None: the first)
    shape: str | None = None
    field: str = "gitVersion"  # hugeVersion: where the padding goes
    count: int | None = None  # hostileMetrics, hostileWarnings (None: `DEFAULT_COUNT`)
    value: str = "NaN"  # hostileMetrics badValues: what every counter value becomes

    @property
    def size(self) -> int:
        return self.bytes if self.bytes is not None else DEFAULT_BYTES.get(self.mode, MiB)

    @property
    def chosen_shape(self) -> str:
        return self.shape if self.shape is not None else SHAPES.get(self.mode, ("",))[0]

    @property
    def times(self) -> int:
        return self.count if self.count is not None else DEFAULT_COUNT.get(self.mode, 1)

    @property
    def chosen_fields(self) -> frozenset[str]:
        if self.fields is not None:
            return self.fields
        if self.mode == "hugeValues":
            return frozenset(HUGE_VALUE_FIELDS)
        return frozenset(WRONG_TYPE_FIELDS) - {"items"}

    @property
    def redirect_cluster(self) -> str:
        return self.cluster or "home"

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"mode": self.mode}
        if self.mode in DEFAULT_BYTES:
            doc["bytes"] = self.size
        known = _HOSTILE_PARAMS.get(self.mode, ())
        order = WRONG_TYPE_FIELDS if self.mode == "wrongTypes" else HUGE_VALUE_FIELDS
        values: dict[str, Any] = {
            "bytesPerSecond": self.bytes_per_second,
            "fields": [f for f in order if f in self.chosen_fields],
            "depth": self.depth, "headerBytes": self.header_bytes, "factor": self.factor,
            "status": self.status, "change": self.change, "shape": self.chosen_shape,
            "field": self.field, "count": self.times, "value": self.value,
        }
        for key in known:
            if key in values:
                doc[key] = values[key]
        if self.mode == "redirect":
            if self.location is not None:
                doc["location"] = self.location
            else:
                doc["cluster"] = self.redirect_cluster
        return doc


@dataclass(frozen=True)
class Faults:
    """How one cluster misbehaves. The defaults describe a healthy, current cluster."""

    down: bool = False  # connections are reset without an answer
    hang: bool = False  # requests are held without an answer until the client gives up
    latency_ms: int = 0  # added before every answer
    error_rate: float = 0.0  # share of requests answered with error_status instead
    error_status: int = 500
    retry_after_seconds: int | None = None  # Retry-After on injected errors (429 always has one)
    version: str = DEFAULT_VERSION
    read_only: bool = False  # the token may read; writes get 403
    crd: bool = True  # the Policy CRD is installed
    # ValidatingAdmissionPolicies are enforced (false: the API is served but nothing is
    # evaluated, like an apiserver whose ValidatingAdmissionPolicy plugin is disabled)
    admission: bool = True
    # the token may read /metrics (false: RBAC without nonResourceURLs ["/metrics"], 403)
    metrics: bool = True
    hostile: Hostile | None = None  # answers with bytes a client must survive

    @functools.cached_property
    def parsed_version(self) -> Version:
        # Read on every request (what the cluster serves): parsed once per Faults value.
        return Version.parse(self.version)

    @property
    def minor(self) -> int:
        return self.parsed_version.minor

    @property
    def serves_vap(self) -> bool:
        return self.minor >= VAP_MIN_MINOR

    def to_json(self) -> dict[str, Any]:
        doc = {key: getattr(self, attr) for key, attr in _JSON_FIELDS.items()}
        doc["hostile"] = self.hostile.to_json() if self.hostile is not None else None
        return doc

    def merged(self, doc: Mapping[str, Any]) -> Faults:
        """This value with the fields named in `doc` replaced (validated)."""
        return dataclasses.replace(self, **_parse_fields(doc))

    @classmethod
    def from_mapping(cls, doc: Mapping[str, Any]) -> Faults:
        return cls().merged(doc)

    @classmethod
    def from_json_bytes(cls, body: bytes, base: Faults | None = None) -> Faults:
        """Parse an admin API body; `base` is the value the named fields are applied to."""
        return (base or cls()).merged(parse_json_object(body))


def parse_json_object(body: bytes) -> Mapping[str, Any]:
    try:
        doc = json.loads(body or b"{}")
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise FaultsError(f"body: invalid JSON: {e}") from e
    if not isinstance(doc, dict):
        raise FaultsError(f"body: must be a JSON object, got {type(doc).__name__}")
    return doc


def _parse_fields(doc: Mapping[str, Any]) -> dict[str, Any]:
    unknown = sorted(str(k) for k in doc if k not in _JSON_FIELDS)
    if unknown:
        raise FaultsError(
            f"unknown field(s): {', '.join(unknown)} (known: {', '.join(_JSON_FIELDS)})"
        )
    out: dict[str, Any] = {}
    for key, value in doc.items():
        out[_JSON_FIELDS[key]] = _PARSERS[key](key, value)
    return out


def _bool(key: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise FaultsError(f"{key}: invalid value {json.dumps(value)}: must be true or false")
    return value


def _int(key: str, value: object, lo: int, hi: int) -> int:
    # bool is an int in Python; `true` is never a sensible number of milliseconds.
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise FaultsError(
            f"{key}: invalid value {json.dumps(value)}: must be an integer in [{lo}, {hi}]"
        )
    return value


def _latency(key: str, value: object) -> int:
    return _int(key, value, 0, MAX_LATENCY_MS)


def _rate(key: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise FaultsError(f"{key}: invalid value {json.dumps(value)}: must be a number in [0, 1]")
    return float(value)


def _status(key: str, value: object) -> int:
    if isinstance(value, bool) or value not in ERROR_STATUSES:
        allowed = ", ".join(str(s) for s in sorted(ERROR_STATUSES))
        raise FaultsError(f"{key}: invalid value {json.dumps(value)}: must be one of {allowed}")
    assert isinstance(value, int)
    return value


def _retry_after(key: str, value: object) -> int | None:
    if value is None:
        return None
    return _int(key, value, 0, 3600)


def _version(key: str, value: object) -> str:
    if not isinstance(value, str):
        raise FaultsError(
            f'{key}: invalid value {json.dumps(value)}: must be a string like "v1.29.4"'
        )
    Version.parse(value)
    return value


_HOSTILE_PARAMS: dict[str, tuple[str, ...]] = {
    "controlChars": (),
    "wrongTypes": ("fields",),
    "invalidJson": (),
    "oversized": ("bytes",),
    "trickle": ("bytesPerSecond",),
    "amplification": ("bytes", "shape"),
    "deepNesting": ("depth",),
    "endlessContinue": (),
    "overLimit": ("factor",),
    "redirect": ("status", "cluster", "location"),
    "wrongObject": ("change",),
    "wrongList": ("shape",),
    "hugeVersion": ("bytes", "field"),
    "hugeHeaders": ("bytes", "headerBytes"),
    "hugeValues": ("bytes", "fields"),
    "hostileMetrics": ("shape", "bytes", "count", "bytesPerSecond", "value"),
    "hostileWarnings": ("shape", "bytes", "count"),
}


def _hostile(key: str, value: object) -> Hostile | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise FaultsError(f"{key}: invalid value {json.dumps(value)}: must be an object "
                          f'like {{"mode": "controlChars"}} or null')
    mode = value.get("mode")
    if mode not in _HOSTILE_PARAMS:
        raise FaultsError(f"{key}.mode: invalid value {json.dumps(mode)}: must be one of "
                          f"{', '.join(HOSTILE_MODES)}")
    known = _HOSTILE_PARAMS[mode]
    unknown = sorted(str(k) for k in value if k != "mode" and k not in known)
    if unknown:
        raise FaultsError(f"{key}: unknown field(s) for mode {mode}: {', '.join(unknown)} "
                          f"(known: {', '.join(('mode', *known))})")
    return Hostile(mode=mode, **_hostile_params(key, mode, value))


# Integer parameters: JSON name -> (dataclass field, lowest, highest).
_HOSTILE_INTS = {
    "bytes": ("bytes", 1, MAX_OVERSIZED_BYTES),
    "bytesPerSecond": ("bytes_per_second", 1, 1_000_000_000),
    "depth": ("depth", 1, MAX_DEPTH),
    "headerBytes": ("header_bytes", 1, MAX_OVERSIZED_BYTES),
    "factor": ("factor", 2, MAX_OVER_LIMIT_FACTOR),
    "count": ("count", 1, MAX_COUNT),
}
_HOSTILE_CHOICES = {"status": REDIRECT_STATUSES, "change": WRONG_OBJECT_CHANGES,
                    "field": HUGE_VERSION_FIELDS, "value": BAD_METRIC_VALUES}


def _hostile_params(key: str, mode: str, value: Mapping[str, Any]) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for name, (attr, lo, hi) in _HOSTILE_INTS.items():
        if name in value:
            params[attr] = _int(f"{key}.{name}", value[name], lo, hi)
    for name, choices in _HOSTILE_CHOICES.items():
        if name in value:
            params[name] = _choice(f"{key}.{name}", value[name], choices)
    if "shape" in value:
        params["shape"] = _choice(f"{key}.shape", value["shape"], SHAPES[mode])
    if "fields" in value:
        allowed = WRONG_TYPE_FIELDS if mode == "wrongTypes" else HUGE_VALUE_FIELDS
        params["fields"] = _fields(f"{key}.fields", value["fields"], allowed)
    if "cluster" in value and "location" in value:
        raise FaultsError(f"{key}: cluster and location: give one (a path of another cluster "
                          "behind the same front, or a URL)")
    if "cluster" in value:
        params["cluster"] = _cluster_id(f"{key}.cluster", value["cluster"])
    if "location" in value:
        params["location"] = _location(f"{key}.location", value["location"])
    return params


def _fields(key: str, value: object, allowed: tuple[str, ...]) -> frozenset[str]:
    if (not isinstance(value, list) or not value
            or not all(isinstance(v, str) and v in allowed for v in value)):
        raise FaultsError(f"{key}: invalid value {json.dumps(value)}: must be a non-empty "
                          f"list of {', '.join(allowed)}")
    return frozenset(value)


def _choice(key: str, value: object, choices: tuple[Any, ...]) -> Any:
    if isinstance(value, bool) or value not in choices:
        raise FaultsError(f"{key}: invalid value {json.dumps(value)}: must be one of "
                          f"{', '.join(json.dumps(c) for c in choices)}")
    return value


def _cluster_id(key: str, value: object) -> str:
    if not isinstance(value, str) or not value or "/" in value or len(value) > 63:
        raise FaultsError(f"{key}: invalid value {json.dumps(value)}: must be a cluster id")
    return value


def _location(key: str, value: object) -> str:
    if (not isinstance(value, str) or not value.startswith(("http://", "https://"))
            or len(value) > 2048 or any(c in value for c in "\r\n ")):
        raise FaultsError(f"{key}: invalid value {json.dumps(value)}: must be an http:// or "
                          "https:// URL")
    return value.rstrip("/")


_PARSERS: dict[str, Any] = {
    "down": _bool,
    "hang": _bool,
    "latencyMs": _latency,
    "errorRate": _rate,
    "errorStatus": _status,
    "retryAfterSeconds": _retry_after,
    "version": _version,
    "readOnly": _bool,
    "crd": _bool,
    "admission": _bool,
    "metrics": _bool,
    "hostile": _hostile,
}
