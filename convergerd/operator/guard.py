"""`AdmissionGuard`: the watch on the admission objects the operator owns, so that one deleted
or edited by hand is put back within seconds, not at the next pass.

Kubernetes runs no admission on ValidatingAdmissionPolicies and their bindings (they are left
out of admission policies and webhooks, so that no policy can lock the cluster out of fixing
its policies): nothing can refuse a `kubectl delete validatingadmissionpolicybinding`. Seeing
it at once and putting it back is the only defence.

- **What is watched**: `validatingadmissionpolicies` and `validatingadmissionpolicybindings`
  with our label (`reconcile.MANAGED_SELECTOR`), each through a `kube.watch.Informer`, as the
  workload cache watches its kinds: one list, then a watch resumed from its resourceVersion
  (bookmarks; a 410 re-lists and reports only the differences), list pages and events read
  with the response cap, objects too large to read stepped past (`step_past`: reported as
  gone, so their Policy is looked at again).
- **What is kept**: per object its name and resourceVersion, nothing else (`slim`), and only
  for the names we make (`reconcile.is_admission_name`): the cache costs a few hundred bytes
  per admission object, whatever someone puts in one.
- **What it says**: `on_tampered(kind, name)` for every change that is not our own write
  (the resourceVersion our apply got back, `wrote`): a deletion, an edit, an object that
  stopped matching the selector (a label removed: kube-apiserver reports it as deleted). The
  operator then reconciles that Policy before anything else (`controller`), which decides
  what, if anything, to put back (`reconcile.writes_for`, `reconcile.repaired`).

Every replica runs it (a standby takes over warm); only the leader acts on what it says.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

from convergerd.kube.api import KubeObject, Resource, WatchApi
from convergerd.kube.watch import Informer
from convergerd.operator.reconcile import MANAGED_SELECTOR, is_admission_name

VAPS = Resource("admissionregistration.k8s.io", "v1", "validatingadmissionpolicies")
BINDINGS = Resource("admissionregistration.k8s.io", "v1", "validatingadmissionpolicybindings")
# `kind` in `on_tampered` and in `convergerd_operator_repairs_total{kind}`.
KINDS = {"policy": VAPS, "binding": BINDINGS}


def slim(obj: KubeObject) -> KubeObject | None:
    """What the guard keeps of an admission object: its name and resourceVersion; None for a
    name we do not make."""
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping) or not is_admission_name(meta.get("name")):
        return None
    version = meta.get("resourceVersion")
    return {"metadata": {"name": meta["name"],
                         "resourceVersion": version if isinstance(version, str) else None}}


class AdmissionGuard:
    def __init__(
        self,
        api: WatchApi,
        *,
        request_timeout_s: float,
        on_tampered: Callable[[str, str], None],
        on_restart: Callable[[str], None] = lambda reason: None,
    ) -> None:
        self._on_tampered = on_tampered
        # Per (kind, name), the resourceVersion of our last write: its own watch event is not
        # news. One entry per admission object we wrote.
        self._written: dict[tuple[str, str], str] = {}
        self.informers = {
            kind: Informer(api, resource, request_timeout_s=request_timeout_s,
                           label_selector=MANAGED_SELECTOR, transform=slim,
                           on_change=functools.partial(self._changed, kind),
                           on_restart=on_restart, step_past=True)
            for kind, resource in KINDS.items()}

    @property
    def synced(self) -> bool:
        """Both kinds listed and watched without a failure since."""
        return all(i.healthy for i in self.informers.values())

    def wrote(self, kind: str, answer: Mapping[str, Any] | None) -> None:
        """Our own write of an admission object (the object the server answered with)."""
        meta = answer.get("metadata") if isinstance(answer, Mapping) else None
        if not isinstance(meta, Mapping) or not is_admission_name(meta.get("name")):
            return
        version = meta.get("resourceVersion")
        if isinstance(version, str):
            self._written[(kind, meta["name"])] = version

    def deleted(self, kind: str, name: str) -> None:
        """We deleted it ourselves: forget our write (its deletion event is still reported,
        and the reconcile it causes finds nothing to put back)."""
        self._written.pop((kind, name), None)

    def _changed(self, kind: str, name: str, obj: KubeObject | None) -> None:
        if not self.informers[kind].synced.is_set():
            return  # the first list: what exists is not a change
        if obj is not None:
            version = obj["metadata"].get("resourceVersion")
            if version is not None and self._written.get((kind, name)) == version:
                return  # our own write coming back
        self._on_tampered(kind, name)
