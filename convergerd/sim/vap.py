"""The simulator's admission: when kube-apiserver runs ValidatingAdmissionPolicies, on what.

On every write the store admits (`ClusterStore.admission`), `StoreAdmission` passes the cluster's
policies, bindings and the request's Namespace to the product's evaluator
(`convergerd.admission.evaluate`, the same one `convergerd policy eval` uses), unless the
cluster is below 1.30 (no admission policies served) or the `admission` fault turned
enforcement off. A denial is answered with kube-apiserver's Status (`denied`); the warnings
and audit annotations of `Warn` and `Audit` bindings go to the request's notes (its Warning
headers and request-log entry, `convergerd.sim.notes`), dry-runs too, and the counter's
increments to the cluster's API servers (`convergerd.sim.apimetrics`), whatever the verdict.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from convergerd.admission.evaluate import (
    Attributes,
    Check,
    Denial,
    PolicyEvaluator,
    forbidden_message,
)
from convergerd.sim import status
from convergerd.sim.resources import (
    NAMESPACES,
    VALIDATING_ADMISSION_POLICIES,
    VALIDATING_ADMISSION_POLICY_BINDINGS,
)

if TYPE_CHECKING:
    from convergerd.sim.store import AdmissionRequest, ClusterStore


def denied(attrs: Attributes, denial: Denial) -> status.ApiError:
    """The Status kube-apiserver answers a denial with (admission.NewForbidden, then the
    reason and code of the validation, and the message as a cause)."""
    details = {
        "name": attrs.name,
        "group": attrs.group,
        "kind": attrs.resource,
        "causes": [{"message": denial.full_message}],
    }
    return status.ApiError(
        status.status_object(denial.code, denial.reason, forbidden_message(attrs, denial),
                             details)
    )


class StoreAdmission:
    """The `ClusterStore.admission` hook: the store's policies and bindings on each write."""

    def __init__(
        self, store: ClusterStore, evaluator: PolicyEvaluator,
        enforcing: Callable[[], bool] = lambda: True,
        counted: Callable[[Iterable[Check]], None] = lambda _: None,
    ) -> None:
        """`enforcing()`: read on every write (the `admission` fault turns enforcement off);
        `counted`: given each request's counter increments."""
        self._store = store
        self._evaluator = evaluator
        self._enforcing = enforcing
        self._counted = counted

    def __call__(self, request: AdmissionRequest) -> None:
        store = self._store
        if not store.serves(VALIDATING_ADMISSION_POLICY_BINDINGS):
            return  # below 1.30 there is no ValidatingAdmissionPolicy at all
        if not self._enforcing():
            return
        bindings = store.stored_objects(VALIDATING_ADMISSION_POLICY_BINDINGS)
        if not bindings:
            return
        rt = request.rt
        attrs = Attributes(
            operation=request.operation,
            group=rt.group,
            version=rt.version,
            resource=rt.plural,
            kind=rt.kind,
            namespace=request.namespace if rt.namespaced else None,
            name=request.name,
            object=request.object,
            old_object=request.old_object,
            subresource=request.subresource or "",
            dry_run=request.dry_run,
        )
        namespace = (
            store.stored_object(NAMESPACES, None, attrs.namespace) if attrs.namespace else None
        )
        outcome = self._evaluator.admit(
            store.stored_objects(VALIDATING_ADMISSION_POLICIES), bindings, attrs,
            namespace=namespace,
        )
        if outcome.checks:
            self._counted(outcome.checks)
        notes = request.notes
        if notes is not None:
            for text in outcome.warnings:
                notes.warn(text)
            for key, value in outcome.annotations:
                notes.annotate(key, value)
        if outcome.denial is not None:
            raise denied(attrs, outcome.denial)
