"""The cluster-access boundary: what the round engine, the elector and the status code need
from a cluster, as Protocols. `convergerd.kube.client` implements them over kubernetes-asyncio;
tests may pass the simulator-backed real client or a small fake written for the purpose.

Every method raises only `convergerd.core.errors.ClusterError` subclasses (already classified), and
honours `timeout_s` as a hard bound on the whole call including the rate limiter's wait.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from convergerd.core.model import ClusterId

KubeObject = dict[str, Any]
LEASE_API_VERSION = "coordination.k8s.io/v1"  # the Leases of `LeaseApi`


@dataclass(frozen=True, slots=True)
class ObjectList:
    items: Sequence[KubeObject]
    resource_version: str
    requests: int  # how many pages it took
    # Objects too large to read even alone (over the response cap), stepped past: stubs of
    # `{"metadata": {"namespace", "name"}}`, so the caller can name them.
    skipped: Sequence[KubeObject] = ()


@dataclass(frozen=True, slots=True)
class Admitted:
    """A dry-run create's answer: the object as admission left it, and the texts of the
    answer's `Warning` headers (decoded and bounded: `decode.warning_texts`), where
    kube-apiserver says what a Warn binding's policy failed."""

    object: KubeObject
    warnings: Sequence[str] = ()


@dataclass(frozen=True, slots=True)
class Applied:
    object: KubeObject
    created: bool  # 201: the object did not exist before


class PolicyApi(Protocol):
    """Policy custom resources (policies.platform.stackship.se/v1alpha1) in one cluster."""

    @property
    def cluster(self) -> ClusterId: ...

    async def list_policies(self, *, label_selector: str, timeout_s: float) -> ObjectList:
        """Every Policy matching the selector, following `continue` until the end.
        A missing Policy API (CRD not installed) is a `ClusterLevelError` (reason crd_missing)."""
        ...

    async def apply_policy(self, body: KubeObject, *, timeout_s: float) -> Applied:
        """Server-side apply as field manager `stackship-platform` with force."""
        ...

    async def delete_policy(self, name: str, *, timeout_s: float) -> bool:
        """False when it was already gone."""
        ...

    async def server_version(self, *, timeout_s: float) -> str:
        """`gitVersion` from /version: a cheap reachability check."""
        ...


class LeaseApi(Protocol):
    """coordination.k8s.io/v1 Leases in the home cluster."""

    async def get_lease(self, namespace: str, name: str, *, timeout_s: float) -> KubeObject | None:
        """None when the Lease does not exist."""
        ...

    async def create_lease(self, body: KubeObject, *, timeout_s: float) -> KubeObject:
        """Raises `ObjectRejected` with status 409 when someone created it first."""
        ...

    async def replace_lease(self, body: KubeObject, *, timeout_s: float) -> KubeObject:
        """PUT with the body's resourceVersion as precondition: `ObjectRejected` with status 409
        when the Lease changed since it was read."""
        ...


class LeaseListApi(LeaseApi, Protocol):
    """Leases, and listing them: the shard set reads every shard and membership Lease with one
    request per retry period."""

    async def list_leases(self, namespace: str, *, timeout_s: float) -> list[KubeObject]:
        """Every Lease in `namespace` (one page: a Lease namespace holds a few hundred)."""
        ...


class RequestObserver(Protocol):
    """Told about every request to a cluster (metrics hook; never sees bodies or credentials)."""

    def request_done(
        self, cluster: str, verb: str, status: int | None, duration_s: float
    ) -> None:
        """`status` None means no HTTP answer (connect error, timeout, reset)."""
        ...

    def retry(self, cluster: str, reason: str) -> None: ...


# --- any resource (the operator, watch caches) -------------------------------------------------


@dataclass(frozen=True, slots=True)
class Resource:
    """A served resource type, addressed by group, version and plural ("" group: core)."""

    group: str
    version: str
    plural: str
    namespaced: bool = False

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, name: str | None = None, *, namespace: str | None = None,
             subresource: str | None = None) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace is not None:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        if name is not None:
            base += f"/{name}"
            if subresource is not None:
                base += f"/{subresource}"
        return base

    def __str__(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One decoded watch event. `object` is the object (ADDED, MODIFIED, DELETED), a bookmark's
    stub, or the Status of an ERROR (then `code` is its HTTP code, e.g. 410)."""

    type: str  # ADDED, MODIFIED, DELETED, BOOKMARK, ERROR
    object: KubeObject
    name: str | None
    resource_version: str | None
    code: int | None = None


class WatchApi(Protocol):
    """List and watch one resource type in one cluster (what a watch cache needs)."""

    async def list_objects(self, resource: Resource, *, label_selector: str | None,
                           timeout_s: float,
                           transform: Callable[[KubeObject], KubeObject | None] | None = None,
                           step_past: bool = False,
                           ) -> ObjectList:
        """Every object, following `continue` until the end; with `transform`, each item as
        it returns (None: left out), one page at a time. A page over the response cap is
        asked again smaller; with `step_past`, an object too large alone is stepped past and
        named in `skipped`."""
        ...

    def watch(self, resource: Resource, *, resource_version: str, label_selector: str | None,
              timeout_s: float) -> AsyncIterator[WatchEvent]:
        """Events after `resource_version`, with bookmarks, until the server ends the watch
        (about `timeout_s`). A too-old version is an ERROR event with code 410, as the server
        sends it."""
        ...
