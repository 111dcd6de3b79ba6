"""How a message or a log line shows an untrusted value, and an exception (pure).

One way, used everywhere: `shown(value, limit, style=...)` and `describe(exc)`. Whatever the
value, the result is

- bounded: at most `limit` characters, built from only the start of a long string and the
  first few items and levels of a big or deep container (never an unbounded `repr`, never
  `str()` of a huge integer, no recursion that grows with the value);
- escaped: one line, nothing that can forge a log line or reorder it (line breaks, ESC, NUL,
  lone surrogates, bidi controls and every other non-printable character written as its
  escape, `\\n`, `\\x1b`, `\\u202e`);
- cut one way: a value longer than `limit` ends with `…`. Inside a container, `...` stands for
  the items and levels left out (as Python's own `repr` writes it).

The styles differ only in how the value is written (`"a\\nb"` as each shows it):

- `repr`, `'a\\nb'`: a value or an id quoted in a message, strings quoted and containers as
  Python writes them;
- `text`, `a\\nb`: a string as itself, each non-printable character escaped; request paths,
  ids and texts in log lines;
- `prose`, `a b`: text meant to be read, whitespace runs as one space, then as `text`; table
  cells, error texts, exception messages;
- `json`, `"a\\nb"`: a decoded JSON value as JSON (ASCII), for a field error about decoded
  input.

A value that is not a string shows as `repr` in the `text` and `prose` styles.
"""

from __future__ import annotations

import builtins
import json
import re
import reprlib
import sys
from collections.abc import Iterable, Mapping, Sequence
from enum import Enum
from itertools import islice
from typing import Any, Literal

# How much of an untrusted value a message quotes.
SHOWN_MAX_CHARS = 100
# How much of an exception `describe` shows: room for our own messages, which quote values.
DESCRIBED_MAX_CHARS = 300
ELLIPSIS = "…"

Style = Literal["repr", "text", "prose", "json"]

_WORD = re.compile(r"\S+")
# The json style: containers deeper than this show as `[...]`, so a big `limit` cannot make
# the walk recurse deep (a small one runs out first: each level costs two characters).
_JSON_MAX_LEVEL = 100


def shown(value: object, limit: int = SHOWN_MAX_CHARS, *, style: Style = "repr") -> str:
    """`value` for a message or a log line: one line, escaped, at most `limit` characters,
    written in `style` (see the module docstring)."""
    if style == "json":
        # json.dumps writes every string in ASCII, so only the cut is left to do.
        return _cut(_json(value, limit + 1, 0), limit)
    if isinstance(value, str) and style != "repr":
        return _cut(_escaped(_words(value, limit + 1) if style == "prose" else value[: limit + 1]),
                    limit)
    return _cut(_escaped(_BoundedRepr(limit).repr(value)), limit)


def describe(exc: BaseException, limit: int = DESCRIBED_MAX_CHARS) -> str:
    """`"ExceptionType: message"` (the type alone when there is no message) as `prose`, at
    most `limit` characters. A database error's SQLSTATE (asyncpg's `sqlstate`) follows the
    type, `"UniqueViolationError (SQLSTATE 23505): ..."`: it says what happened when the
    message does not."""
    name = type(exc).__name__
    code = getattr(exc, "sqlstate", None)
    if code:
        name = f"{name} (SQLSTATE {shown(code, 16, style='text')})"
    text = str(exc)
    return shown(f"{name}: {text}" if text.strip() else name, limit, style="prose")


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[: limit - 1] + ELLIPSIS if limit > 0 else ""


