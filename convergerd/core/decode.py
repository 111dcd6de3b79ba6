"""What a cluster sends, decoded and bounded (pure): the one place the rule lives.

A member cluster is untrusted input. Its answers reach PostgreSQL (phases, condition messages,
error texts), logs and metrics labels, and none of those takes every string: PostgreSQL text
refuses NUL and lone surrogates, a newline or an ANSI escape forges a log line. So every string
read from a cluster passes `clean_text` (unsafe characters replaced, length capped) and every
field is read with the type it must have:

- an answer that cannot be used as a whole (not JSON, not an object, `items` not a list, an
  item not an object) raises `BadResponse`: that cluster fails for the round, nothing else;
- a field of one object with the wrong type (`status.phase` an object, `conditions` not a
  list, `labels` not a map of strings, `generation` not an integer) reads as absent and is
  noted; `ListedPolicy.from_object` then reports that object's phase as `Unknown`, with the field
  and a shortened value as the reason.

Nothing here raises anything but `BadResponse`, and `NotJSON` from `bounded_json`, the one JSON
decoder of every edge (cluster answers, database rows, HTTP bodies, files): bounded in nesting
depth and integer size, so no input reaches a recursion limit or Python's integer-conversion
limit.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson

from convergerd.core.errors import BadResponse, NotJSON
from convergerd.core.shown import shown

V = TypeVar("V")

MAX_MESSAGE_CHARS = 500  # condition messages, Status messages, cluster error texts
MAX_REASON_CHARS = 128  # phases, condition reasons and statuses, Status reasons
MAX_NAME_CHARS = 253  # object names, label keys (DNS subdomain)
MAX_LABEL_VALUE_CHARS = 63
MAX_VERSION_CHARS = 64  # /version gitVersion
MAX_TOKEN_CHARS = 4096  # resourceVersion, continue tokens (opaque, sent back or shown)
MAX_REASON_PHRASE_CHARS = 64
# PostgreSQL bigint: a revision or generation outside it cannot be stored.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

REPLACEMENT = "\ufffd"
ELLIPSIS = "…"
# Line breaks and tabs become spaces (a message stays on one log line) ...
_SPACES = re.compile("[\t\n\v\f\r\x1c-\x1f\x85\u2028\u2029]")
# ... and what PostgreSQL, a log line or a label value cannot hold safely becomes U+FFFD: C0 and
# C1 controls (NUL, ESC), DEL, lone surrogates, and the bidi controls that reorder a line.
_UNSAFE = re.compile(
    "[\x00-\x08\x0e-\x1b\x7f-\x84\x86-\x9f\ud800-\udfff\u202a-\u202e\u2066-\u2069]"
)


def clean_text(value: str, limit: int) -> str:
    """`value` safe to store, log and label: unsafe characters replaced (NUL, other controls,
    lone surrogates, bidi controls -> U+FFFD; line breaks and tabs -> space), at most `limit`
    characters (a cut one ends with "…")."""
    if not value.isprintable():
        value = _UNSAFE.sub(REPLACEMENT, _SPACES.sub(" ", value))
    if len(value) > limit:
        value = value[: max(0, limit - 1)] + ELLIPSIS
    return value


def _type_name(value: object) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
            int: "a number", float: "a number", type(None): "null"}.get(type(value), "a value")


def expected(field: str, what: str, value: object) -> str:
    """`"status.phase: expected a string, got {...}"`."""
    return f"{field}: expected {what}, got {_type_name(value)} {shown(value, style='json')}"


# --- whole answers: BadResponse ------------------------------------------------------------


# --- JSON, at every edge: bounded ----------------------------------------------------------

# Deeper than any object this product reads (a Policy, a list page, a rule, a status document:
# under 15) and far under the interpreter's recursion limit, so nothing that later walks a
# decoded value (`json.dumps`, `==`, asyncpg's encoder) can reach it.
MAX_JSON_DEPTH = 100
# Integers past this many digits are refused before `int()` sees them: Python's own limit
# (4,300 digits) raises ValueError, and converting even that many is quadratic.
MAX_JSON_INT_DIGITS = 100

def _depth_within(value: Any, limit: int) -> bool:
    """Whether a decoded value nests at most `limit` containers deep (iterative). Only for an
    outline that does not pair up, which a text orjson read cannot have: a guard."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    pop, push = stack.pop, stack.append
    while stack:
        item, depth = pop()
        children = item.values() if type(item) is dict else item
        for child in children:
            kind = type(child)
            if kind is dict or kind is list:
                if depth >= limit:
                    return False
                push((child, depth + 1))
    return True


