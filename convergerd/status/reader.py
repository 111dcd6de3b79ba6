"""The status state's read-only face (`StatusReader`): all that the HTTP views, the `/status`
document, the metrics and the wiring may see of `convergerd.status.state.StatusState`, and the
frozen facts it hands out (`RoundSummary`, `LeaderInfo`). Typed with it, a reader cannot
assign a fact, change a cluster or call a feeder: mypy refuses it. Pure.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import dataclass
from typing import Protocol

from convergerd.core.exceptions import ExceptionTally
from convergerd.core.model import ClusterId, PolicyId
from convergerd.core.report import AuditSample, Epoch, RoundReport
from convergerd.core.rows import PendingDeletions, RoundRow
from convergerd.status.admissions import PolicyTotals
from convergerd.status.cluster import ClusterFacts
from convergerd.status.rollouts import RolloutFacts
from convergerd.status.shards import ShardsSeen

# Readers type a cluster's facts by `ClusterFacts`, from here (its module is the state's own).
__all__ = ["Clock", "ClusterFacts", "LeaderInfo", "RoundSummary", "StatusReader"]

Clock = Callable[[], dt.datetime]


@dataclass(frozen=True, slots=True)
class RoundSummary:
    started_at: dt.datetime
    finished_at: dt.datetime | None
    result: str | None
    counts: Mapping[str, int]
    leader: str | None  # who ran it (the epoch holder)
    error: str | None = None

    @classmethod
    def from_report(cls, report: RoundReport) -> RoundSummary:
        return cls(report.started_at, report.finished_at, report.result.value, report.counts(),
                   report.epoch.holder if report.epoch else None, report.error)

    @classmethod
    def from_row(cls, row: RoundRow) -> RoundSummary:
        leader = row.epoch.holder if row.epoch else row.identity
        return cls(row.started_at, row.finished_at, str(row.result), dict(row.counts), leader,
                   row.error)


@dataclass(frozen=True, slots=True)
class LeaderInfo:
    is_leader: bool = False
    holder: str | None = None
    epoch: Epoch | None = None
    since: dt.datetime | None = None
    told: bool = False  # whether the elector has said anything yet
    # Changes of (leading, holder) after the first one told: this replica gaining or losing
    # it, or another holder taking over (`convergerd_leader_transitions_total`).
    changes: int = 0


class StatusReader(Protocol):
    """What this replica knows, read-only (`StatusState` is one)."""

    @property
    def identity(self) -> str: ...
    @property
    def interval_s(self) -> float: ...
    @property
    def probe_period_s(self) -> float:
        """The operators' probe period: a Verified probe's and an audit's age limit."""
    @property
    def clock(self) -> Clock: ...
    @property
    def version(self) -> int:
        """Counts the updates: a view built at one version stays true until the next."""
    @property
    def clusters(self) -> Mapping[ClusterId, ClusterFacts]:
        """The database's clusters (once known), each as this replica knows it."""
    @property
    def insecure(self) -> Set[str]:
        """The clusters reached without TLS verification or over http://."""
    @property
    def invalid(self) -> Mapping[str, str]:
        """The policies that cannot be delivered: id -> reason."""
    @property
    def exception_tally(self) -> Sequence[ExceptionTally]:
        """Exceptions per policy, as the database last counted them."""
    @property
    def pending(self) -> PendingDeletions: ...
    @property
    def last_round(self) -> RoundSummary | None: ...
    @property
    def next_round_at(self) -> dt.datetime | None: ...
    @property
    def synced_at(self) -> dt.datetime | None:
        """When the last database sync that answered did."""
    @property
    def sync_error(self) -> str | None:
        """Why the last database sync failed (None: it answered)."""
    @property
    def shards(self) -> ShardsSeen: ...
    @property
    def admission_totals(self) -> Mapping[PolicyId, PolicyTotals]:
        """Per policy, what admission did over the fleet (`status.admissions`)."""
    @property
    def rollouts(self) -> tuple[RolloutFacts, ...]:
        """The live rollouts, as the last database sync found them."""

    def leader(self) -> LeaderInfo: ...
    def cluster_ids(self) -> list[ClusterId]: ...
    def tracks(self, cluster: str) -> bool: ...
    def cluster_or_new(self, cluster: str) -> ClusterFacts: ...
    def samples_of(self, policy: PolicyId) -> tuple[tuple[ClusterId, AuditSample], ...]: ...
    def pending_deletions(self) -> tuple[int, dt.datetime | None]: ...
