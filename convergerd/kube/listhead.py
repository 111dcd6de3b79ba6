"""What the start of a list answer too large to read says (pure): its `continue` token and
resourceVersion, and the first item's namespace and name.

A list page of one object larger than the response cap cannot be decoded, and without its
`continue` token the list cannot go past that object. kube-apiserver writes a list as
`{"kind", "apiVersion", "metadata": {..., "continue"}, "items": [{"metadata": {"name",
"namespace", ...}, ...}]}` (Go struct order: the list's metadata before the items, an object's
name and namespace first in its metadata), so the first few KiB of the answer hold all three.
`list_head` reads them from those bytes with a small scanner that stops where the bytes end,
never decoding more than those few fields (every other value is skipped, not built).

A watch event too large to read is the same problem on a watch: without its
resourceVersion the watch cannot resume past it. `event_head` reads `{"type", "object":
{"kind", "apiVersion", "metadata": {"name", "namespace", "uid", "resourceVersion", ...}}}`
the same way.

`ListHead.listed` is False when the list's `metadata` was not read before the first item (or
the bytes ended before it): then whether more follows is unknown, and the caller must not
skip (it would end the list early, silently).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from convergerd.core.decode import MAX_NAME_CHARS, MAX_TOKEN_CHARS, bounded_json, clean_text
from convergerd.core.errors import NotJSON

# Read this much of an answer over the cap: the list's metadata (a continue token is at most
# MAX_TOKEN_CHARS) and the first item's name and namespace, in kube-apiserver's order.
HEAD_BYTES = 16 * 1024

_QUOTE, _BACKSLASH = ord('"'), ord("\\")
_OPEN_OBJECT, _CLOSE_OBJECT = ord("{"), ord("}")
_OPEN_ARRAY, _CLOSE_ARRAY = ord("["), ord("]")
_COMMA, _COLON = ord(","), ord(":")
_SPACE = frozenset(b" \t\r\n")


@dataclass(frozen=True, slots=True)
class ListHead:
    listed: bool  # the list's metadata was read whole, before the first item
    continue_token: str | None  # None with `listed`: the first item is the last
    resource_version: str | None  # the list's
    namespace: str | None  # the first item's
    name: str | None


class _End(Exception):
    """The bytes ended (or stopped making sense): what was found so far is the answer."""


class _Reader:
    def __init__(self, data: bytes) -> None:
        self._data = data
        self.at = 0

    def peek(self) -> int:
        data, at = self._data, self.at
        while at < len(data) and data[at] in _SPACE:
            at += 1
        if at >= len(data):
            raise _End
        self.at = at
        return data[at]

    def take(self, char: int) -> None:
        if self.peek() != char:
            raise _End
        self.at += 1

    def raw_string(self) -> bytes:
        """The bytes between the quotes of the string here (escapes left as they are)."""
        self.take(_QUOTE)
        data, start = self._data, self.at
        while True:
            end = data.find(b'"', self.at)
            if end < 0:
                raise _End
            slashes = end
            while slashes > start and data[slashes - 1] == _BACKSLASH:
                slashes -= 1
            self.at = end + 1
            if (end - slashes) % 2 == 0:
                return data[start:end]

    def string(self, limit: int) -> str:
        raw = self.raw_string()
        if len(raw) > 6 * limit:
            raise _End  # longer than any value of this field can be
        try:
            value = bounded_json(b'"' + raw + b'"')
        except NotJSON:
            raise _End from None
        if not isinstance(value, str) or len(value) > limit:
            raise _End
        return value

    def skip(self) -> None:
        """Past the value here, building nothing."""
        char = self.peek()
        if char == _QUOTE:
            self.raw_string()
            return
        if char not in (_OPEN_OBJECT, _OPEN_ARRAY):  # a number or a literal: to its end
            while self.peek() not in (_COMMA, _CLOSE_OBJECT, _CLOSE_ARRAY):
                self.at += 1
            return
        depth = 0
        while True:
            char = self.peek()
            if char == _QUOTE:
                self.raw_string()
                continue
            self.at += 1
            if char in (_OPEN_OBJECT, _OPEN_ARRAY):
                depth += 1
            elif char in (_CLOSE_OBJECT, _CLOSE_ARRAY):
                depth -= 1
                if depth == 0:
                    return

    def members(self) -> Iterator[bytes]:
        """The keys of the object here; the caller reads or skips each value."""
        self.take(_OPEN_OBJECT)
        if self.peek() == _CLOSE_OBJECT:
            self.at += 1
            return
        while True:
            key = self.raw_string()
            self.take(_COLON)
            yield key
            char = self.peek()
            self.at += 1
            if char == _CLOSE_OBJECT:
                return
            if char != _COMMA:
                raise _End


def list_head(data: bytes) -> ListHead:
    """The list's `continue` token and its first item's namespace and name, from the first
    bytes of a list answer (see the module doc)."""
    reader = _Reader(data)
    listed = False
    token: str | None = None
    version: str | None = None
    found: dict[bytes, str] = {}
    try:
        for key in reader.members():
            if key == b"metadata":
                for field in reader.members():
                    if field == b"continue" and reader.peek() == _QUOTE:
                        token = reader.string(MAX_TOKEN_CHARS) or None
                    elif field == b"resourceVersion" and reader.peek() == _QUOTE:
                        version = reader.string(MAX_TOKEN_CHARS) or None
                    else:
                        reader.skip()
                listed = True
            elif key == b"items":
                _first_item(reader, found)
                break
            else:
                reader.skip()
    except _End:
        pass
    return ListHead(listed, token, version, _name(found, b"namespace"), _name(found, b"name"))


def _name(found: dict[bytes, str], key: bytes) -> str | None:
    """A name read from the head, cleaned; None when absent or empty."""
    value = found.get(key)
    return clean_text(value, MAX_NAME_CHARS) if value else None


@dataclass(frozen=True, slots=True)
class EventHead:
    type: str | None  # ADDED, MODIFIED, DELETED (anything else: not read)
    namespace: str | None
    name: str | None
    resource_version: str | None  # None: where the watch goes on is unknown


_OBJECT_EVENTS = frozenset({"ADDED", "MODIFIED", "DELETED"})


def event_head(data: bytes) -> EventHead:
    """The type and the object's namespace, name and resourceVersion, from the first bytes of
    a watch event line (see the module doc)."""
    reader = _Reader(data)
    kind: str | None = None
    found: dict[bytes, str] = {}
    try:
        for key in reader.members():
            if key == b"type" and reader.peek() == _QUOTE:
                kind = reader.string(16)
            elif key == b"object":
                _metadata(reader, found)
                break
            else:
                reader.skip()
    except _End:
        pass
    return EventHead(kind if kind in _OBJECT_EVENTS else None, _name(found, b"namespace"),
                     _name(found, b"name"), found.get(b"resourceVersion") or None)


def _metadata(reader: _Reader, found: dict[bytes, str]) -> None:
    """The name, namespace and resourceVersion of the object here, into `found`."""
    for key in reader.members():
        if key != b"metadata":
            reader.skip()
            continue
        for field in reader.members():
            if field in (b"name", b"namespace") and reader.peek() == _QUOTE:
                found[field] = reader.string(MAX_NAME_CHARS)
            elif field == b"resourceVersion" and reader.peek() == _QUOTE:
                found[field] = reader.string(MAX_TOKEN_CHARS)
            else:
                reader.skip()
        return


def _first_item(reader: _Reader, found: dict[bytes, str]) -> None:
    reader.take(_OPEN_ARRAY)
    _metadata(reader, found)
    found.pop(b"resourceVersion", None)  # the item's, not the list's
