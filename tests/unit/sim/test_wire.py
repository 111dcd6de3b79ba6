"""The simulator's JSON: stored and answered values equal what was sent (kube-apiserver)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from convergerd.sim import wire


@pytest.mark.parametrize(
    "value",
    [
        {"a": 1, "b": [True, None, 1.5, "é ✓"], "c": {}},
        {"n": 2**70, "m": -(2**63) - 1, "s": "x"},  # beyond orjson's 64 bits
        {"lone": "\ud800"},  # a lone surrogate, as the standard library decodes "\ud800"
        [],
    ],
)
def test_what_is_encoded_decodes_to_an_equal_value(value: Any) -> None:
    for encoded in (wire.dumps(value), wire.dumps_to_keep(value)):
        assert wire.loads(encoded) == value
        assert json.loads(encoded) == value  # what any client decodes


def test_yaml_becomes_json_data_as_sigs_k8s_yaml_converts_it() -> None:
    doc = yaml.safe_load("on: 1\n2: two\nwhen: 2024-01-02T03:04:05Z\nday: 2024-01-02\n")
    assert wire.from_yaml(doc) == {
        "true": 1, "2": "two", "when": "2024-01-02T03:04:05+00:00", "day": "2024-01-02",
    }


@pytest.mark.parametrize("text", ["x: .nan\n", "x: [.inf]\n", "x: {y: -.inf}\n"])
def test_yaml_nan_and_infinity_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="unsupported value"):
        wire.from_yaml(yaml.safe_load(text))


@pytest.mark.parametrize("body", [b'{"x":NaN}', b'{"x":-Infinity}', b'{"x":1e400}'])
def test_request_json_without_a_go_number_is_refused(body: bytes) -> None:
    with pytest.raises(ValueError, match=r"invalid character|cannot unmarshal number"):
        wire.loads_request(body)
    assert wire.loads_request(b'{"x":1e300,"y":12345678901234567890123}') == {
        "x": 1e300, "y": 12345678901234567890123,
    }


@pytest.mark.parametrize("body", [b"[" * 5000 + b"]" * 5000, b'{"a":' * 5000 + b"1" + b"}" * 5000])
def test_a_request_nested_too_deep_is_refused_as_bad_json(body: bytes) -> None:
    """Go's decoder refuses it ("exceeded max depth"): the simulator answers 400, not 500."""
    with pytest.raises(ValueError, match="exceeded max depth"):
        wire.loads_request(body)
    with pytest.raises(ValueError, match="exceeded max depth"):
        wire.loads_yaml_request(body, yaml.SafeLoader)
