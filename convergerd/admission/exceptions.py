"""A Policy's exceptions as its admission policy's `matchConditions` (pure).

Each exception in force becomes one matchCondition, `exception-<id>`, that is false for the
objects it excepts: kube-apiserver judges a request only when every matchCondition is true, so
an excepted object is admitted without its validations being run, and every other object is
judged as before. (One condition per exception, not one for all: each stays short and readable
in `kubectl get validatingadmissionpolicy -o yaml`, and kube-apiserver's limit of 64
matchConditions is `core.exceptions.MAX_EXCEPTIONS`.)

    !(request.namespace == "team-a-web" && has(object.metadata.name)
      && object.metadata.name == "api")

CEL in an admission policy has no clock, so expiry is not in the expression: the operator
renders only the exceptions still in force `EXPIRY_LEAD_S` from now (`honoured`), and renders
again when the next one lapses (`next_change`). Values reach the CEL only as quoted literals
(`render.cel_string`), after the checks of `core.exceptions`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping
from typing import Any

from convergerd.admission.render import Admission, RenderError, cel_string, render_admission
from convergerd.core.exceptions import (
    CONDITION_PREFIX,
    EXPIRY_LEAD_S,
    in_force,
    parse_exceptions,
)
from convergerd.core.model import PolicyException, RuleError


def spec_exceptions(spec: Mapping[str, Any]) -> tuple[PolicyException, ...]:
    """The Policy's `spec.exceptions`, checked as at grant time (less the clock); a bad list is
    `RenderError` `InvalidExceptions` naming the entry, field and value."""
    raw = spec.get("exceptions") if isinstance(spec, Mapping) else None
    if raw is None:
        return ()
    try:
        return parse_exceptions(raw, "spec.exceptions")
    except RuleError as exc:
        raise RenderError("InvalidExceptions", str(exc)) from None


def honoured(spec: Mapping[str, Any], now: dt.datetime) -> tuple[PolicyException, ...]:
    """The exceptions the operator renders at `now`: those not lapsing within
    `EXPIRY_LEAD_S`."""
    return in_force(spec_exceptions(spec), now, EXPIRY_LEAD_S)


def next_change(spec: Mapping[str, Any], now: dt.datetime) -> dt.datetime | None:
    """When the next honoured exception stops being honoured (None: none is)."""
    lead = dt.timedelta(seconds=EXPIRY_LEAD_S)
    return min((e.expires_at - lead for e in honoured(spec, now)), default=None)


def expression(exception: PolicyException) -> str:
    """The matchCondition's CEL: false exactly for the objects `exception` covers."""
    parts = [f"request.namespace == {cel_string(exception.namespace)}"]
    if exception.name is not None:
        parts.append(f"has(object.metadata.name) && object.metadata.name == "
                     f"{cel_string(exception.name)}")
    elif exception.selector is not None:
        parts.append("has(object.metadata.labels)")
        for key, value in exception.selector:
            k = cel_string(key)
            parts.append(f"{k} in object.metadata.labels && "
                         f"object.metadata.labels[{k}] == {cel_string(value)}")
    return "!(" + " && ".join(parts) + ")"


def match_conditions(exceptions: tuple[PolicyException, ...]) -> list[dict[str, str]]:
    return [{"name": CONDITION_PREFIX + e.id, "expression": expression(e)} for e in exceptions]


def render_excepted(spec: Mapping[str, Any], now: dt.datetime | None) -> Admission:
    """`render.render_admission`, with a matchCondition per exception honoured at `now` (none
    when there are none, so a policy without exceptions renders as it always did; none either
    without a time: the strict reading)."""
    admission = render_admission(spec)
    exceptions = honoured(spec, now) if now is not None else spec_exceptions(spec)[:0]
    if not exceptions:
        return admission
    policy = {**admission.policy,
              "spec": {**admission.policy["spec"],
                       "matchConditions": match_conditions(exceptions)}}
    return dataclasses.replace(admission, policy=policy)
