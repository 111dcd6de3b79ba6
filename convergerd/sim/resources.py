"""The resource types the simulated apiserver serves, with the strategy flags that matter.

Each flag mirrors one knob of a kube-apiserver registry strategy (docs/design.md, "The fleet
simulator"); the store reads them instead of special-casing kinds.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ResourceType:
    group: str  # "" for core
    version: str
    plural: str
    singular: str
    kind: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    has_status: bool = False  # status subresource
    # generation 1 on create, +1 when anything outside metadata (and status, with a status
    # subresource) changes: custom resources and ValidatingAdmissionPolicy(Binding)
    has_generation: bool = False
    allow_unconditional_update: bool = False  # PUT without metadata.resourceVersion allowed
    allow_create_on_update: bool = False  # PUT on a missing object creates it (leases)
    builtin: bool = True  # built-in list items omit kind/apiVersion; CR list items carry them
    min_minor: int | None = None  # served only when the cluster's minor version >= this
    # DELETE answers with the object (registry ReturnDeletedObject) instead of a Success Status
    delete_returns_object: bool = False
    name_is_dns_label: bool = False  # namespaces: RFC 1123 label, others: subdomain

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def group_resource(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"


POLICIES = ResourceType(
    group="platform.stackship.se",
    version="v1alpha1",
    plural="policies",
    singular="policy",
    kind="Policy",
    namespaced=False,
    has_status=True,
    has_generation=True,
    builtin=False,
)
LEASES = ResourceType(
    group="coordination.k8s.io",
    version="v1",
    plural="leases",
    singular="lease",
    kind="Lease",
    namespaced=True,
    allow_create_on_update=True,
)
NAMESPACES = ResourceType(
    group="",
    version="v1",
    plural="namespaces",
    singular="namespace",
    kind="Namespace",
    namespaced=False,
    short_names=("ns",),
    has_status=True,
    allow_unconditional_update=True,
    delete_returns_object=True,
    name_is_dns_label=True,
)
PODS = ResourceType(
    group="",
    version="v1",
    plural="pods",
    singular="pod",
    kind="Pod",
    namespaced=True,
    short_names=("po",),
    categories=("all",),
    has_status=True,
    allow_unconditional_update=True,
    delete_returns_object=True,
)
VALIDATING_ADMISSION_POLICIES = ResourceType(
    group="admissionregistration.k8s.io",
    version="v1",
    plural="validatingadmissionpolicies",
    singular="validatingadmissionpolicy",
    kind="ValidatingAdmissionPolicy",
    namespaced=False,
    categories=("api-extensions",),
    has_status=True,
    has_generation=True,
    min_minor=30,
)
VALIDATING_ADMISSION_POLICY_BINDINGS = ResourceType(
    group="admissionregistration.k8s.io",
    version="v1",
    plural="validatingadmissionpolicybindings",
    singular="validatingadmissionpolicybinding",
    kind="ValidatingAdmissionPolicyBinding",
    namespaced=False,
    categories=("api-extensions",),
    has_generation=True,
    min_minor=30,
)



def _workload(
    group: str, plural: str, kind: str, short_names: tuple[str, ...] = ()
) -> ResourceType:
    """A built-in workload kind: status subresource, generation (bumped by spec changes), PUT
    without resourceVersion allowed, DELETE answered with a Success Status."""
    return ResourceType(
        group=group,
        version="v1",
        plural=plural,
        singular=kind.lower(),
        kind=kind,
        namespaced=True,
        short_names=short_names,
        categories=("all",),
        has_status=True,
        has_generation=True,
        allow_unconditional_update=True,
    )


DEPLOYMENTS = _workload("apps", "deployments", "Deployment", ("deploy",))
REPLICASETS = _workload("apps", "replicasets", "ReplicaSet", ("rs",))
STATEFULSETS = _workload("apps", "statefulsets", "StatefulSet", ("sts",))
DAEMONSETS = _workload("apps", "daemonsets", "DaemonSet", ("ds",))
JOBS = _workload("batch", "jobs", "Job")
CRONJOBS = _workload("batch", "cronjobs", "CronJob", ("cj",))
WORKLOADS = (DEPLOYMENTS, REPLICASETS, STATEFULSETS, DAEMONSETS, JOBS, CRONJOBS)

ALL_TYPES: tuple[ResourceType, ...] = (
    POLICIES,
    LEASES,
    NAMESPACES,
    PODS,
    VALIDATING_ADMISSION_POLICIES,
    VALIDATING_ADMISSION_POLICY_BINDINGS,
    *WORKLOADS,
)


def served(rt: ResourceType, minor: int) -> bool:
    """Whether a cluster running Kubernetes 1.<minor> serves this type."""
    return rt.min_minor is None or minor >= rt.min_minor