def _escaped(text: str) -> str:
    """Each non-printable character as its escape (`\\n`, `\\x00`, `\\ud800`, `\\u202e`)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


def _words(text: str, budget: int) -> str:
    """The words of `text` joined by one space, read only until `budget` characters."""
    words: list[str] = []
    used = 0
    for match in _WORD.finditer(text):
        words.append(text[match.start():min(match.end(), match.start() + budget - used)])
        used += len(words[-1]) + 1
        if used > budget:
            break
    return " ".join(words)


class _BoundedRepr(reprlib.Repr):
    """reprlib's depth and item limits, but strings and bytes keep their start (the part a
    reader recognises), integers too long for `repr` do not raise, a dict keeps its order and
    is not sorted whole, and subclasses of the built-in types are bounded like them."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.maxlevel = 3
        self.maxstring = self.maxother = self.maxlong = limit
        self.maxlist = self.maxtuple = self.maxdict = self.maxset = self.maxfrozenset = 8

    def repr_str(self, x: str, level: int) -> str:
        return builtins.repr(str(x[: self.maxstring + 1]))

    def repr_bytes(self, x: bytes, level: int) -> str:
        return builtins.repr(bytes(x[: self.maxstring + 1]))

    def repr_int(self, x: int, level: int) -> str:
        # Past 4 bits a character repr() is long; past the interpreter's digit limit
        # (sys.get_int_max_str_digits, 4,300 by default) it raises. 3.32 bits a digit.
        digits_cap = sys.get_int_max_str_digits() or 1 << 62
        if x.bit_length() > min(4 * self.maxlong, digits_cap * 3):
            return f"<{x.bit_length()}-bit integer>"
        return builtins.repr(x if type(x) is bool else int(x))

    def repr_dict(self, x: Mapping[object, object], level: int) -> str:
        if not x:
            return "{}"
        if level <= 0:
            return "{...}"
        items = [f"{self.repr1(k, level - 1)}: {self.repr1(v, level - 1)}"
                 for k, v in islice(x.items(), self.maxdict)]
        return "{" + ", ".join(items) + (", ..." if len(x) > self.maxdict else "") + "}"

    def repr_instance(self, x: object, level: int) -> str:
        # A subclass of a built-in type (a defaultdict, an IntEnum) is shown as its base would
        # be, never through a repr of the whole value; anything else by its own repr, cut.
        if isinstance(x, Enum):
            return _cut(builtins.repr(x), self.maxother)
        for kind, method in _BASES:
            if isinstance(x, kind):
                return str(getattr(self, method)(x, level))
        return _cut(builtins.repr(x), self.maxother)


_BASES = ((str, "repr_str"), (bytes, "repr_bytes"), (int, "repr_int"), (dict, "repr_dict"),
          (list, "repr_list"), (tuple, "repr_tuple"), (set, "repr_set"),
          (frozenset, "repr_frozenset"))


def _json(value: object, budget: int, level: int) -> str:
    """`value` as JSON, without walking more of it than `budget` characters show."""
    if isinstance(value, str):
        return json.dumps(value[:budget])
    if value is None or isinstance(value, bool | int | float):
        big = isinstance(value, int) and value.bit_length() >= 64
        return ("<large integer>" if big else json.dumps(value))[:budget]
    if isinstance(value, Mapping):
        return _json_items("{}", value.items(), budget, level)
    if isinstance(value, Sequence):
        return _json_items("[]", value, budget, level)
    return f"<{type(value).__name__}>"


def _json_items(brackets: str, items: Iterable[Any], budget: int, level: int) -> str:
    """A mapping's items (key-value pairs) or a sequence's, as many as `budget` shows."""
    if level >= _JSON_MAX_LEVEL:
        return f"{brackets[0]}...{brackets[1]}"
    parts: list[str] = []
    used = 2
    for item in items:
        if used >= budget:
            parts.append("...")
            break
        left = budget - used
        if brackets == "{}":
            key, item_value = item
            name = key if isinstance(key, str) else _json(key, left, level + 1)
            part = f"{_json(name, left, level + 1)}:{_json(item_value, left, level + 1)}"
        else:
            part = _json(item, left, level + 1)
        parts.append(part)
        used += len(part) + 1
    return brackets[0] + ",".join(parts) + brackets[1]
