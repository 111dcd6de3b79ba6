"""A policy's revisions (pure): what changed from one kept revision to the next, said as data
and in one line, a page of the history, and why a rollback was refused.

A revision's content is the policy's row without its bookkeeping (migration `0011`): the columns
as the database names them (`boundary_id`, `rule`, `enabled`, and any column added later), so a
new column shows up here without a change. Contents come from the database, which anyone with a
login writes: every value shown is bounded (`shown`).
"""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from convergerd.core.shown import shown

# The fields a change lists first, in this order; any other column follows by name.
FIELD_ORDER = ("boundary_id", "enabled", "enforcement", "rule")
# A changed value is shown (before and after) when it is a plain value; a mapping's changed keys
# are listed instead, at most this many.
KEYS_LISTED = 20
VALUE_MAX_CHARS = 60
# A page of the history: at most this many revisions (a revision's content is at most
# `CONTENT_MAX_BYTES`: a page stays a few MB at worst).
PAGE_DEFAULT = 20
PAGE_MAX = 100
# A content larger than this as JSON text is not read back (a valid policy is under 30 KiB);
# the revision is listed as unreadable.
CONTENT_MAX_BYTES = 64 * 1024
_MISSING = object()


class Operation(enum.StrEnum):
    """What made a revision (the `operation` column)."""

    BASELINE = "baseline"  # the content when revisions began to be kept (migration 0011)
    INSERT = "insert"  # the row was created (again, after a deletion)
    UPDATE = "update"  # the row was changed: a new revision
    DELETE = "delete"  # the row was deleted: a tombstone without content


class Kind(enum.StrEnum):
    """What a revision did, from the revision kept before it."""

    CREATED = "created"
    CHANGED = "changed"
    UNCHANGED = "unchanged"  # a new revision with the same content (delivered again)
    DELETED = "deleted"
    FIRST_KEPT = "first_kept"  # nothing kept before it to compare with
    UNREADABLE = "unreadable"  # its content, or the one before, could not be read
    # A boundary's view of its policy's history: a revision from when the policy was in
    # another boundary shows nothing of it, and the one after it only that it moved in.
    ELSEWHERE = "elsewhere"
    MOVED_IN = "moved_in"


@dataclass(frozen=True, slots=True)
class Revision:
    """One kept revision. `content` is None for a deletion, and for a content that could not be
    read (`readable` false: not JSON the bounded decoder reads, not a mapping, or over
    `CONTENT_MAX_BYTES`)."""

    policy: str
    revision: int
    operation: Operation
    content: Mapping[str, Any] | None
    saved_by: str
    saved_at: dt.datetime
    readable: bool = True

    @property
    def deleted(self) -> bool:
        return self.operation is Operation.DELETE


@dataclass(frozen=True, slots=True)
class Change:
    """One field that differs: a mapping's changed keys (`keys`), or a value's `before` and
    `after` (absent: None)."""

    field: str
    keys: tuple[str, ...] | None = None
    before: Any = None
    after: Any = None

    def as_json(self) -> dict[str, Any]:
        if self.keys is not None:
            return {"field": self.field, "keys": list(self.keys)}
        return {"field": self.field, "before": _plain(self.before), "after": _plain(self.after)}

    def text(self) -> str:
        name = shown(self.field, VALUE_MAX_CHARS, style="text")
        if self.keys is not None:
            listed = ", ".join(shown(k, VALUE_MAX_CHARS, style="text") for k in self.keys)
            return f"{name}: {listed}" if listed else name
        return (f"{name}: {shown(self.before, VALUE_MAX_CHARS, style='json')} → "
                f"{shown(self.after, VALUE_MAX_CHARS, style='json')}")


def _plain(value: Any) -> Any:
    """A value as a change shows it: a JSON scalar as is (strings bounded), anything larger
    only as its shortened JSON text."""
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, str):
        return shown(value, VALUE_MAX_CHARS, style="text")
    return shown(value, VALUE_MAX_CHARS, style="json")


@dataclass(frozen=True, slots=True)
class Diff:
    kind: Kind
    changes: tuple[Change, ...] = ()

    def text(self) -> str:
        """One line for a table: `created`, `rule: registries; enabled: true → false`, ..."""
        if self.kind is Kind.CHANGED:
            return "; ".join(c.text() for c in self.changes)
        return _KIND_TEXT[self.kind]

    def as_json(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "changes": [c.as_json() for c in self.changes],
                "summary": self.text()}


_KIND_TEXT = {
    Kind.CREATED: "created",
    Kind.UNCHANGED: "no field changed (a new revision of the same content)",
    Kind.DELETED: "deleted",
    Kind.FIRST_KEPT: "the oldest revision kept",
    Kind.UNREADABLE: "its content or the one before cannot be read",
    Kind.ELSEWHERE: "in another boundary then",
    Kind.MOVED_IN: "moved into this boundary",
}


def _field_key(name: str) -> tuple[int, str]:
    return (FIELD_ORDER.index(name) if name in FIELD_ORDER else len(FIELD_ORDER), name)


