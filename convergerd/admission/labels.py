"""Label selectors as apimachinery matches them (pure): a `metav1.LabelSelector` object
({matchLabels, matchExpressions}), as admission's namespaceSelector and objectSelector use it.

The simulator's list handler parses the string form (`labelSelector=`) into the same
`LabelSelector` (`convergerd.sim.selectors`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


class SelectorError(ValueError):
    """A selector that does not parse; the message is apimachinery's."""


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!", "gt", "lt"
    values: frozenset[str]

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        if self.op == "exists":
            return present
        if self.op == "!":
            return not present
        if self.op in ("=", "in"):
            return present and labels[self.key] in self.values
        if self.op in ("!=", "notin"):
            return not present or labels[self.key] not in self.values
        if not present:
            return False
        return _compare_int(labels[self.key], next(iter(self.values)), self.op)


def _compare_int(label: str, bound: str, op: str) -> bool:
    try:
        have = int(label)
    except ValueError:
        return False
    return have > int(bound) if op == "gt" else have < int(bound)


@dataclass(frozen=True, slots=True)
class LabelSelector:
    requirements: tuple[Requirement, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.requirements

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        labels = labels or {}
        return all(r.matches(labels) for r in self.requirements)


# --- structured label selectors (metav1.LabelSelector) ---------------------------------------

_EXPRESSION_OPS = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!"}


def label_selector_from_object(selector: Any) -> LabelSelector:
    """A `metav1.LabelSelector` ({matchLabels, matchExpressions}) as a `LabelSelector`; None or
    {} selects everything. `SelectorError` for a malformed one."""
    if selector is None:
        return LabelSelector()
    if not isinstance(selector, Mapping):
        raise SelectorError("selector: must be an object")
    requirements: list[Requirement] = []
    match_labels = selector.get("matchLabels") or {}
    if not isinstance(match_labels, Mapping):
        raise SelectorError("matchLabels: must be an object")
    for key, value in sorted(match_labels.items()):
        if not isinstance(key, str) or not isinstance(value, str):
            raise SelectorError(f"matchLabels: {key!r}: keys and values must be strings")
        requirements.append(Requirement(key, "=", frozenset({value})))
    expressions = selector.get("matchExpressions") or []
    if not isinstance(expressions, list):
        raise SelectorError("matchExpressions: must be a list")
    requirements.extend(_expression_requirement(expr) for expr in expressions)
    return LabelSelector(tuple(requirements))


def _expression_requirement(expr: Any) -> Requirement:
    if not isinstance(expr, Mapping):
        raise SelectorError("matchExpressions: every entry must be an object")
    key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
    if not isinstance(key, str) or op not in _EXPRESSION_OPS:
        raise SelectorError(f"matchExpressions: {op!r} is not a valid label selector operator")
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise SelectorError("matchExpressions: values must be a list of strings")
    if (op in ("In", "NotIn")) != bool(values):
        raise SelectorError(
            "matchExpressions: values: for 'In', 'NotIn' operators, values set can't be empty"
            if op in ("In", "NotIn")
            else "matchExpressions: values: may not be specified when `operator` is "
            "'Exists' or 'DoesNotExist'"
        )
    return Requirement(key, _EXPRESSION_OPS[op], frozenset(values))
