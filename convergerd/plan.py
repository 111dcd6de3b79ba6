"""What a round must apply to one cluster: desired Policy objects vs what the cluster holds. Pure.

A round only adds and updates; nothing here ever produces a deletion.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from convergerd.decode import (
    MAX_NAME_CHARS,
    MAX_REASON_CHARS,
    MAX_TOKEN_CHARS,
    FieldReader,
    expected,
)
from convergerd.model import Policy
from convergerd.render import object_name, render_policy

# The phase and Ready reason of an object read back with a field of the wrong type.
UNKNOWN_PHASE = "Unknown"
MALFORMED_REASON = "Malformed"


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
        """Decoded at the edge (`convergerd.decode`): strings cleaned and capped; a field
        with the wrong type reads as absent, and the object's phase is then `Unknown`
        with reason `Malformed` and the field and value as message."""
        r = FieldReader()
        meta = r.mapping(obj, "metadata", "metadata")
        status = r.mapping(obj, "status", "status")
        spec = r.mapping(obj, "spec", "spec")
        conditions = r.sequence(status, "conditions", "status.conditions")
        ready: Mapping[str, Any] = {}
        for index, condition in enumerate(conditions):
            if not isinstance(condition, Mapping):
                r.problems.append(expected(f"status.conditions[{index}]", "an object",
                                           condition))
            elif condition.get("type") == "Ready" and not ready:
                ready = condition
        where = "status.conditions[Ready]"
        observed = cls(
            name=r.text(meta, "name", "metadata.name", MAX_NAME_CHARS) or "",
            labels=r.labels(meta, "labels", "metadata.labels"),
            spec=dict(spec),
            resource_version=r.text(meta, "resourceVersion", "metadata.resourceVersion",
                                    MAX_TOKEN_CHARS) or "",
            generation=r.integer(meta, "generation", "metadata.generation"),
            phase=r.text(status, "phase", "status.phase", MAX_REASON_CHARS),
            observed_generation=r.integer(status, "observedGeneration",
                                          "status.observedGeneration"),
            ready_status=r.text(ready, "status", f"{where}.status", MAX_REASON_CHARS),
            ready_reason=r.text(ready, "reason", f"{where}.reason", MAX_REASON_CHARS),
            ready_message=r.message(ready, "message", f"{where}.message"),
        )
        problem = r.problem
        if problem is None:
            return observed
        return dataclasses.replace(observed, phase=UNKNOWN_PHASE, ready_status=None,
                                   ready_reason=MALFORMED_REASON, ready_message=problem)


@dataclass(frozen=True, slots=True)
class Apply:
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


def plan_cluster(desired: Iterable[Policy], observed: Mapping[str, Observed]) -> list[Apply]:
    """The applies that bring one cluster in line; empty when it is in sync."""
    actions: list[Apply] = []
    for policy in desired:
        body = render_policy(policy)
        found = observed.get(object_name(policy.id))
        if found is None:
            actions.append(Apply(policy, body, Why.MISSING))
        elif differs(body, found):
            actions.append(Apply(policy, body, Why.DRIFT))
    return actions
