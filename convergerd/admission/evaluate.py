"""ValidatingAdmissionPolicy evaluation, as kube-apiserver's policy plugin does it (pure).

For one request: every binding (sorted by name) whose policy exists, whose
`matchConstraints` and own `matchResources` match the request (resource rules, exclusions,
namespaceSelector on the namespace's labels, objectSelector on the new or old object) and whose
`matchConditions` hold, has its policy's validations evaluated in order. A validation that is
not `true` is a denial (message: `messageExpression` when it gives one line, else `message`,
else `failed expression: <expr>`; reason from the validation, default Invalid); one that cannot
be evaluated is a denial under `failurePolicy: Fail` (the default) and ignored under `Ignore`.
What a failed validation does is the binding's `validationActions` (`admit`, as
k8s.io/apiserver/pkg/admission/plugin/policy/validating/dispatcher.go `Dispatch` does it):
`Deny` rejects the request (every binding is still evaluated; the first denial is the one
reported), `Warn` admits it with an HTTP `Warning` per failed validation, `Audit` admits it and
records the audit annotation `validation.policy.admission.k8s.io/validation_failure`. Each
(failed validation, action) is one increment of kube-apiserver's counter
`apiserver_validating_admission_policy_check_total{policy, policy_binding, error_type,
enforcement_action}` (`Check`); a validation that passes is never counted, an evaluation error
under `failurePolicy: Ignore` is counted with action `allow`
(k8s.io/apiserver/pkg/admission/plugin/policy/validating/metrics/metrics.go).

The evaluator knows no store: the caller passes the policies, bindings and namespace. The
simulator's admission (`convergerd.sim.vap`) does so for a cluster's store on every write, and
`convergerd policy eval` for the objects it is given; both answer a denial with
`forbidden_message`, kube-apiserver's words, and a warning with `warning_text`.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from convergerd.admission.cel import CelError, CelRuntime
from convergerd.admission.labels import SelectorError, label_selector_from_object

Obj = dict[str, Any]
ADMISSION_GROUP = "admissionregistration.k8s.io"
_CODES = {"Forbidden": 403, "Unauthorized": 401, "RequestEntityTooLarge": 413, "Invalid": 422}
_MESSAGE_MAX_CHARS = 5 * 1024
_VARIABLE_REF = re.compile(r"\bvariables\.([A-Za-z_][A-Za-z0-9_]*)")
# The audit annotation of a failed validation under `Audit` (dispatcher.go).
VALIDATION_FAILURE_ANNOTATION = "validation.policy.admission.k8s.io/validation_failure"
# `error_type` of the counter (validating/errors.go `ErrorType`): a failed validation is not an
# "evaluation that succeeded" (EvalAdmit, the only `no_error`, is never counted), so it is
# `invalid_error` like a runtime error; `compile_error` when the expression did not compile.
# (`out_of_budget` needs CEL cost accounting, which this evaluator does not do.)
INVALID_ERROR = "invalid_error"
COMPILE_ERROR = "compile_error"
# The counter's `enforcement_action` values (metrics.go Observe*).
DENY, WARN, AUDIT, ALLOW = "deny", "warn", "audit", "allow"
# Evaluation kinds of a decision (PolicyDecisionEvaluation) and our configuration errors.
EVAL_DENY, EVAL_ERROR, CONFIG_ERROR = "deny", "error", "config"


@dataclass(frozen=True, slots=True)
class Attributes:
    """What admission knows about a request (admission.Attributes)."""

    operation: str  # CREATE, UPDATE, DELETE, CONNECT
    group: str
    version: str
    resource: str  # plural
    kind: str
    namespace: str | None
    name: str
    object: Mapping[str, Any] | None
    old_object: Mapping[str, Any] | None
    subresource: str = ""
    dry_run: bool = False

    @property
    def group_resource(self) -> str:
        return f"{self.resource}.{self.group}" if self.group else self.resource


@dataclass(frozen=True, slots=True)
class Denial:
    """A validation that did not pass (a PolicyDecision with action Deny), or an evaluation
    error `ignored` under `failurePolicy: Ignore` (action Admit, counted as `allow`)."""

    policy: str
    binding: str
    message: str  # the validation's message (or the evaluation error)
    reason: str = "Invalid"
    # EVAL_DENY (the expression was not true), EVAL_ERROR (it could not be evaluated) or
    # CONFIG_ERROR (a selector or paramKind we cannot use: like kube's configuration errors,
    # it denies under Fail but is never counted)
    evaluation: str = EVAL_DENY
    error_type: str = INVALID_ERROR
    expression_index: int = 0  # of the validation, for the audit annotation
    ignored: bool = False

    @property
    def code(self) -> int:
        return _CODES.get(self.reason, 422)

    @property
    def full_message(self) -> str:
        """`ValidatingAdmissionPolicy '<p>' with binding '<b>' denied request: <message>`."""
        return (
            f"ValidatingAdmissionPolicy '{self.policy}' with binding '{self.binding}' "
            f"denied request: {self.message}"
        )


@dataclass(frozen=True, slots=True)
class Check:
    """One increment of `apiserver_validating_admission_policy_check_total`."""

    policy: str
    binding: str
    error_type: str
    action: str  # DENY, WARN, AUDIT or ALLOW


@dataclass(frozen=True, slots=True)
class Outcome:
    """What admission made of one request: the denials of `Deny` bindings (the first one
    rejects it), the Warning texts of `Warn` bindings, the audit annotations of `Audit`
    bindings (key, value) and the counter's increments, each in evaluation order."""

    denials: tuple[Denial, ...] = ()
    warnings: tuple[str, ...] = ()
    annotations: tuple[tuple[str, str], ...] = ()
    checks: tuple[Check, ...] = ()

    @property
    def denial(self) -> Denial | None:
        """The denial that rejects the request, or None to admit it."""
        return self.denials[0] if self.denials else None


