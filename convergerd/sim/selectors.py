"""labelSelector and fieldSelector parsing and matching.

The label grammar and error texts follow `k8s.io/apimachinery/pkg/labels/selector.go` (a lexer
plus a recursive-descent parser); field selectors follow `pkg/fields/selector.go`. Parse errors
become 400 BadRequest with the library's message, as the list handler does.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from convergerd.admission.labels import LabelSelector, Requirement, SelectorError
from convergerd.sim import status

if TYPE_CHECKING:
    from convergerd.sim.resources import ResourceType


# --- label selectors ------------------------------------------------------------------------

_SPECIAL = "=!(),><"
_KEYWORDS = {"in": "in", "notin": "notin"}
_SYMBOLS = frozenset({"=", "==", "!=", "!", "(", ")", ",", ">", "<"})
_BINARY_OPS = "in, notin, =, ==, !=, gt, lt"
_END = "end"
_ID = "id"
_ERR = "error"

_NAME_RE = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
# apimachinery's IsDNS1123Subdomain (at most 253 characters), also used by the store for names.
DNS_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' "
    "or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex "
    "used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
_VALUE_RE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_NAME_MSG = (
    "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and "
    "end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex "
    "used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
)
_VALUE_MSG = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or "
    "'my_value',  or '12345', regex used for validation is "
    "'(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
)


def _lex(text: str) -> list[tuple[str, str]]:
    """Tokens as (kind, literal); kind is a symbol, "in"/"notin", "id", "end" or "error"."""
    tokens: list[tuple[str, str]] = []
    i, n = 0, len(text)
    while True:
        while i < n and text[i] in " \t\r\n":
            i += 1
        if i >= n:
            tokens.append((_END, ""))
            return tokens
        if text[i] in _SPECIAL:
            j = i
            best = ""
            while j < n and text[j] in _SPECIAL:
                if text[i : j + 1] in _SYMBOLS:
                    best = text[i : j + 1]
                elif best:
                    break
                j += 1
            if not best:
                tokens.append((_ERR, f"error expected: keyword found '{text[i:j]}'"))
                return tokens
            tokens.append((best, best))
            i += len(best)
            continue
        j = i
        while j < n and text[j] not in _SPECIAL and text[j] not in " \t\r\n":
            j += 1
        word = text[i:j]
        tokens.append((_KEYWORDS.get(word, _ID), word))
        i = j


class _LabelParser:
    def __init__(self, text: str) -> None:
        self.tokens = _lex(text)
        self.pos = 0

    def _peek(self, values: bool = True) -> tuple[str, str]:
        kind, lit = self.tokens[self.pos]
        if values and kind in ("in", "notin"):
            kind = _ID
        return kind, lit

    def _next(self, values: bool = True) -> tuple[str, str]:
        tok = self._peek(values)
        self.pos += 1
        return tok

    def parse(self) -> LabelSelector:
        reqs: list[Requirement] = []
        while True:
            kind, lit = self._peek()
            if kind == _ERR:
                raise SelectorError(f"unable to parse requirement: {lit}")
            if kind == _END:
                break
            if kind not in (_ID, "!"):
                raise SelectorError(f"found '{lit}', expected: !, identifier, or 'end of string'")
            try:
                reqs.append(self._requirement())
            except SelectorError as exc:
                raise SelectorError(f"unable to parse requirement: {exc}") from None
            kind, lit = self._next()
            if kind == _END:
                break
            if kind != ",":
                raise SelectorError(f"found '{lit}', expected: ',' or 'end of string'")
            kind2, lit2 = self._peek()
            if kind2 not in (_ID, "!"):
                raise SelectorError(f"found '{lit2}', expected: identifier after ','")
        return LabelSelector(tuple(sorted(reqs, key=lambda r: r.key)))

    def _requirement(self) -> Requirement:
        kind, lit = self._next()
        negated = kind == "!"
        if negated:
            kind, lit = self._next()
        if kind != _ID:
            raise SelectorError(f"found '{lit}', expected: identifier")
        _validate_key(lit)
        key = lit
        if self._peek()[0] in (_END, ","):
            return Requirement(key, "!" if negated else "exists", frozenset())
        if negated:
            # `!k=v` is not a thing: the lexer already consumed "!", the next token is the op
            raise SelectorError(f"found '{self._peek()[1]}', expected: ',' or 'end of string'")
        op = self._operator()
        values = self._set_values() if op in ("in", "notin") else self._exact_value()
        for v in values:
            _validate_value(key, v, op)
        return Requirement(key, op, frozenset(values))

    def _operator(self) -> str:
        kind, lit = self._next(values=False)
        ops = {"in": "in", "notin": "notin", "=": "=", "==": "=", "!=": "!=", ">": "gt", "<": "lt"}
        if kind not in ops:
            raise SelectorError(f"found '{lit}', expected: {_BINARY_OPS}")
        return ops[kind]

    def _set_values(self) -> set[str]:
        kind, lit = self._next()
        if kind != "(":
            raise SelectorError(f"found '{lit}' expected: '('")
        kind, lit = self._peek()
        if kind == ")":
            self._next()
            return {""}
        if kind not in (_ID, ","):
            raise SelectorError(f"found '{lit}', expected: ',', ')' or identifier")
        values: set[str] = set()
        while True:
            kind, lit = self._next()
            if kind == _ID:
                values.add(lit)
                kind2, lit2 = self._peek()
                if kind2 == ")":
                    self._next()
                    return values
                if kind2 != ",":
                    raise SelectorError(f"found '{lit2}', expected: ',' or ')'")
            elif kind == ",":
                if not values:
                    values.add("")  # "(,a)" holds the empty value
                if self._peek()[0] == ")":
                    values.add("")
                    self._next()
                    return values
            else:
                raise SelectorError(f"found '{lit}', expected: ',', or identifier")

    def _exact_value(self) -> set[str]:
        kind, lit = self._peek()
        if kind in (_END, ","):
            return {""}
        self._next()
        if kind != _ID:
            raise SelectorError(f"found '{lit}', expected: identifier")
        return {lit}


def _validate_key(key: str) -> None:
    prefix, _, name = key.rpartition("/")
    errs: list[str] = []
    if "/" in key and not prefix:
        errs.append("prefix part must be non-empty")
    elif prefix and (len(prefix) > 253 or not DNS_SUBDOMAIN_RE.match(prefix)):
        errs.append(f"prefix part {SUBDOMAIN_MSG}")
    if not name:
        errs.append("name part must be non-empty")
    elif len(name) > 63:
        errs.append("name part must be no more than 63 characters")
    elif not _NAME_RE.match(name):
        errs.append(_NAME_MSG)
    if errs:
        raise SelectorError(f"key: Invalid value: {status._q(key)}: {'; '.join(errs)}")


def _validate_value(key: str, value: str, op: str) -> None:
    if op in ("gt", "lt"):
        try:
            int(value)
        except ValueError:
            raise SelectorError(
                f"values[0]: Invalid value: {status._q(value)}: "
                "for 'Gt', 'Lt' operators, the value must be an integer"
            ) from None
        return
    if len(value) > 63 or not _VALUE_RE.match(value):
        detail = "must be no more than 63 characters" if len(value) > 63 else _VALUE_MSG
        raise SelectorError(f"values[0][{key}]: Invalid value: {status._q(value)}: {detail}")


def parse_label_selector(text: str) -> LabelSelector:
    """Parse a labelSelector query value; raise ApiError 400 with the library's wording."""
    if not text.strip():
        return LabelSelector()
    try:
        return _LabelParser(text).parse()
    except SelectorError as exc:
        raise status.bad_request(str(exc)) from None


