"""Values as PostgreSQL can hold them, decided once for everything the store writes. Pure.

What a round records comes partly from the clusters (condition messages, error bodies, server
versions, revisions read back): whatever decoded it upstream, the store's edge makes sure a
value cannot fail the write. `text` cannot hold NUL, and a lone surrogate cannot be encoded as
UTF-8; free text is capped (a reason is for reading, not a place for megabytes); an integer
beyond its column's range is clamped (a count) or dropped (a revision: a clamped revision would
be a different revision).
"""

from __future__ import annotations

from typing import Any

from convergerd.core.decode import bounded_json
from convergerd.core.errors import NotJSON
from convergerd.core.model import UnreadableJson

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
# Free text (error reasons, condition messages, server versions): enough for any readable
# reason, small enough that 100k rows of it stay a small write.
TEXT_MAX_CHARS = 4096
_ELLIPSIS = "…"


def pg_text(value: str | None, max_chars: int = TEXT_MAX_CHARS) -> str | None:
    """`value` as a `text` column holds it: NUL removed, unencodable characters (lone
    surrogates) replaced by U+FFFD, at most `max_chars` characters (cut with an ellipsis).
    Returns `value` itself when it needs no change, so callers can test with `is`."""
    if value is None:
        return None
    cleaned = value
    if "\x00" in cleaned:
        cleaned = cleaned.replace("\x00", "")
    if not cleaned.isascii():
        try:
            cleaned.encode("utf-8")
        except UnicodeEncodeError:
            cleaned = "".join("\ufffd" if "\ud800" <= ch <= "\udfff" else ch for ch in cleaned)
    if len(cleaned) > max_chars:
        cleaned = cleaned[: max_chars - 1] + _ELLIPSIS
    return value if cleaned == value else cleaned


def pg_count(value: int, *, bits: int = 32) -> int:
    """A count as an `integer` (or `bigint`) column holds it: clamped to the column's range."""
    low, high = (INT32_MIN, INT32_MAX) if bits == 32 else (INT64_MIN, INT64_MAX)
    return min(high, max(low, int(value)))


def pg_revision(value: int | None) -> int | None:
    """A revision as a `bigint` column holds it: None when out of range, or not an int (a
    `bool` is an int to Python, not a revision)."""
    if value is None or isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if INT64_MIN <= value <= INT64_MAX else None


def json_column(text: str) -> Any:
    """A `json`/`jsonb` value as the database sends it (asyncpg's decoder): the value, or an
    `UnreadableJson` saying why `bounded_json` would not read it. Never raises: a decoder that
    raised would fail the whole query, so one row nested 5,000 deep would stop every tenant's
    delivery."""
    try:
        return bounded_json(text)
    except NotJSON as exc:
        return UnreadableJson(str(exc))
