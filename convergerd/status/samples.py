"""The audit samples the status keeps: per policy, not per policy and cluster (memory: policies
x clusters readings hold only counts), at most `AUDIT_SAMPLES_KEPT` across clusters, those of
the cluster read last first. Pure; written by the state as it observes a round's readings.
"""

from __future__ import annotations

from collections.abc import Iterable, KeysView

from convergerd.core.model import ClusterId, PolicyId
from convergerd.core.report import AuditSample

# Audit samples kept per policy.
AUDIT_SAMPLES_KEPT = 5


class AuditSamples:
    """Per policy, the kept samples and the cluster each came from."""

    __slots__ = ("_kept",)

    def __init__(self) -> None:
        self._kept: dict[PolicyId, tuple[tuple[ClusterId, AuditSample], ...]] = {}

    def policies(self) -> KeysView[PolicyId]:
        """The policies with samples kept (a live view: a membership test in C, asked for
        every reading of a round)."""
        return self._kept.keys()

    def of(self, policy: PolicyId) -> tuple[tuple[ClusterId, AuditSample], ...]:
        """The policy's kept samples, each with its cluster."""
        return self._kept.get(policy, ())

    def keep(self, policy: PolicyId, cluster: ClusterId,
             fresh: tuple[AuditSample, ...]) -> None:
        """The cluster's `fresh` samples of `policy` first, then the other clusters' kept."""
        kept = self._kept.get(policy, ())
        if kept or fresh:
            merged = (*((cluster, s) for s in fresh), *(e for e in kept if e[0] != cluster))
            if merged:
                self._kept[policy] = merged[:AUDIT_SAMPLES_KEPT]
            else:
                del self._kept[policy]

    def retain(self, policies: Iterable[PolicyId]) -> None:
        """Only the samples of `policies`."""
        wanted = set(policies)
        for gone in set(self._kept) - wanted:
            del self._kept[gone]
