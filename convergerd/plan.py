"""What a round must apply to one cluster: desired Policy objects vs what the cluster holds. Pure.

A round only adds and updates; nothing here ever produces a deletion.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from convergerd.model import Policy
from convergerd.render import object_name, render_policy


class Why(StrEnum):
    MISSING = "missing"  # not in the cluster (never delivered, or deleted there)
    DRIFT = "drift"  # in the cluster, but its spec or our labels differ from the database


@dataclass(frozen=True, slots=True)
class Observed:
    """A Policy object as listed from a cluster: only what the round and the status API read."""

    name: str
    labels: Mapping[str, str]
    spec: Mapping[str, Any]
    resource_version: str
    generation: int | None = None
    phase: str | None = None
    observed_generation: int | None = None
    ready_status: str | None = None
    ready_reason: str | None = None
    ready_message: str | None = None

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> Observed:
        meta = obj.get("metadata") or {}
        status = obj.get("status") or {}
        conditions = status.get("conditions") or ()
        ready = next(
            (c for c in conditions if isinstance(c, Mapping) and c.get("type") == "Ready"), {}
        )
        return cls(
            name=str(meta.get("name", "")),
            labels=dict(meta.get("labels") or {}),
            spec=dict(obj.get("spec") or {}),
            resource_version=str(meta.get("resourceVersion", "")),
            generation=meta.get("generation"),
            phase=status.get("phase"),
            observed_generation=status.get("observedGeneration"),
            ready_status=ready.get("status"),
            ready_reason=ready.get("reason"),
            ready_message=ready.get("message"),
        )


@dataclass(frozen=True, slots=True)
class Apply:
    """`body` of a DRIFT apply carries the listed object's resourceVersion as a precondition:
    a save (or delete) that wrote the object after the list makes the apply fail as superseded
    instead of writing the older revision over it."""

    policy: Policy
    body: dict[str, Any]
    why: Why


def differs(body: Mapping[str, Any], observed: Observed) -> bool:
    """True when the object in the cluster does not carry what we would apply.

    Only fields we own are compared: other managers' labels or annotations are not drift.
    """
    wanted_labels: Mapping[str, str] = body["metadata"]["labels"]
    if any(observed.labels.get(k) != v for k, v in wanted_labels.items()):
        return True
    return bool(dict(observed.spec) != body["spec"])


def with_precondition(body: dict[str, Any], resource_version: str) -> dict[str, Any]:
    """`body` with `metadata.resourceVersion` set (nothing set when it is empty)."""
    if not resource_version:
        return body
    return {**body, "metadata": {**body["metadata"], "resourceVersion": resource_version}}


def plan_cluster(desired: Iterable[Policy], observed: Mapping[str, Observed]) -> list[Apply]:
    """The applies that bring one cluster in line; empty when it is in sync."""
    actions: list[Apply] = []
    for policy in desired:
        body = render_policy(policy)
        found = observed.get(object_name(policy.id))
        if found is None:
            actions.append(Apply(policy, body, Why.MISSING))
        elif differs(body, found):
            actions.append(Apply(policy, with_precondition(body, found.resource_version),
                                 Why.DRIFT))
    return actions
