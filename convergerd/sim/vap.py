"""The simulator's admission: when kube-apiserver runs ValidatingAdmissionPolicies, on what.

On every write the store admits (`ClusterStore.admission`), `StoreAdmission` passes the cluster's
policies, bindings and the request's Namespace to the product's evaluator
(`convergerd.admission.evaluate`, the same one `convergerd policy eval` uses), unless the
cluster is below 1.30 (no admission policies served) or the `admission` fault turned
enforcement off; a denial is answered with kube-apiserver's Status (`denied`). A `Warn`
binding's failures are answered as kube-apiserver does, one `Warning: 299 - "<text>"` header
each, on the answer whatever its status (`recording_warnings`, `with_warnings`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import TYPE_CHECKING

from aiohttp import web

from convergerd.admission.evaluate import Attributes, Denial, PolicyEvaluator, forbidden_message
from convergerd.sim import status
from convergerd.sim.resources import (
    NAMESPACES,
    VALIDATING_ADMISSION_POLICIES,
    VALIDATING_ADMISSION_POLICY_BINDINGS,
)

if TYPE_CHECKING:
    from convergerd.sim.store import AdmissionRequest, ClusterStore


# kube-apiserver keeps a request's warnings in its context (`warning.AddWarning(ctx, ...)`) and
# writes them as headers on the answer. The simulator does the same: the server opens a
# recorder around each request (`recording_warnings`), admission adds to it; no request sees
# another's, and the store needs no way to hand them back.
_RECORDER: ContextVar[list[str] | None] = ContextVar("admission_warnings", default=None)


@contextlib.contextmanager
def recording_warnings() -> Iterator[list[str]]:
    """The warnings admission gives while the block runs (one request's)."""
    found: list[str] = []
    token = _RECORDER.set(found)
    try:
        yield found
    finally:
        _RECORDER.reset(token)


def _record(warnings: tuple[str, ...]) -> None:
    found = _RECORDER.get()
    if found is not None:
        # As kube-apiserver's recorder: a text given twice is written once; one that cannot
        # be a header value (a control character) is dropped.
        found.extend(w for w in warnings if w not in found and w.isprintable())


def warning_header(text: str) -> str:
    """`299 - "<text>"`, `"` and `\\` escaped (apimachinery's NewWarningHeader)."""
    return '299 - "' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def with_warnings(response: web.StreamResponse, warnings: list[str]) -> web.StreamResponse:
    """`response` with one `Warning` header per text (not on a stream already started)."""
    if not response.prepared:
        for text in warnings:
            response.headers.add("Warning", warning_header(text))
    return response


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
    ) -> None:
        """`enforcing()`: read on every write (the `admission` fault turns enforcement off)."""
        self._store = store
        self._evaluator = evaluator
        self._enforcing = enforcing

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
        decision = self._evaluator.decide(
            store.stored_objects(VALIDATING_ADMISSION_POLICIES), bindings, attrs,
            namespace=namespace,
        )
        _record(decision.warnings)
        if decision.denial is not None:
            raise denied(attrs, decision.denial)