# --- field selectors ------------------------------------------------------------------------

FieldGetter = Callable[[Mapping[str, Any]], str]


def _path(*keys: str) -> FieldGetter:
    def get(obj: Mapping[str, Any]) -> str:
        cur: Any = obj
        for k in keys:
            if not isinstance(cur, Mapping):
                return ""
            cur = cur.get(k)
        if cur is None:
            return ""
        if isinstance(cur, bool):
            return "true" if cur else "false"
        return str(cur)

    return get


_META_FIELDS: dict[str, FieldGetter] = {
    "metadata.name": _path("metadata", "name"),
    "metadata.namespace": _path("metadata", "namespace"),
}
# Per-resource field labels beyond metadata (GetAttrs / field label conversion funcs).
_EXTRA_FIELDS: dict[str, dict[str, FieldGetter]] = {
    "namespaces": {"name": _path("metadata", "name"), "status.phase": _path("status", "phase")},
    "pods": {
        "spec.nodeName": _path("spec", "nodeName"),
        "spec.restartPolicy": _path("spec", "restartPolicy"),
        "spec.schedulerName": _path("spec", "schedulerName"),
        "spec.serviceAccountName": _path("spec", "serviceAccountName"),
        "spec.hostNetwork": _path("spec", "hostNetwork"),
        "status.phase": _path("status", "phase"),
        "status.podIP": _path("status", "podIP"),
        "status.nominatedNodeName": _path("status", "nominatedNodeName"),
    },
}