# An answer's outline, made by two passes in C (`bytes.translate`), so that the checks of an
# answer before and after orjson are searches in C, not walks in Python (a 100-Policy page:
# bench/RESULTS.md, "The JSON checks in one outline"). First each byte to its class: digits
# -> "1", openers -> "(", closers -> ")", quotes stay, every other byte -> "0".
_CLASSES = bytes(
    0x31 if 0x30 <= b <= 0x39 else 0x28 if b in b"[{" else 0x29 if b in b"]}"
    else 0x22 if b == 0x22 else 0x30
    for b in range(256)
)
# 19 digits or more may not fit in 64 bits (int64 holds 18 digits whatever their values). A
# run inside a string only costs the slower decoder.
_LONG_DIGITS = 19
_DIGIT_RUN = b"1" * _LONG_DIGITS


# A string of the outline once the strings without brackets are gone: its brackets.
_QUOTED = re.compile(b'"[^"]*"')
# Under this many bytes, the brackets are counted first (wherever they are: a bound, in C) and
# the strings dropped only when there are more than a bound allows: a single object's answer
# (a save's, a probe's) pays two short passes. A longer text (a list page) has more anyway.
_COUNT_FIRST_BYTES = 16_384


class _StringsOverLimit(Exception):
    """More strings holding brackets than an answer's containers may number."""

    def __init__(self, count: int) -> None:
        super().__init__(count)
        self.count = count


class _Outline:
    """What the checks need of a JSON text: whether it holds a run of `_LONG_DIGITS` ASCII
    digits (in a string or not), its containers and its nesting, from its brackets outside
    strings (openers as "(", closers as ")")."""

    __slots__ = ("_brackets", "_classes", "_openers", "long_digits")

    def __init__(self, data: bytes | str) -> None:
        raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
        # Escapes occur only inside strings: the two that could hide a quote (an escaped
        # backslash, then an escaped quote) go first, so every quote left delimits a string
        # (a UTF-8 sequence holds no ASCII byte).
        if b"\\" in raw:
            raw = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
        self._classes = raw.translate(_CLASSES)
        self.long_digits = _DIGIT_RUN in self._classes
        # Brackets in strings too: a bound on the containers and the nesting.
        self._openers = (self._classes.count(b"(") if len(raw) < _COUNT_FIRST_BYTES
                         else None)
        self._brackets: bytes | None = None

    def _bracketed(self) -> bytes:
        """The brackets, and the strings that hold brackets (their quotes and brackets only):
        two adjacent quotes removed keep every other byte on its side of them, so the
        strings without brackets (nearly all) go in C."""
        if self._brackets is None:
            self._brackets = self._classes.translate(None, b"01").replace(b'""', b"")
        return self._brackets

    def _outside_strings(self) -> bytes:
        brackets = self._bracketed()
        if b'"' in brackets:
            # The strings left, which hold brackets, go by a regex: one pass, but one piece
            # per string inside it, which `containers` bounds.
            self._brackets = brackets = _QUOTED.sub(b"", brackets)
        return brackets

    def containers(self, limit: int) -> int:
        """The JSON objects and arrays outside strings, exactly when over `limit`, else an
        upper bound. `_StringsOverLimit` when the strings holding brackets alone are over
        `limit`: each decodes into an object too, and telling their brackets from the
        containers' costs memory per string (a page of `["["]` items under the size cap:
        bench/RESULTS.md, "Strings of brackets bounded")."""
        if self._openers is not None and self._openers <= limit:
            return self._openers
        strings = self._bracketed().count(b'"') // 2  # strings next to each other count as one
        if strings > limit:
            raise _StringsOverLimit(strings)
        return self._outside_strings().count(b"(")

    def nesting_within(self, limit: int) -> bool | None:
        """Whether the text nests at most `limit` containers deep: the innermost pairs
        removed once per level (a non-overlapping `replace` removes exactly one level). None
        when the brackets do not pair up (not a text a parser accepted)."""
        if self._openers is not None and self._openers <= limit:
            return True
        brackets = self._outside_strings()
        for _ in range(limit):
            if not brackets:
                return True
            shorter = brackets.replace(b"()", b"")
            if len(shorter) == len(brackets):
                return None
            brackets = shorter
        return not brackets