def warning_text(denial: Denial) -> str:
    """The Warning a `Warn` binding adds for a failed validation (dispatcher.go)."""
    return (f"Validation failed for ValidatingAdmissionPolicy '{denial.policy}' with binding "
            f"'{denial.binding}': {denial.message}")


def _annotation(binding: Mapping[str, Any], denial: Denial, actions: list[str]) -> str:
    """`publishValidationFailureAnnotation`: a JSON list of one failure (Go field order)."""
    return json.dumps([{"message": denial.message,
                        "policy": str(_spec(binding).get("policyName") or ""),
                        "binding": denial.binding,
                        "expressionIndex": denial.expression_index,
                        "validationActions": actions}], separators=(",", ":"),
                      ensure_ascii=False)


def validation_actions(binding: Mapping[str, Any]) -> list[str]:
    """The binding's `validationActions` (strings only; the API refuses anything else)."""
    actions = _spec(binding).get("validationActions")
    return [a for a in actions if isinstance(a, str)] if isinstance(actions, list) else []


@dataclass
class _Scope:
    """One evaluation's CEL inputs, with the policy's variables computed on first use."""

    data: dict[str, Any]
    declared: dict[str, str]  # variable name -> expression, in declaration order
    values: dict[str, Any] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)


class PolicyEvaluator:
    """Evaluates ValidatingAdmissionPolicies with their bindings on one request at a time."""

    def __init__(self, runtime: CelRuntime | None = None) -> None:
        self._cel = runtime if runtime is not None else CelRuntime()

    def first_denial(
        self,
        policies: Iterable[Mapping[str, Any]],
        bindings: Iterable[Mapping[str, Any]],
        attrs: Attributes,
        *,
        namespace: Mapping[str, Any] | None,
        apply_namespace_selector: bool = True,
    ) -> Denial | None:
        """The denial that rejects the request, or None to admit it (`admit(...).denial`)."""
        return self.admit(policies, bindings, attrs, namespace=namespace,
                          apply_namespace_selector=apply_namespace_selector).denial

    def admit(
        self,
        policies: Iterable[Mapping[str, Any]],
        bindings: Iterable[Mapping[str, Any]],
        attrs: Attributes,
        *,
        namespace: Mapping[str, Any] | None,
        apply_namespace_selector: bool = True,
    ) -> Outcome:
        """Every binding's verdict on the request, by its `validationActions`. `namespace` is
        the request's Namespace object (None for cluster-scoped requests)."""
        if attrs.group == ADMISSION_GROUP:
            return Outcome()  # policies never apply to admission configuration itself
        by_name = {_name(p): p for p in policies}
        denials: list[Denial] = []
        warnings: list[str] = []
        annotations: list[tuple[str, str]] = []
        checks: list[Check] = []
        for binding in sorted(bindings, key=_name):
            policy = by_name.get(str(_spec(binding).get("policyName") or ""))
            if policy is None:
                continue
            actions = validation_actions(binding)
            for decision in self._decisions(policy, binding, attrs, namespace=namespace,
                                            apply_namespace_selector=apply_namespace_selector):
                counted = decision.evaluation != CONFIG_ERROR
                if decision.ignored:
                    if counted:
                        checks.append(Check(decision.policy, decision.binding,
                                            decision.error_type, ALLOW))
                    continue
                if not counted:
                    denials.append(decision)  # a configuration error denies, whatever actions
                    continue
                for action in actions:
                    if action == "Deny":
                        denials.append(decision)
                    elif action == "Audit":
                        annotations.append((VALIDATION_FAILURE_ANNOTATION,
                                            _annotation(binding, decision, actions)))
                    elif action == "Warn":
                        warnings.append(warning_text(decision))
                    else:
                        continue
                    checks.append(Check(decision.policy, decision.binding,
                                        decision.error_type, action.lower()))
        return Outcome(tuple(denials), tuple(warnings), tuple(annotations), tuple(checks))

    def evaluate(
        self,
        policy: Mapping[str, Any],
        binding: Mapping[str, Any] | None,
        attrs: Attributes,
        *,
        namespace: Mapping[str, Any] | None,
        apply_namespace_selector: bool = True,
    ) -> list[Denial]:
        """Every failed validation of `policy` on the request, [] when it does not match."""
        return [d for d in self._decisions(policy, binding, attrs, namespace=namespace,
                                           apply_namespace_selector=apply_namespace_selector)
                if not d.ignored]

    def _decisions(
        self,
        policy: Mapping[str, Any],
        binding: Mapping[str, Any] | None,
        attrs: Attributes,
        *,
        namespace: Mapping[str, Any] | None,
        apply_namespace_selector: bool,
    ) -> list[Denial]:
        """The failed validations and evaluation errors (`ignored` under Ignore) of `policy`
        with `binding` on the request, in order; [] when it does not match."""
        pspec = _spec(policy)
        policy_name, binding_name = _name(policy), _name(binding) if binding else ""
        fail = pspec.get("failurePolicy", "Fail") != "Ignore"

        def error(message: str, evaluation: str, error_type: str = INVALID_ERROR
                  ) -> list[Denial]:
            return [Denial(policy_name, binding_name, message, evaluation=evaluation,
                           error_type=error_type, ignored=not fail)]

        try:
            matched = _matches(pspec.get("matchConstraints"), attrs, namespace,
                               apply_namespace_selector, policy_level=True)
            if matched and binding is not None:
                matched = _matches(_spec(binding).get("matchResources"), attrs, namespace,
                                   apply_namespace_selector, policy_level=False)
        except SelectorError as exc:
            return error(f"invalid selector: {exc}", CONFIG_ERROR)
        if not matched:
            return []
        if pspec.get("paramKind"):
            return error("policy parameters (paramKind) are not supported by the simulator",
                         CONFIG_ERROR)
        scope = self._scope(pspec, attrs, namespace)
        conditions = _entries(pspec.get("matchConditions"))
        for condition in conditions:
            expression = str(condition.get("expression", ""))
            try:
                if self._run(expression, scope) is not True:
                    return []
            except CelError as exc:
                return error(str(exc), EVAL_ERROR, self._error_type(expression))
        decisions: list[Denial] = []
        for index, validation in enumerate(_entries(pspec.get("validations"))):
            decision = self._validate(validation, scope, policy_name, binding_name, fail)
            if decision is not None:
                decisions.append(dataclasses.replace(decision, expression_index=index))
        return decisions

    def _error_type(self, expression: str) -> str:
        return COMPILE_ERROR if self._cel.compile_error(expression) else INVALID_ERROR

    def _scope(
        self, pspec: Mapping[str, Any], attrs: Attributes, namespace: Mapping[str, Any] | None
    ) -> _Scope:
        data: dict[str, Any] = {
            "object": attrs.object,
            "oldObject": attrs.old_object,
            "request": _request(attrs),
            "params": None,
            "namespaceObject": namespace,
            "variables": {},
        }
        declared = {
            str(v.get("name", "")): str(v.get("expression", ""))
            for v in _entries(pspec.get("variables"))
        }
        return _Scope(data=data, declared=declared)

    def _run(self, expression: str, scope: _Scope) -> Any:
        """`expression` with the variables it uses computed; errors as kube words them."""
        try:
            self._resolve(expression, scope, depth=0)
            return self._cel.evaluate(expression, scope.data | {"variables": scope.values})
        except CelError as exc:
            raise CelError(f"expression '{expression.strip()}' resulted in error: {exc}") from None

    def _resolve(self, expression: str, scope: _Scope, depth: int) -> None:
        """Compute the variables `expression` refers to (lazily, as kube does), in order."""
        for name in _VARIABLE_REF.findall(expression):
            if name in scope.errors:
                raise CelError(scope.errors[name])
            if name in scope.values or name not in scope.declared or depth > len(scope.declared):
                continue
            var_expr = scope.declared[name]
            try:
                self._resolve(var_expr, scope, depth + 1)
                data = scope.data | {"variables": scope.values}
                scope.values[name] = self._cel.evaluate(var_expr, data)
            except CelError as exc:
                scope.errors[name] = f"composited variable {name!r} fails to evaluate: {exc}"
                raise CelError(scope.errors[name]) from None

    def _validate(
        self,
        validation: Mapping[str, Any],
        scope: _Scope,
        policy_name: str,
        binding_name: str,
        fail: bool,
    ) -> Denial | None:
        expression = str(validation.get("expression", ""))
        try:
            result = self._run(expression, scope)
        except CelError as exc:
            return Denial(policy_name, binding_name, str(exc), evaluation=EVAL_ERROR,
                          error_type=self._error_type(expression), ignored=not fail)
        if result is True:
            return None
        reason = str(validation.get("reason") or "Invalid")
        return Denial(policy_name, binding_name, self._message(validation, scope), reason)

    def _message(self, validation: Mapping[str, Any], scope: _Scope) -> str:
        message_expression = validation.get("messageExpression")
        if isinstance(message_expression, str) and message_expression:
            try:
                text = self._run(message_expression, scope)
            except CelError:
                text = None
            if isinstance(text, str) and text.strip() and "\n" not in text.strip() \
                    and len(text) <= _MESSAGE_MAX_CHARS:
                return text.strip()
        message = validation.get("message")
        if isinstance(message, str) and message.strip():
            return message.strip()
        return f"failed expression: {str(validation.get('expression', '')).strip()}"