@dataclass(frozen=True, slots=True)
class FieldTerm:
    field: str
    getter: FieldGetter
    value: str
    negated: bool

    def matches(self, obj: Mapping[str, Any]) -> bool:
        return (self.getter(obj) == self.value) != self.negated


@dataclass(frozen=True, slots=True)
class FieldSelector:
    terms: tuple[FieldTerm, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.terms

    def matches(self, obj: Mapping[str, Any]) -> bool:
        return all(t.matches(obj) for t in self.terms)


def _split_unescaped(text: str, sep: str) -> list[str]:
    parts, cur, escaped = [], [], False
    for ch in text:
        if escaped:
            cur.append("\\" + ch)
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == sep:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if escaped:
        cur.append("\\")
    parts.append("".join(cur))
    return parts


def _unescape(value: str) -> str:
    out, escaped = [], False
    for ch in value:
        if escaped:
            if ch not in "\\,=":
                raise SelectorError(f"invalid field selector: invalid escape sequence: \\{ch}")
            out.append(ch)
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch in ",=":
            raise SelectorError(f"invalid field selector: unescaped character: {ch}")
        else:
            out.append(ch)
    if escaped:
        raise SelectorError("invalid field selector: invalid escape sequence: \\")
    return "".join(out)


def _split_term(term: str) -> tuple[str, str, str] | None:
    # mirrors fields.splitTerm: the first of "!=", "==", "=" at the lowest index wins
    for i in range(len(term)):
        if term[i] == "\\":
            continue
        for op in ("!=", "==", "="):
            if term.startswith(op, i) and (i == 0 or term[i - 1] != "\\"):
                return term[:i], op, term[i + len(op) :]
    return None


def parse_field_selector(text: str, rt: ResourceType) -> FieldSelector:
    """Parse a fieldSelector for `rt`; unknown field labels are 400 like the real server."""
    try:
        return _parse_fields(text, rt)
    except SelectorError as exc:
        raise status.bad_request(str(exc)) from None


def _parse_fields(text: str, rt: ResourceType) -> FieldSelector:
    supported = _META_FIELDS | _EXTRA_FIELDS.get(rt.group_resource, {})
    terms: list[FieldTerm] = []
    for part in sorted(_split_unescaped(text, ",")):
        if not part:
            continue
        split = _split_term(part)
        if split is None:
            raise SelectorError(f"invalid selector: '{text}'; can't understand '{part}'")
        field, op, raw = split
        value = _unescape(raw)
        getter = supported.get(field)
        if getter is None:
            raise SelectorError(f"field label not supported: {field}")
        terms.append(FieldTerm(field, getter, value, negated=op == "!="))
    return FieldSelector(tuple(terms))