def _bounded_int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_JSON_INT_DIGITS:
        raise NotJSON(f"an integer of {digits} digits (at most {MAX_JSON_INT_DIGITS})")
    return int(text)


def _finite_float(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise NotJSON(f"a number out of range ({len(text)} characters)")
    return number


def _no_constants(name: str) -> Any:
    raise NotJSON(f"{name} is not JSON")


def bounded_json(data: bytes | str, *, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """The JSON value in `data`, or `NotJSON` saying why not: not JSON (NaN and Infinity are
    not), nested deeper than `max_depth`, an integer of more than `MAX_JSON_INT_DIGITS`
    digits, a number out of a double's range. Nothing else escapes, whatever the input: this
    is the one JSON decoder of every edge (cluster answers, database rows, HTTP bodies, files).

    orjson reads what real servers send (valid UTF-8, nesting up to 1,024, no recursion in
    Python) several times faster than `json`; what it refuses (a lone surrogate escape,
    text that is not UTF-8) is read again by `json`, after a recursion-free depth check, so
    such an answer reads as it always did and is cleaned later by the field decoders. Sizes
    are bounded where the bytes are read (`read_capped`, the HTTP server, file readers)."""
    return _decoded(data, max_depth, _Outline(data))


def _decoded(data: bytes | str, max_depth: int, outline: _Outline) -> Any:
    if outline.long_digits:
        # orjson reads an integer past 64 bits as a float; `json` keeps it exact (and bounded).
        return _fallback(data, max_depth, outline)
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError:
        value = _fallback(data, max_depth, outline)
    else:
        if isinstance(value, dict | list):
            within = outline.nesting_within(max_depth)
            if within is None:
                within = _depth_within(value, max_depth)
            if not within:
                raise NotJSON(f"nested deeper than {max_depth} levels")
    return value


def _fallback(data: bytes | str, max_depth: int, outline: _Outline) -> Any:
    within = outline.nesting_within(max_depth)
    if within is None:
        # Brackets outside strings that never pair up: not JSON. Refused here, since the
        # parser would recurse into every unclosed one first.
        raise NotJSON("not JSON (unbalanced brackets)")
    if not within:
        raise NotJSON(f"nested deeper than {max_depth} levels")
    try:
        return json.loads(data, parse_constant=_no_constants, parse_int=_bounded_int,
                          parse_float=_finite_float)
    except NotJSON:
        raise
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        # RecursionError cannot come from a text the depth check passed (nesting within the
        # bound, brackets balanced); kept so that a mistake here fails the one input only.
        raise NotJSON(f"not JSON ({type(exc).__name__})") from None


# --- what an answer may cost: bytes are not enough --------------------------------------------

# 16 MB of `{},{},...` is 5.3 million dicts (gigabytes and seconds of a blocked loop:
# bench/RESULTS.md, "Figures once quoted in the code"): an answer is
# bounded by what it decodes into, its JSON containers (objects and arrays), not only by its
# bytes. The default of every cluster answer: several times a legitimate 500-item page of any
# kind this product reads (a Policy is about 30 containers, a Pod with managedFields about 150),
# and tens of MB of Python objects at worst. Each edge's own `Cost` is smaller where it can be.
ANSWER_MAX_CONTAINERS = 250_000


@dataclass(frozen=True, slots=True)
class Cost:
    """What one answer from a cluster may cost: its body's bytes (None: the response cap,
    `CONVERGERD_MAX_RESPONSE_BYTES`, the only one a setting sets) and the JSON objects and
    arrays it decodes into. A list page is also bounded by the `limit` sent
    (`list_page`), a list by its pages and items (`ListBudget`)."""

    max_bytes: int | None = None
    max_containers: int = ANSWER_MAX_CONTAINERS


def parse_json(body: bytes, what: str, *, max_containers: int = ANSWER_MAX_CONTAINERS) -> Any:
    """The JSON document in a cluster's `body`; `BadResponse` naming `what` when it holds
    more than `max_containers` objects and arrays (counted before anything is decoded) or
    when `bounded_json` will not read it. One outline serves both checks."""
    outline = _Outline(body)
    try:
        count = outline.containers(max_containers)
    except _StringsOverLimit as over:
        raise BadResponse(f"{what} holds at least {over.count:,} strings with brackets in "
                          f"them, more than the {max_containers:,} JSON objects and arrays "
                          "it may cost") from None
    if count > max_containers:
        raise BadResponse(f"{what} holds {count:,} JSON objects and arrays, more than the "
                          f"{max_containers:,} it may cost")
    try:
        return _decoded(body, MAX_JSON_DEPTH, outline)
    except NotJSON as exc:
        raise BadResponse(f"{what} is not JSON: {exc}") from None


def parse_object(body: bytes, what: str, *,
                 max_containers: int = ANSWER_MAX_CONTAINERS) -> dict[str, Any]:
    doc = parse_json(body, what, max_containers=max_containers)
    if not isinstance(doc, dict):
        raise BadResponse(
            f"{what} is not a JSON object: got {_type_name(doc)} {shown(doc, style='json')}")
    return doc


@dataclass(frozen=True, slots=True)
class ListPage:
    """One page of a list: the items (each an object, not yet decoded further), the continue
    token (None on the last page) and the list's resourceVersion."""

    items: list[dict[str, Any]]
    continue_token: str | None
    resource_version: str


def list_page(doc: Mapping[str, Any], *, api_version: str | None = None,
              kind: str | None = None, limit: int | None = None) -> ListPage:
    """A list answer's shape, checked: `BadResponse` when it cannot be used — when it is not
    a list of what was asked (`api_version`, and `kind`, e.g. `"PolicyList"`, or any
    `...List` when None; neither is checked without `api_version`), has no `items` (an
    apiserver always sends them: `[]`, or `null` for none), or holds more items than the
    `limit` sent (the server's protocol error; a page may hold fewer)."""
    if api_version is not None:
        if doc.get("apiVersion") != api_version:
            raise BadResponse(expected("list answer: apiVersion", repr(api_version),
                                       doc.get("apiVersion")))
        got = doc.get("kind")
        if not (got == kind if kind is not None
                else isinstance(got, str) and got.endswith("List")):
            raise BadResponse(expected("list answer: kind", repr(kind or "...List"), got))
    if "items" not in doc:
        raise BadResponse("list answer: no items (not a list answer)")
    items = doc["items"]
    if items is None:
        items = []
    if not isinstance(items, list):
        raise BadResponse(expected("list answer: items", "a list", items))
    if limit is not None and len(items) > limit:
        raise BadResponse(f"list answer: {len(items):,} items, more than the limit of {limit} "
                          "asked")
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            raise BadResponse(expected(f"list answer: items[{index}]", "an object", item))
    meta = doc.get("metadata")
    if meta is None:
        meta = {}
    if not isinstance(meta, dict):
        raise BadResponse(expected("list answer: metadata", "an object", meta))
    token = _token(meta, "continue")
    version = clean_text(_token(meta, "resourceVersion") or "", MAX_TOKEN_CHARS)
    return ListPage(items=items, continue_token=token or None, resource_version=version)


@dataclass(frozen=True, slots=True)
class ListBudget:
    """What one whole list may cost beyond each page's `Cost`: its pages and items. A server
    that hands out a fresh `continue` forever, or one item a page, is cut here, not only by
    the deadline."""

    max_items: int
    max_pages: int

    def check(self, *, pages: int, items: int) -> None:
        if items > self.max_items:
            raise BadResponse(f"list answer: more than {self.max_items:,} items in all")
        if pages >= self.max_pages:
            raise BadResponse(f"list answer: still not at its end after {pages:,} pages")


def same_object(doc: Mapping[str, Any], sent: Mapping[str, Any], what: str) -> None:
    """`BadResponse` unless the answer `doc` is the object `sent` (applied, or asked for by
    name): the same apiVersion, kind, name and namespace, and the same `spec.revision` when
    one was sent. A 200 from elsewhere, or of something else, is never a delivery."""
    meta = doc.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    want = sent.get("metadata", {})
    pairs = [("apiVersion", doc.get("apiVersion"), sent.get("apiVersion")),
             ("kind", doc.get("kind"), sent.get("kind")),
             ("metadata.name", meta.get("name"), want.get("name")),
             ("metadata.namespace", meta.get("namespace"), want.get("namespace"))]
    spec, sent_spec = doc.get("spec"), sent.get("spec")
    if isinstance(sent_spec, dict) and "revision" in sent_spec:
        pairs.append(("spec.revision", spec.get("revision") if isinstance(spec, dict) else None,
                      sent_spec["revision"]))
    for field, got, wanted in pairs:
        if wanted is not None and got != wanted:
            raise BadResponse(f"{what} is not the object asked for: {field}: expected "
                              f"{shown(wanted, style='json')}, got {shown(got, style='json')}")


def _token(meta: Mapping[str, Any], key: str) -> str | None:
    """An opaque token: sent back to the same cluster as is (continue), shown cleaned
    (resourceVersion)."""
    value = meta.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise BadResponse(expected(f"list answer: metadata.{key}", "a string", value))
    if len(value) > MAX_TOKEN_CHARS:
        raise BadResponse(f"list answer: metadata.{key}: longer than {MAX_TOKEN_CHARS} "
                          f"characters: {shown(value, style='json')}")
    return value


def git_version(doc: Mapping[str, Any]) -> str:
    """`gitVersion` of a /version answer, cleaned; `BadResponse` when it is not a string."""
    value = doc.get("gitVersion", "")
    if not isinstance(value, str):
        raise BadResponse(expected("/version answer: gitVersion", "a string", value))
    return clean_text(value, MAX_VERSION_CHARS)


# --- error answers: never raise ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StatusBody:
    """What an error answer says, cleaned: a `Status` object's message, reason,
    `details.retryAfterSeconds` and `details.name`; a body that is not a Status (a proxy's
    page, the usual plain-text 429) gives its text as the message."""

    message: str | None = None
    reason: str | None = None
    retry_after_s: float | None = None
    details_name: str | None = None


def status_body(body: bytes) -> StatusBody:
    """Never raises: what cannot be read is left out."""
    if not body:
        return StatusBody()
    try:
        doc = bounded_json(body)
    except NotJSON:
        return StatusBody(message=message_text(body.decode("utf-8", "replace")))
    if not isinstance(doc, dict):
        return StatusBody()
    details = doc.get("details")
    details = details if isinstance(details, dict) else {}
    name = details.get("name")
    return StatusBody(
        message=message_text(doc.get("message")),
        reason=short_text(doc.get("reason")),
        retry_after_s=seconds(details.get("retryAfterSeconds")),
        details_name=clean_text(name, MAX_NAME_CHARS) if isinstance(name, str) else None,
    )


def message_text(value: object) -> str | None:
    """A readable message: whitespace runs collapsed to one space, cleaned, capped at
    `MAX_MESSAGE_CHARS`; None when `value` is not a non-empty string."""
    if not isinstance(value, str):
        return None
    # Only the head is split: a 16 MiB message is not split whole.
    head = value[: 2 * MAX_MESSAGE_CHARS]
    text = " ".join(head.split())
    if len(head) < len(value):
        text = text[: MAX_MESSAGE_CHARS - 1] + ELLIPSIS
    return clean_text(text, MAX_MESSAGE_CHARS) or None


# What an answer's `Warning` headers may give: kube-apiserver writes one header per warning,
# `299 - "<text>"` (RFC 7234 warn-code, warn-agent, quoted warn-text with `\"` and `\\`
# escaped, an optional quoted date); several may share one header, comma-separated. Only code
# 299 (a miscellaneous persistent warning: what admission writes) is kept, at most
# `MAX_WARNINGS` of them, each cleaned and capped as a message.
MAX_WARNINGS = 16
_WARNING = re.compile(r'\s*(\d{3})\s+[^\s"]+\s+"((?:[^"\\]|\\.)*)"(?:\s+"[^"]*")?\s*(?:,|$)')
_ESCAPED = re.compile(r"\\(.)")


def warning_texts(headers: Sequence[str]) -> tuple[str, ...]:
    """The texts of code-299 warnings in `Warning` header values, unescaped, cleaned and
    capped (`MAX_MESSAGE_CHARS` each, `MAX_WARNINGS` in all); a value that does not parse is
    skipped from where it stops parsing."""
    found: list[str] = []
    for value in headers[: 4 * MAX_WARNINGS]:
        at = 0
        while len(found) < MAX_WARNINGS and at < len(value):
            match = _WARNING.match(value, at)
            if match is None:
                break
            at = match.end()
            if match.group(1) == "299":
                text = _ESCAPED.sub(r"\1", match.group(2))
                found.append(clean_text(text, MAX_MESSAGE_CHARS))
    return tuple(found)


def short_text(value: object, limit: int = MAX_REASON_CHARS) -> str | None:
    """A short string (a reason, a phase), cleaned and capped; None when not a string."""
    if not isinstance(value, str):
        return None
    return clean_text(value, limit) or None


def seconds(value: object) -> float | None:
    """A non-negative, finite number of seconds (a JSON number, or the delta-seconds form of a
    `Retry-After` header); None for anything else (booleans, strings in a JSON body, NaN)."""
    if isinstance(value, str):
        try:
            value = float(value.strip()[:32])
        except ValueError:
            return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) and number >= 0 else None


def rfc3339(value: object) -> dt.datetime | None:
    """An RFC 3339 time with a zone, in UTC; None for anything else (a string of more than 40
    characters is not one). Equal texts give one object (`_rfc3339_text`)."""
    if not isinstance(value, str) or len(value) > 40:
        return None
    return _rfc3339_text(value)


# The times read back from clusters repeat (a cluster's operator writes the same read or pass
# time on many Policies; `status.admission.since` is shared by the policies saved together):
# one object per distinct text recently read, not one per reading kept (48 bytes each, at
# 10,000 x 100 readings; bench/RESULTS.md, "Admission counts read back"). Bounded; the
# objects are immutable.
@functools.lru_cache(maxsize=1 << 14)
def _rfc3339_text(value: str) -> dt.datetime | None:
    try:
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return None
    if parsed.tzinfo is None:
        return None
    try:
        return parsed.astimezone(dt.UTC)
    except OverflowError:
        return None


# A time a cluster sends that is later than now by more than this is not a clock difference
# between machines: it names something that has not happened, so it is not trusted.
CLOCK_SKEW_S = 60.0


def in_the_future(moment: dt.datetime, now: dt.datetime) -> bool:
    """Whether a time read from a cluster is after `now` by more than `CLOCK_SKEW_S`."""
    return (moment - now).total_seconds() > CLOCK_SKEW_S


def as_int(value: object) -> int | None:
    """An integer that fits PostgreSQL's bigint (booleans are not integers); else None."""
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if INT64_MIN <= value <= INT64_MAX else None


# --- fields of one object: noted, never raised ---------------------------------------------


class FieldReader:
    """Typed reads from one object listed from a cluster. A field with the wrong type reads as
    absent (None, or empty) and is noted in `problems` ("field: expected ..., got ...");
    a missing field (or null) is not a problem."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    @property
    def problem(self) -> str | None:
        """The first problem, and how many more; None when there was none."""
        if not self.problems:
            return None
        more = len(self.problems) - 1
        first = self.problems[0]
        return clean_text(f"{first} (and {more} more)" if more else first, MAX_MESSAGE_CHARS)

    def _note(self, field: str, what: str, value: object) -> None:
        self.problems.append(expected(field, what, value))

    def mapping(self, obj: Mapping[str, Any], key: str, field: str) -> Mapping[str, Any]:
        value = obj.get(key)
        if type(value) is dict:  # what JSON gives: skip the (slow) ABC check below
            return value
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            self._note(field, "an object", value)
            return {}
        return value

    def sequence(self, obj: Mapping[str, Any], key: str, field: str) -> Sequence[Any]:
        value = obj.get(key)
        if value is None:
            return ()
        if not isinstance(value, list):
            self._note(field, "a list", value)
            return ()
        return value

    def text(self, obj: Mapping[str, Any], key: str, field: str, limit: int) -> str | None:
        value = obj.get(key)
        if value is None:
            return None
        if not isinstance(value, str):
            self._note(field, "a string", value)
            return None
        return clean_text(value, limit)

    def message(self, obj: Mapping[str, Any], key: str, field: str) -> str | None:
        value = obj.get(key)
        if value is not None and not isinstance(value, str):
            self._note(field, "a string", value)
        return message_text(value)

    def _converted(self, obj: Mapping[str, Any], key: str, field: str,
                   convert: Callable[[object], V | None], what: str) -> V | None:
        """`convert` of the field: absent when missing or null; absent and noted as not
        `what` when `convert` refuses it."""
        value = obj.get(key)
        if value is None:
            return None
        converted = convert(value)
        if converted is None:
            self._note(field, what, value)
        return converted

    def integer(self, obj: Mapping[str, Any], key: str, field: str) -> int | None:
        return self._converted(obj, key, field, as_int, "an integer")

    def time(self, obj: Mapping[str, Any], key: str, field: str) -> dt.datetime | None:
        """An RFC 3339 time with a zone (`2025-01-02T03:04:05Z`), in UTC; anything else is
        absent and noted."""
        return self._converted(obj, key, field, rfc3339, "an RFC 3339 time")

    def labels(self, obj: Mapping[str, Any], key: str, field: str) -> dict[str, str]:
        """A map of strings to strings; entries of another type are left out (and noted)."""
        value = self.mapping(obj, key, field)
        out: dict[str, str] = {}
        for name, item in value.items():
            if not isinstance(name, str) or not isinstance(item, str):
                self._note(f"{field}[{shown(name, 40, style='json')}]", "a string", item)
                continue
            out[clean_text(name, MAX_NAME_CHARS)] = clean_text(item, MAX_LABEL_VALUE_CHARS)
        return out


# --- watch events: BadResponse -----------------------------------------------------------

WATCH_EVENT_TYPES = frozenset({"ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"})


@dataclass(frozen=True, slots=True)
class WatchLine:
    """One watch event line, its shape checked (the object itself is decoded by its user)."""

    type: str
    object: dict[str, Any]
    name: str | None
    resource_version: str | None
    code: int | None


def watch_line(line: bytes) -> WatchLine:
    """A watch event line (`{"type": ..., "object": {...}}`), checked: `BadResponse` when it
    cannot be used (not JSON, unknown type, object not an object, an object event without a
    name or resourceVersion)."""
    doc = parse_object(line, "watch event")
    kind = doc.get("type")
    if kind not in WATCH_EVENT_TYPES:
        raise BadResponse(expected("watch event: type", "a watch event type", kind))
    obj = doc.get("object")
    if not isinstance(obj, dict):
        raise BadResponse(expected("watch event: object", "an object", obj))
    if kind == "ERROR":
        code = as_int(obj.get("code"))
        return WatchLine(kind, obj, None, None, code)
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        raise BadResponse(expected("watch event: object.metadata", "an object", meta))
    version = meta.get("resourceVersion")
    if not isinstance(version, str) or not version or len(version) > MAX_TOKEN_CHARS:
        raise BadResponse(expected("watch event: metadata.resourceVersion", "a string", version))
    name = meta.get("name")
    if kind != "BOOKMARK" and (not isinstance(name, str) or not name
                               or len(name) > MAX_NAME_CHARS):
        raise BadResponse(expected("watch event: metadata.name", "a name", name))
    return WatchLine(kind, obj, name if isinstance(name, str) else None, version, None)
