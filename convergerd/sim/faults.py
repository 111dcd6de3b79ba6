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
    "hostile": "hostile",
}
# Fault `hostile` (convergerd.sim.hostile): its modes and, per mode, its parameters.
HOSTILE_MODES = ("controlChars", "wrongTypes", "invalidJson", "oversized", "trickle")
WRONG_TYPE_FIELDS = ("status.phase", "status.conditions", "metadata.labels",
                     "metadata.generation", "spec", "items", "message", "gitVersion")
DEFAULT_OVERSIZED_BYTES = 32 * 2**20  # above the daemon's default 16 MiB cap
MAX_OVERSIZED_BYTES = 2**33
DEFAULT_TRICKLE_BYTES_PER_S = 10


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
    bytes: int = DEFAULT_OVERSIZED_BYTES  # oversized: the answer's size
    bytes_per_second: int = DEFAULT_TRICKLE_BYTES_PER_S  # trickle
    # wrongTypes: which fields get the wrong type (default: all but items).
    fields: frozenset[str] = frozenset(WRONG_TYPE_FIELDS) - {"items"}

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"mode": self.mode}
        if self.mode == "oversized":
            doc["bytes"] = self.bytes
        elif self.mode == "trickle":
            doc["bytesPerSecond"] = self.bytes_per_second
        elif self.mode == "wrongTypes":
            doc["fields"] = [f for f in WRONG_TYPE_FIELDS if f in self.fields]
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


_HOSTILE_PARAMS = {
    "controlChars": (),
    "wrongTypes": ("fields",),
    "invalidJson": (),
    "oversized": ("bytes",),
    "trickle": ("bytesPerSecond",),
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
    out = Hostile(mode=mode)
    if "bytes" in value:
        out = dataclasses.replace(out, bytes=_int(f"{key}.bytes", value["bytes"], 1,
                                                  MAX_OVERSIZED_BYTES))
    if "bytesPerSecond" in value:
        out = dataclasses.replace(out, bytes_per_second=_int(
            f"{key}.bytesPerSecond", value["bytesPerSecond"], 1, 1_000_000_000))
    if "fields" in value:
        out = dataclasses.replace(out, fields=_wrong_fields(f"{key}.fields", value["fields"]))
    return out


def _wrong_fields(key: str, value: object) -> frozenset[str]:
    if (not isinstance(value, list) or not value
            or not all(isinstance(v, str) and v in WRONG_TYPE_FIELDS for v in value)):
        raise FaultsError(f"{key}: invalid value {json.dumps(value)}: must be a non-empty "
                          f"list of {', '.join(WRONG_TYPE_FIELDS)}")
    return frozenset(value)


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
    "hostile": _hostile,
}
