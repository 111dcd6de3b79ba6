"""A YAML file a person hands to convergerd (`convergerd import FILE`), loaded with bounds.

The file is untrusted: it is read by `files.read_bounded` (a regular file no larger than a
limit), must be UTF-8, and must hold one YAML document whose nesting is shallow, whose size
once aliases are expanded is bounded (an "alias bomb" is a small file whose aliases expand to
billions of values), and whose mappings name each key once. Every refusal is a `BadFile` with a
one-line message naming the problem and, where known, its line.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import yaml
from yaml.events import AliasEvent, StreamEndEvent
from yaml.nodes import CollectionNode, MappingNode, Node, SequenceNode

from convergerd.core.errors import BadFile
from convergerd.core.shown import shown
from convergerd.files import DuplicateKey, UniqueKeys, decode_utf8

# Far above what an import file needs (about 6 levels), far below Python's recursion limit.
YAML_MAX_DEPTH = 32
# Values in the document once aliases are expanded: a 4 MiB file of ordinary entries has a few
# hundred thousand; a billion-laughs file has billions.
YAML_MAX_NODES = 1_000_000


def _where(mark: Any) -> str:
    return f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""


class _BoundedLoader(yaml.SafeLoader, UniqueKeys):
    """PyYAML's safe loader that refuses deep nesting, recursive aliases, documents that
    expand past `YAML_MAX_NODES` values, a second document, and a key twice in a mapping."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        # Expanded size of each finished collection node, by id (nodes live as long as the
        # loader): an alias adds the size of what it points to without copying it.
        self._sizes: dict[int, int] = {}

    def _size(self, node: Node) -> int:
        return self._sizes.get(id(node), 1)

    def _next_mark(self) -> Any:
        """Where the next event starts (PyYAML's event methods are untyped)."""
        return self.peek_event().start_mark  # type: ignore[no-untyped-call]

    def compose_node(self, parent: Node | None, index: int) -> Node | None:
        if self.check_event(AliasEvent):
            mark = self._next_mark()
            node = super().compose_node(parent, index)
            if isinstance(node, CollectionNode) and id(node) not in self._sizes:
                raise BadFile(f"a YAML alias refers to a value that contains it{_where(mark)}")
            return node
        self._depth += 1
        if self._depth > YAML_MAX_DEPTH:
            raise BadFile(
                f"nested deeper than {YAML_MAX_DEPTH} levels{_where(self._next_mark())}"
            )
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        if isinstance(node, SequenceNode):
            size = 1 + sum(self._size(child) for child in node.value)
        elif isinstance(node, MappingNode):
            size = 1 + sum(self._size(k) + self._size(v) for k, v in node.value)
        else:
            return node
        if size > YAML_MAX_NODES:
            raise BadFile(
                f"more than {YAML_MAX_NODES} values once YAML aliases are expanded"
                f"{_where(node.start_mark)} (an alias repeats everything it refers to)"
            )
        self._sizes[id(node)] = size
        return node

    def get_single_node(self) -> Node | None:
        self.get_event()  # type: ignore[no-untyped-call] # stream start
        document = None if self.check_event(StreamEndEvent) else self.compose_document()
        if not self.check_event(StreamEndEvent):
            mark = self._next_mark()
            raise BadFile(
                f"more than one YAML document (the second starts{_where(mark)}); "
                "put everything in one"
            )
        self.get_event()  # type: ignore[no-untyped-call] # stream end
        return document


def _yaml_problem(exc: yaml.YAMLError, text: str) -> str:
    if isinstance(exc, DuplicateKey):
        return f"{exc}; give each key once"
    if isinstance(exc, yaml.reader.ReaderError):
        before = text[: exc.position]
        line, column = before.count("\n") + 1, exc.position - (before.rfind("\n") + 1) + 1
        return (
            f"character #x{exc.character:04x} at line {line}, column {column} is not allowed "
            "in YAML (control characters and binary data are not text)"
        )
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or exc.context or "cannot be parsed"
        return f"not valid YAML{_where(mark)}: {shown(problem, style='prose')}"
    return f"not valid YAML: {shown(str(exc), style='prose')}"


def load_yaml(data: bytes) -> Any:
    """The one YAML document in `data` as plain Python values (`None` for an empty file)."""
    return _loaded(data, lambda loader: loader.get_single_data())


def load_yaml_documents(data: bytes) -> list[Any]:
    """Every non-empty YAML document in `data`, with the same bounds; together the documents
    hold at most `YAML_MAX_NODES` values once aliases are expanded."""

    def documents(loader: _BoundedLoader) -> list[Any]:
        found, total = [], 0
        while loader.check_node():
            node = loader.get_node()
            if node is None:
                continue
            total += loader._size(node)
            if total > YAML_MAX_NODES:
                raise BadFile(f"more than {YAML_MAX_NODES} values in all documents together "
                              f"(the last one counted starts{_where(node.start_mark)})")
            value = loader.construct_document(node)
            if value is not None:
                found.append(value)
        return found

    return _loaded(data, documents)  # type: ignore[no-any-return]


def _loaded(data: bytes, load: Callable[[_BoundedLoader], Any]) -> Any:
    text = decode_utf8(data)
    loader: _BoundedLoader | None = None
    try:
        loader = _BoundedLoader(text)  # checks every character first
        return load(loader)
    except yaml.YAMLError as exc:
        raise BadFile(_yaml_problem(exc, text)) from None
    except (ValueError, OverflowError) as exc:
        # The safe constructors raise these for values their tag cannot hold: a date with
        # month 13, an integer of more digits than Python converts.
        raise BadFile(f"a value cannot be read: {shown(str(exc), style='prose')}") from None
    finally:
        if loader is not None:
            loader.dispose()