def changes(before: Mapping[str, Any], after: Mapping[str, Any]) -> tuple[Change, ...]:
    """The fields that differ between two contents, in `FIELD_ORDER` then by name: a mapping
    on both sides by its changed keys, anything else by its values."""
    found: list[Change] = []
    for name in sorted({*before, *after}, key=_field_key):
        old, new = before.get(name, _MISSING), after.get(name, _MISSING)
        if old == new:
            continue
        if isinstance(old, Mapping) and isinstance(new, Mapping):
            keys = sorted(str(k) for k in {*old, *new}
                           if old.get(k, _MISSING) != new.get(k, _MISSING))
            found.append(Change(name, keys=tuple(keys[:KEYS_LISTED])))
        else:
            found.append(Change(name, before=None if old is _MISSING else old,
                                after=None if new is _MISSING else new))
    return tuple(found)


def what_changed(previous: Revision | None, current: Revision) -> Diff:
    """What `current` did, from `previous`, the revision kept just before it (None: none)."""
    if current.deleted:
        return Diff(Kind.DELETED)
    if current.operation is Operation.INSERT or (previous is not None and previous.deleted):
        return Diff(Kind.CREATED)
    if previous is None:
        return Diff(Kind.FIRST_KEPT)
    if previous.content is None or current.content is None:
        return Diff(Kind.UNREADABLE)
    found = changes(previous.content, current.content)
    return Diff(Kind.CHANGED, found) if found else Diff(Kind.UNCHANGED)


@dataclass(frozen=True, slots=True)
class History:
    """What the database keeps of one policy's history, as read for a page: the boundary it is
    in (its row's, or the last content's when the row is gone; None: unknown) and up to a page
    and one of its revisions, newest first."""

    policy: str
    boundary: str | None
    newest_first: tuple[Revision, ...]


def in_boundary(boundary: str) -> Callable[[Revision], bool]:
    """Whether a revision belongs to `boundary`'s view: its content names that boundary (a
    deletion, which has none, does)."""
    return lambda r: r.deleted or (
        r.content is not None and r.content.get("boundary_id") == boundary)


def history(newest_first: Sequence[Revision], limit: int, *,
            visible: Callable[[Revision], bool] | None = None
            ) -> tuple[list[tuple[Revision, Diff]], bool]:
    """A page of the history from up to `limit` + 1 kept revisions, newest first (the one past
    the page is what its last revision is compared with): each revision with what it did, and
    whether older ones are kept. With `visible` (a boundary's view, `in_boundary`), a revision
    it refuses is `ELSEWHERE` and the one after it `MOVED_IN`, so no content, change or name
    of another boundary shows."""
    page = []
    for i, revision in enumerate(newest_first[:limit]):
        previous = newest_first[i + 1] if i + 1 < len(newest_first) else None
        if visible is not None and not visible(revision):
            diff = Diff(Kind.ELSEWHERE)
        elif visible is not None and previous is not None and not visible(previous):
            diff = Diff(Kind.MOVED_IN)
        else:
            diff = what_changed(previous, revision)
        page.append((revision, diff))
    return page, len(newest_first) > limit


class Refused(enum.StrEnum):
    """Why a rollback wrote nothing."""

    UNKNOWN_POLICY = "unknown_policy"  # no row and no revision kept
    UNKNOWN_REVISION = "unknown_revision"  # not kept (never was, or pruned)
    DELETION = "deletion"  # that revision is a deletion: it has no content
    UNREADABLE = "unreadable"  # its content cannot be read back
    DELETING = "deleting"  # the policy's deletion has begun
    INVALID = "invalid"  # its content is not a valid policy now (the boundary is gone, ...)


def refusal(wanted: Revision, *, deleting: bool) -> Refused | None:
    """Why revision `wanted` cannot be rolled back to (`deleting`: the policy's deletion has
    begun), or None."""
    if wanted.deleted:
        return Refused.DELETION
    if wanted.content is None:
        return Refused.UNREADABLE
    return Refused.DELETING if deleting else None


@dataclass(frozen=True, slots=True)
class Rollback:
    """What a rollback of `policy` to revision `to` did: `revision`, the policy's revision after
    it (a new one when `changed`; the current one when it already had that content), or why it
    was `refused` (`reason`: the invalid policy's; `kept`: the oldest and newest revisions
    kept)."""

    policy: str
    to: int
    revision: int | None = None
    changed: bool = False
    refused: Refused | None = None
    reason: str | None = None
    kept: tuple[int, int] | None = None

    def refusal(self, *, keep_last: int) -> str:
        """The message of a refusal, naming the field and the value (`keep_last`: the
        retention, for a revision no longer kept)."""
        p, to = self.policy, self.to
        if self.refused is Refused.UNKNOWN_POLICY:
            return f"unknown policy {p!r}: no row and no revision kept"
        if self.refused is Refused.UNKNOWN_REVISION:
            kept = (f"revisions {self.kept[0]} to {self.kept[1]} are kept"
                    if self.kept is not None else "no revision is kept")
            return (f"to: policy {p!r} has no revision {to} ({kept}; "
                    f"CONVERGERD_REVISION_RETENTION keeps the last {keep_last} of each policy)")
        if self.refused is Refused.DELETION:
            return (f"to: revision {to} of policy {p!r} is its deletion, which has no content: "
                    f"roll back to a revision before it")
        if self.refused is Refused.UNREADABLE:
            return f"to: revision {to} of policy {p!r} has a content that cannot be read back"
        if self.refused is Refused.DELETING:
            return (f"policy {p!r}: its deletion has begun: DELETE it again to finish, then "
                    f"roll back to create it again")
        return (f"to: revision {to} of policy {p!r} is not a valid policy now: "
                f"{shown(self.reason, 300, style='prose')}; nothing written")