# --- matching ----------------------------------------------------------------------------------


def _matches(
    criteria: Any,
    attrs: Attributes,
    namespace: Mapping[str, Any] | None,
    apply_namespace_selector: bool,
    *,
    policy_level: bool,
) -> bool:
    """matching.go Matches: selectors, exclusions, then the resource rules (a binding's empty
    rules mean 'whatever the policy matched'; a binding without matchResources matches all)."""
    if criteria is None:
        return not policy_level  # a policy without matchConstraints matches nothing
    if not isinstance(criteria, Mapping):
        return False
    selected = (
        not apply_namespace_selector
        or _namespace_matches(criteria.get("namespaceSelector"), attrs, namespace)
    ) and _object_matches(criteria.get("objectSelector"), attrs)
    excluded = any(
        _rule_matches(r, attrs) for r in _entries(criteria.get("excludeResourceRules"))
    )
    if not selected or excluded:
        return False
    rules = _entries(criteria.get("resourceRules"))
    return any(_rule_matches(r, attrs) for r in rules) if rules else not policy_level


def _namespace_matches(
    selector: Any, attrs: Attributes, namespace: Mapping[str, Any] | None
) -> bool:
    if not attrs.namespace and attrs.resource != "namespaces":
        return True  # cluster-scoped, not a namespace: never exempted
    parsed = label_selector_from_object(selector)
    if parsed.empty:
        return True
    if attrs.resource == "namespaces":
        namespace = attrs.old_object if attrs.operation == "DELETE" else attrs.object
    return parsed.matches(_labels(namespace))


