"""Files a person hands to convergerd, read with bounds: the one reader of every file edge
(import files, kubeconfigs and the CA, certificate, key and token files they name, the
service account's files, secret files of settings, `policy eval`'s inputs), and the rule of
the YAML configuration files (import files, kubeconfigs): no key twice (`UniqueKeys`).

`read_bounded` reads only a regular file, never more than its cap: a named pipe would block
the event loop in `open()` until a writer comes, a device such as `/dev/zero` never ends. The
file is checked with `stat` before it is opened (a device is never opened), opened with
`O_NONBLOCK` (a pipe swapped in meanwhile opens without waiting) and checked again with `fstat`
on what was opened. Every refusal is a `BadFile` whose one-line message names the problem,
never the content; the caller adds the file and what it was for.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode

from convergerd.core.errors import BadFile
from convergerd.core.shown import shown

_CHUNK = 1 << 16
NOT_REGULAR = "not a regular file (a directory, pipe or device); give a file path"


def read_bounded(path: Path, max_bytes: int, *, setting: str | None = None) -> bytes:
    """The bytes of the regular file `path`, at most `max_bytes` (`setting`, when given, names
    what sets that limit in the message). Never waits on a pipe or a device and never reads
    more than `max_bytes + 1` bytes, even from a file that grows while it is read."""
    too_large = f"more than {max_bytes} bytes" + (f", the limit set by {setting}" if setting
                                                  else "")
    try:
        # stat first: a device is refused without being opened (opening one can act).
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise BadFile(NOT_REGULAR)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise BadFile(f"cannot read: {exc.strerror or exc}") from None
    except ValueError:  # a NUL in the path
        raise BadFile("cannot read: not a valid path (it holds a NUL)") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):  # replaced between the stat and the open
            raise BadFile(NOT_REGULAR)
        if info.st_size > max_bytes:
            raise BadFile(f"{info.st_size} bytes, {too_large}")
        chunks: list[bytes] = []
        size = 0
        while size <= max_bytes:  # the file may grow after fstat: count what is read
            chunk = os.read(fd, min(_CHUNK, max_bytes + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > max_bytes:
            raise BadFile(too_large)
        return b"".join(chunks)
    except OSError as exc:
        raise BadFile(f"cannot read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


def decode_utf8(data: bytes) -> str:
    """The text of UTF-8 bytes (a leading byte-order mark is dropped); `BadFile` naming the
    first byte that is not UTF-8."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise BadFile(
            f"not UTF-8 text: byte 0x{data[exc.start]:02x} at offset {exc.start} cannot be "
            "decoded; save the file as UTF-8"
        ) from None


class DuplicateKey(yaml.constructor.ConstructorError):
    """A mapping names the same key twice. `key` is the key shortened (callers whose keys may
    be secret show only the lines); `first` and `problem_mark` are where each one is."""

    def __init__(self, key: object, first: Any, second: Any) -> None:
        self.key = shown(key, 60)
        self.first_line, self.second_line = first.line + 1, second.line + 1
        super().__init__(problem=f"duplicate key {self.key}", problem_mark=second)

    def __str__(self) -> str:
        return (f"duplicate key {self.key} at line {self.second_line} (first at line "
                f"{self.first_line})")


class UniqueKeys(yaml.constructor.SafeConstructor):
    """A safe constructor that refuses a mapping naming a key twice, where PyYAML keeps the
    last value silently (a second `policies:` would drop the first list; a repeated
    `enabled:` would flip a policy without a word). Keys brought in by a merge (`<<: *base`)
    may be overridden, as YAML says; only keys written in the mapping itself must differ."""

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, MappingNode):
            _refuse_duplicates(self, node)
        return super().construct_mapping(node, deep=deep)


_MERGE, _STR = "tag:yaml.org,2002:merge", "tag:yaml.org,2002:str"


def _refuse_duplicates(constructor: yaml.constructor.SafeConstructor, node: MappingNode) -> None:
    # Only scalar keys: a collection key cannot be a dict key anyway (the safe constructor
    # refuses it), and a merge key is not a key of the mapping.
    keys = [k for k, _ in node.value if isinstance(k, ScalarNode) and k.tag != _MERGE]
    if all(k.tag == _STR for k in keys) and len({k.value for k in keys}) == len(keys):
        return  # string keys, all different: the usual case, decided without constructing
    seen: dict[Any, Node] = {}
    for key_node in keys:
        key = constructor.construct_object(key_node)
        try:
            first = seen.setdefault(key, key_node)
        except TypeError:  # unhashable: the safe constructor reports it in its own words
            continue
        if first is not key_node:
            raise DuplicateKey(key, first.start_mark, key_node.start_mark)
