"""Exceptions to a policy that expire (docs/design.md, "Exceptions"). Pure.

An exception admits, for one policy, the objects of one namespace: all of them, the one named
`name`, or those whose own labels carry every pair of `selector` (`{matchLabels: {...}}`;
`name` and `selector` exclude each other), until `expiresAt`. It has a reason, who asked
(`requestedBy`) and who approved (`approvedBy`). The same shape, with the same field names, is
an API body, an import file entry, a database row read back and an entry of the Policy CR's
`spec.exceptions`, so one parser (`parse_exception`) checks them all, naming the field and the
value of any problem. A grant is also checked against the clock (`check_grant`): an expiry in
the past, or further than the maximum (`CONVERGERD_EXCEPTION_MAX_DAYS`), is refused.

Expiry is not in the CEL (an admission policy has no clock): whoever renders an exception
renders only those in force (`in_force`), and renders again at the next expiry
(`next_expiry`). The operator stops honouring one `EXPIRY_LEAD_S` before its `expiresAt`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from convergerd.core.model import (
    PolicyException,
    RuleError,
    UnreadableJson,
    field_names,
    is_label_value,
    is_namespace_name,
    is_object_name,
    label_key_problem,
)
from convergerd.core.shown import shown

# An exception id names a matchCondition (`exception-<id>`, a qualified name of at most 63).
EXCEPTION_ID_MAX_LEN = 40
# In force at once per policy: each is one matchCondition, and kube-apiserver takes at most 64.
MAX_EXCEPTIONS = 64
REASON_MAX_CHARS = 512
PERSON_MAX_CHARS = 128
SELECTOR_MAX_PAIRS = 16
# The operator stops honouring an exception this long before its expiresAt: an operator whose
# clock is up to this much behind the granting side's still withdraws it on time, and the
# re-render's own latency (one apply) is covered.
EXPIRY_LEAD_S = 2.0
# "Expiring soon", for the metric and the alert.
EXPIRING_SOON_S = 7 * 86400.0
FIELDS = ("id", "namespace", "name", "selector", "reason", "requestedBy", "approvedBy",
          "expiresAt")
_REQUIRED = ("id", "namespace", "reason", "requestedBy", "approvedBy", "expiresAt")
CONDITION_PREFIX = "exception-"


@dataclass(frozen=True, slots=True)
class ExceptionTally:
    """Per policy, for the metrics: exceptions in force, of those expiring within
    `EXPIRING_SOON_S`, and expired ones some cluster is still recorded with (a revision that
    carried them, or not lapsed yet)."""

    policy: str
    in_force: int
    expiring_soon: int
    expired_delivered: int


def timestamp(moment: dt.datetime) -> str:
    """RFC 3339 in UTC with second precision, as the Policy CR carries `expiresAt`."""
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_expiry(value: object, where: str = "expiresAt") -> dt.datetime:
    """ISO 8601: a date (`2027-01-31`, that day's 00:00 UTC) or a time with its zone
    (`2027-01-31T12:00:00Z`, `...+02:00`); in UTC, to the second."""
    if isinstance(value, dt.datetime):
        parsed = value
    elif isinstance(value, dt.date):
        parsed = dt.datetime(value.year, value.month, value.day, tzinfo=dt.UTC)
    elif isinstance(value, str) and len(value) <= 40:
        text = value.strip()
        try:
            if len(text) == 10:
                day = dt.date.fromisoformat(text)
                parsed = dt.datetime(day.year, day.month, day.day, tzinfo=dt.UTC)
            else:
                parsed = dt.datetime.fromisoformat(text.replace("Z", "+00:00")
                                                   .replace("z", "+00:00"))
        except ValueError:
            raise RuleError(f"{where}: {shown(value)} is not an ISO 8601 date or time (e.g. "
                            "2027-01-31 or 2027-01-31T12:00:00Z)") from None
    else:
        raise RuleError(f"{where}: expected an ISO 8601 date or time (e.g. 2027-01-31 or "
                        f"2027-01-31T12:00:00Z), got {shown(value)}")
    if parsed.tzinfo is None:
        raise RuleError(f"{where}: {shown(value if isinstance(value, str) else str(value))} "
                        "has no zone: end it with Z (UTC) or an offset such as +02:00")
    try:
        return parsed.astimezone(dt.UTC).replace(microsecond=0)
    except OverflowError:
        raise RuleError(f"{where}: {shown(str(value))} is out of range") from None


def selector_from_text(text: str) -> dict[str, Any]:
    """`app=web,tier=db` (the CLI's `--selector`) as `{matchLabels: {...}}`; equality only."""
    pairs: dict[str, str] = {}
    for part in text.split(","):
        key, eq, value = part.strip().partition("=")
        if not eq or not key.strip() or "!" in key or value.startswith("="):
            raise RuleError(f"selector: {shown(part.strip())} is not key=value (equality "
                            "pairs only, separated by commas)")
        if key.strip() in pairs:
            raise RuleError(f"selector: the key {shown(key.strip())} is given twice")
        pairs[key.strip()] = value.strip()
    return {"matchLabels": pairs}


def _selector(raw: object, where: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(raw, Mapping) or set(raw) != {"matchLabels"}:
        raise RuleError(f"{where}: expected {{matchLabels: {{key: value, ...}}}}, got "
                        f"{shown(raw)}")
    labels = raw["matchLabels"]
    if not isinstance(labels, Mapping) or not labels:
        raise RuleError(f"{where}.matchLabels: expected a non-empty mapping of label keys to "
                        f"values, got {shown(labels)}")
    if len(labels) > SELECTOR_MAX_PAIRS:
        raise RuleError(f"{where}.matchLabels: {len(labels)} pairs, at most "
                        f"{SELECTOR_MAX_PAIRS}")
    for key, value in labels.items():
        problem = (label_key_problem(key) if isinstance(key, str)
                   else "is not a string")
        if problem:
            raise RuleError(f"{where}.matchLabels: the key {shown(key)} {problem}")
        if not is_label_value(value):
            raise RuleError(f"{where}.matchLabels.{key}: {shown(value)} is not a label value "
                            "(1 to 63 letters, digits, '-', '_', '.', starting and ending with "
                            "a letter or digit)")
    return tuple(sorted((str(k), str(v)) for k, v in labels.items()))


def _text(raw: Mapping[str, Any], key: str, where: str, limit: int) -> str:
    value = raw.get(key)
    if not isinstance(value, str) or not value.strip():
        raise RuleError(f"{where}.{key}: required, a non-empty string (got {shown(value)})")
    if len(value) > limit:
        raise RuleError(f"{where}.{key}: {len(value)} characters, at most {limit}")
    if not value.isprintable():
        raise RuleError(f"{where}.{key}: {shown(value)} contains control characters")
    return value


def check_exception_id(value: object, where: str = "id") -> str:
    if (not isinstance(value, str) or len(value) > EXCEPTION_ID_MAX_LEN
            or not is_namespace_name(value)):
        raise RuleError(f"{where}: {shown(value)} is not a DNS label of at most "
                        f"{EXCEPTION_ID_MAX_LEN} characters (lowercase letters, digits, '-')")
    return value


def parse_exception(raw: object, where: str = "exception") -> PolicyException:
    """One exception from its mapping (API body, import entry, database row, CR entry);
    `RuleError` naming the field and the value."""
    if not isinstance(raw, Mapping):
        raise RuleError(f"{where}: expected a mapping with {', '.join(FIELDS)}, got "
                        f"{shown(raw)}")
    unknown = [k for k in raw if k not in FIELDS]
    if unknown:
        raise RuleError(f"{where}: unknown field(s) {field_names(unknown)}; known: "
                        f"{', '.join(FIELDS)}")
    missing = [k for k in _REQUIRED if raw.get(k) is None]
    if missing:
        raise RuleError(f"{where}.{missing[0]}: required")
    ident = check_exception_id(raw["id"], f"{where}.id")
    namespace = raw["namespace"]
    if not is_namespace_name(namespace):
        raise RuleError(f"{where}.namespace: {shown(namespace)} is not a namespace name (a "
                        "DNS label of at most 63 characters)")
    name, selector = raw.get("name"), raw.get("selector")
    if name is not None and selector is not None:
        raise RuleError(f"{where}: name {shown(name)} and selector {shown(selector)} exclude "
                        "each other: give one, or neither for the whole namespace")
    if name is not None and not is_object_name(name):
        raise RuleError(f"{where}.name: {shown(name)} is not an object name (a DNS subdomain "
                        "of at most 253 characters)")
    return PolicyException(
        id=ident,
        namespace=namespace,
        reason=_text(raw, "reason", where, REASON_MAX_CHARS),
        requested_by=_text(raw, "requestedBy", where, PERSON_MAX_CHARS),
        approved_by=_text(raw, "approvedBy", where, PERSON_MAX_CHARS),
        expires_at=parse_expiry(raw["expiresAt"], f"{where}.expiresAt"),
        name=name,
        selector=_selector(selector, f"{where}.selector") if selector is not None else None,
    )


def parse_exceptions(raw: object, where: str = "exceptions") -> tuple[PolicyException, ...]:
    """A policy's list: each entry checked, ids distinct, at most `MAX_EXCEPTIONS`; by id."""
    if not isinstance(raw, Sequence) or isinstance(raw, str | bytes):
        raise RuleError(f"{where}: expected a list, got {shown(raw)}")
    if len(raw) > MAX_EXCEPTIONS:
        raise RuleError(f"{where}: {len(raw)} in force, at most {MAX_EXCEPTIONS} per policy")
    found = [parse_exception(entry, f"{where}[{i}]") for i, entry in enumerate(raw)]
    ids = [e.id for e in found]
    duplicate = next((i for i in ids if ids.count(i) > 1), None)
    if duplicate is not None:
        raise RuleError(f"{where}: the id {shown(duplicate)} is given twice")
    return tuple(sorted(found, key=lambda e: e.id))


def stored_exceptions(raw: Sequence[Any] | UnreadableJson) -> tuple[PolicyException, ...]:
    """A policy row's exceptions (`PolicyRow.exceptions`), as `parse_exceptions` reads them."""
    if isinstance(raw, UnreadableJson):
        raise RuleError(f"exceptions: {raw.reason}")
    return parse_exceptions(raw) if raw else ()


def check_grant(exception: PolicyException, *, now: dt.datetime, max_days: float,
                where: str = "expiresAt") -> None:
    """A new exception's expiry: in the future, and at most `max_days` away."""
    expires = exception.expires_at
    if expires <= now:
        raise RuleError(f"{where}: {timestamp(expires)} is not in the future (now "
                        f"{timestamp(now)}): an exception must expire later")
    latest = now + dt.timedelta(days=max_days)
    if expires > latest:
        raise RuleError(f"{where}: {timestamp(expires)} is more than {max_days:g} days away "
                        f"(at most {timestamp(latest)}; CONVERGERD_EXCEPTION_MAX_DAYS)")


def as_spec(exception: PolicyException) -> dict[str, Any]:
    """The entry of the Policy CR's `spec.exceptions` (and of the API's answers)."""
    out: dict[str, Any] = {"id": exception.id, "namespace": exception.namespace}
    if exception.name is not None:
        out["name"] = exception.name
    if exception.selector is not None:
        out["selector"] = {"matchLabels": dict(exception.selector)}
    out.update(reason=exception.reason, requestedBy=exception.requested_by,
               approvedBy=exception.approved_by, expiresAt=timestamp(exception.expires_at))
    return out


def in_force(exceptions: Iterable[PolicyException], now: dt.datetime,
             lead_s: float = 0.0) -> tuple[PolicyException, ...]:
    """Those not expired at `now` (counting `lead_s` early)."""
    cut = now + dt.timedelta(seconds=lead_s)
    return tuple(e for e in exceptions if e.expires_at > cut)


def next_expiry(exceptions: Iterable[PolicyException]) -> dt.datetime | None:
    return min((e.expires_at for e in exceptions), default=None)


def covers(exception: PolicyException, namespace: str | None, name: str | None,
           labels: Mapping[str, Any] | None) -> bool:
    """Does `exception` admit the object `namespace/name` with `labels`? What the rendered
    matchCondition says, in Python (for the audit and the probe)."""
    if namespace != exception.namespace:
        return False
    if exception.name is not None:
        return name == exception.name
    if exception.selector is not None:
        return isinstance(labels, Mapping) and all(
            labels.get(k) == v for k, v in exception.selector)
    return True