def _object_matches(selector: Any, attrs: Attributes) -> bool:
    parsed = label_selector_from_object(selector)
    if parsed.empty:
        return True
    return any(
        obj is not None and parsed.matches(_labels(obj))
        for obj in (attrs.object, attrs.old_object)
    )


def _rule_matches(rule: Mapping[str, Any], attrs: Attributes) -> bool:
    def listed(key: str, value: str) -> bool:
        values = rule.get(key) or []
        return isinstance(values, list) and ("*" in values or value in values)

    scope = rule.get("scope", "*")
    if scope == "Namespaced" and not attrs.namespace:
        return False
    if scope == "Cluster" and attrs.namespace:
        return False
    return (
        listed("operations", attrs.operation)
        and listed("apiGroups", attrs.group)
        and listed("apiVersions", attrs.version)
        and _resource_listed(rule.get("resources") or [], attrs)
    )


def _resource_listed(resources: Any, attrs: Attributes) -> bool:
    """rules.Matcher: `r` matches the resource itself, `r/sub` one subresource; `*` stands
    for any resource or subresource (`*` alone: no subresource, `*/*`: everything)."""
    if not isinstance(resources, list):
        return False
    for entry in resources:
        if not isinstance(entry, str):
            continue
        res, _, sub = entry.partition("/")
        if res in ("*", attrs.resource) and sub in ("*", attrs.subresource):
            return True
    return False


