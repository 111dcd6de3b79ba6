"""Hypothesis strategies for the bounded decoders' property tests (shared, so every edge is
tried with the same hostile input)."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

# Values JSON can carry exactly (64-bit integers, finite floats), nested.
JSON_VALUES: st.SearchStrategy[Any] = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=30,
)

# JSON-ish texts as a client may send them: any integer, NaN and Infinity included.
JSON_TEXTS: st.SearchStrategy[bytes] = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=10,
).map(lambda v: json.dumps(v).encode())

# A request body from anyone: arbitrary bytes, JSON, nesting up to 5,000 deep (closed or
# not), numbers of up to 10,000 digits, JSON cut short.
HOSTILE_BODIES: st.SearchStrategy[bytes] = (
    st.binary(max_size=512)
    | JSON_TEXTS
    | st.integers(1, 5000).map(lambda n: b"[" * n + b"]" * n)
    | st.integers(1, 5000).map(lambda n: b'{"allow_mass_removal": ' + b"[" * n)
    | st.integers(1, 10_000).map(lambda n: b'{"allow_mass_removal": 9' + b"9" * n + b"}")
    | st.tuples(JSON_TEXTS, st.integers(0, 40)).map(lambda t: t[0][: t[1]])
)
