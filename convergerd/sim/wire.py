"""JSON as the simulator stores and answers it, and as it decodes request bodies (pure).

Every write encodes its object twice (the stored copy and the answer) and decodes the stored
one at least once: orjson does each several times faster than the standard library, which is
a share of the simulator's CPU per request at fleet scale (bench/RESULTS.md, "Figures once
quoted in the code"). Where the two libraries disagree
the standard library's values are kept: orjson cannot encode an integer beyond 64 bits (then
the standard library encodes it) and decodes one as a float (so such bytes are marked, with a
leading space, to be decoded by the standard library again). orjson writes non-ASCII
characters as UTF-8 where the standard library escapes them: the same JSON, and what
kube-apiserver sends too.

Request bodies are decoded as kube-apiserver's Go decoder does on one point orjson would
change: NaN, Infinity and numbers beyond float64 are refused (orjson would encode them as
null), so a stored object never holds one.
"""

from __future__ import annotations

import datetime
import json
import math
from typing import Any

import orjson
import yaml

_ENCODER = json.JSONEncoder(separators=(",", ":"), check_circular=False)
_STDLIB_MARK = b" "  # leading whitespace: valid JSON, and the sign to decode with json


def dumps(value: Any) -> bytes:
    """Compact JSON; bytes `loads` turns back into an equal value."""
    try:
        return orjson.dumps(value)
    except TypeError:  # an integer beyond 64 bits (orjson.JSONEncodeError is a TypeError)
        return _STDLIB_MARK + _ENCODER.encode(value).encode()


def dumps_to_keep(value: Any) -> bytes:
    """`dumps` for bytes kept long (stored objects): orjson's answer holds on to its whole
    output buffer, about 4 KiB however short the JSON (5x the memory of a stored Policy), so
    it is copied into bytes of its own size."""
    return bytes(memoryview(dumps(value)))


def loads(data: bytes) -> Any:
    """The value of bytes from `dumps`."""
    if data[:1] == _STDLIB_MARK:
        return json.loads(data)
    return orjson.loads(data)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"invalid character '{name[0]}' looking for beginning of value")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"cannot unmarshal number {text} into Go value of type float64")
    return value


_TOO_DEEP = "exceeded max depth"
_REQUEST_DECODER = json.JSONDecoder(parse_constant=_refuse_constant, parse_float=_finite_float)


def loads_request(data: bytes | str) -> Any:
    """A request body's JSON, as the standard library decodes it, without NaN or Infinity.
    Nested too deep for the recursive decoder: a ValueError, as Go's decoder refuses it."""
    if not isinstance(data, str):
        # what json.loads does with bytes (it detects UTF-16 and UTF-32 too)
        data = data.decode(json.detect_encoding(data), "surrogatepass")
    try:
        return _REQUEST_DECODER.decode(data)
    except RecursionError:
        raise ValueError(_TOO_DEEP) from None


def loads_yaml_request(text: str | bytes, loader: type[Any]) -> Any:
    """A request body's YAML as JSON data (`from_yaml`), read with `loader` (a safe one).
    Nested too deep for the recursive loader: a ValueError, as for JSON."""
    try:
        return from_yaml(yaml.load(text, Loader=loader))  # noqa: S506 - callers pass safe loaders
    except RecursionError:
        raise ValueError(_TOO_DEEP) from None


def from_yaml(value: Any) -> Any:
    """Decoded YAML as JSON data, as sigs.k8s.io/yaml converts it: keys become strings (`on:`
    is the key "true"), timestamps strings, and a NaN or an infinity is refused (ValueError:
    Go's json.Marshal has no number for it). orjson would otherwise encode a date its own way."""
    if isinstance(value, dict):
        return {_json_key(k): from_yaml(v) for k, v in value.items()}
    if isinstance(value, list):
        return [from_yaml(v) for v in value]
    if isinstance(value, datetime.date):
        return value.isoformat()
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"json: unsupported value: {value}")
    return value


def _json_key(key: Any) -> str:
    if isinstance(key, bool):
        return "true" if key else "false"
    return key if isinstance(key, str) else json.dumps(from_yaml(key))
