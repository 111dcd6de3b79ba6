"""JSON merge patch (RFC 7386) and JSON patch (RFC 6902) on plain JSON data.

Both functions return new containers and never mutate their inputs, so the store can hand them
its stored objects. Failures raise `PatchError`; the store turns them into the apiserver's
answers (JSON patch errors are 422 Invalid there, malformed bodies 400).
"""

from __future__ import annotations

from typing import Any


class PatchError(ValueError):
    """A patch that cannot be applied to the document."""


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 MergePatch: objects merge recursively, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            result[key] = merge_patch(result.get(key), value)
        else:
            result[key] = value
    return result


def _unescape_token(part: str) -> str:
    # RFC 6901: "~1" first, then "~0", so "~01" is "~1" and not "/"
    return part.replace("~1", "/").replace("~0", "~")


def _parse_pointer(pointer: str) -> list[str]:
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise PatchError(f"JSON pointer must start with '/': {pointer!r}")
    return [_unescape_token(t) for t in pointer[1:].split("/")]


def _index(container: list[Any], part: str, *, allow_end: bool) -> int:
    if part == "-" and allow_end:
        return len(container)
    if not part.isdigit() or (len(part) > 1 and part.startswith("0")):
        raise PatchError(f"invalid array index: {part!r}")
    idx = int(part)
    limit = len(container) if allow_end else len(container) - 1
    if idx > limit:
        raise PatchError(f"array index out of range: {idx}")
    return idx


def _copy_path(doc: Any, parts: list[str]) -> tuple[Any, Any]:
    """Copy the containers along `parts[:-1]` so the write below touches only new ones.

    Returns (new root, parent container of the last part).
    """
    root = _shallow(doc)
    parent = root
    for part in parts[:-1]:
        if isinstance(parent, dict):
            if part not in parent:
                raise PatchError(f"path not found: missing key {part!r}")
            child = _shallow(parent[part])
            parent[part] = child
        elif isinstance(parent, list):
            idx = _index(parent, part, allow_end=False)
            child = _shallow(parent[idx])
            parent[idx] = child
        else:
            raise PatchError(f"path not found: {part!r} is below a scalar")
        parent = child
    return root, parent


def _shallow(value: Any) -> Any:
    if isinstance(value, dict):
        return dict(value)
    if isinstance(value, list):
        return list(value)
    return value


def _get(doc: Any, parts: list[str]) -> Any:
    cur = doc
    for part in parts:
        if isinstance(cur, dict):
            if part not in cur:
                raise PatchError(f"path not found: missing key {part!r}")
            cur = cur[part]
        elif isinstance(cur, list):
            cur = cur[_index(cur, part, allow_end=False)]
        else:
            raise PatchError(f"path not found: {part!r} is below a scalar")
    return cur


def _add(doc: Any, parts: list[str], value: Any) -> Any:
    if not parts:
        return value
    root, parent = _copy_path(doc, parts)
    last = parts[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        parent.insert(_index(parent, last, allow_end=True), value)
    else:
        raise PatchError(f"cannot add below a scalar at {last!r}")
    return root


def _remove(doc: Any, parts: list[str]) -> Any:
    if not parts:
        raise PatchError("cannot remove the whole document")
    root, parent = _copy_path(doc, parts)
    last = parts[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise PatchError(f"unable to remove nonexistent key: {last}")
        del parent[last]
    elif isinstance(parent, list):
        del parent[_index(parent, last, allow_end=False)]
    else:
        raise PatchError(f"cannot remove below a scalar at {last!r}")
    return root


def _replace(doc: Any, parts: list[str], value: Any) -> Any:
    _get(doc, parts)  # RFC 6902 4.3: the target location MUST exist
    if not parts:
        return value
    root, parent = _copy_path(doc, parts)
    last = parts[-1]
    if isinstance(parent, dict):
        parent[last] = value
    else:
        parent[_index(parent, last, allow_end=False)] = value
    return root


def _apply_op(doc: Any, op: dict[str, Any]) -> Any:
    name = op.get("op")
    if not isinstance(op.get("path"), str):
        raise PatchError(f"operation {op!r} is missing a string 'path'")
    path = _parse_pointer(op["path"])
    if name in ("add", "replace", "test") and "value" not in op:
        raise PatchError(f"operation {name} is missing 'value'")
    if name == "add":
        return _add(doc, path, op["value"])
    if name == "remove":
        return _remove(doc, path)
    if name == "replace":
        return _replace(doc, path, op["value"])
    if name in ("move", "copy"):
        if not isinstance(op.get("from"), str):
            raise PatchError(f"operation {name} is missing a string 'from'")
        source = _parse_pointer(op["from"])
        value = _get(doc, source)
        if name == "move":
            if path[: len(source)] == source and len(path) > len(source):
                raise PatchError("cannot move a value into one of its children")
            doc = _remove(doc, source)
        return _add(doc, path, value)
    if name == "test":
        if not _json_equal(_get(doc, path), op["value"]):
            raise PatchError(f"testing value {op['path']} failed")
        return doc
    raise PatchError(f"Unexpected kind: {name}")


def _json_equal(a: Any, b: Any) -> bool:
    # JSON has one number type: 1 == 1.0, but true is not 1
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return bool(a == b)


def json_patch(doc: Any, ops: Any) -> Any:
    """RFC 6902: apply the operations in order; any failure rejects the whole patch."""
    if not isinstance(ops, list):
        raise PatchError("a JSON patch must be a list of operations")
    for op in ops:
        if not isinstance(op, dict):
            raise PatchError(f"operation {op!r} is not an object")
        doc = _apply_op(doc, op)
    return doc