# --- helpers -------------------------------------------------------------------------------------


def _spec(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    spec = (obj or {}).get("spec")
    return spec if isinstance(spec, Mapping) else {}


def _name(obj: Mapping[str, Any] | None) -> str:
    meta = (obj or {}).get("metadata")
    return str(meta.get("name", "")) if isinstance(meta, Mapping) else ""


def _labels(obj: Mapping[str, Any] | None) -> Mapping[str, str]:
    meta = (obj or {}).get("metadata")
    labels = meta.get("labels") if isinstance(meta, Mapping) else None
    return labels if isinstance(labels, Mapping) else {}


def _entries(value: Any) -> list[Mapping[str, Any]]:
    return [v for v in value if isinstance(v, Mapping)] if isinstance(value, list) else []


def _request(attrs: Attributes) -> Obj:
    kind = {"group": attrs.group, "version": attrs.version, "kind": attrs.kind}
    resource = {"group": attrs.group, "version": attrs.version, "resource": attrs.resource}
    return {
        "kind": kind,
        "resource": resource,
        "requestKind": kind,
        "requestResource": resource,
        "subResource": attrs.subresource,
        "name": attrs.name,
        "namespace": attrs.namespace or "",
        "operation": attrs.operation,
        "userInfo": {},
        "dryRun": attrs.dry_run,
        "options": {},
    }


def forbidden_message(attrs: Attributes, denial: Denial) -> str:
    """The message kube-apiserver answers a denial with (admission.NewForbidden):
    `<resource> "<name>" is forbidden: ValidatingAdmissionPolicy '<p>' ...`."""
    subject = (f"{attrs.group_resource} {json.dumps(attrs.name, ensure_ascii=False)}"
               if attrs.name else attrs.group_resource)
    return f"{subject} is forbidden: {denial.full_message}"
