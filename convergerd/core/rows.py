"""What the database recorded, as the status code reads it: one definition of each row.

Plain data (no driver): `convergerd.store.store` builds them, `convergerd.status.state` merges
them into what this replica knows, the HTTP server shows them.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass

from convergerd.core.model import ClusterId, PolicyId, PolicyRow
from convergerd.core.report import ApplyResult, Epoch, PhaseReading, RoundResult


@dataclass(frozen=True, slots=True)
class RoundRow:
    """A recorded round (`Store.last_round()`)."""

    id: int
    started_at: dt.datetime
    finished_at: dt.datetime | None
    result: RoundResult
    epoch: Epoch | None
    identity: str
    counts: Mapping[str, int]
    error: str | None


@dataclass(frozen=True, slots=True)
class ClusterStateRow:
    """A cluster's latest outcome. A cluster never attempted has `reachable` None and no times."""

    cluster: ClusterId
    reachable: bool | None
    last_attempt_at: dt.datetime | None
    last_success_at: dt.datetime | None  # last time it fully converged
    last_reached_at: dt.datetime | None
    last_error: str | None
    last_reason: str | None
    desired: int
    in_sync: int
    failed: int
    server_version: str | None
    round_id: int | None


@dataclass(frozen=True, slots=True)
class DeliveryRow:
    """One policy on one cluster: the last delivery and the last reading, as shown. A
    round does not rewrite a row it read unchanged: the times of such a row (and `unchanged`
    for an in-sync one) come from its cluster's last listing (`convergerd.store.store`)."""

    policy: str
    cluster: str
    delivered_revision: int | None
    last_result: ApplyResult | None
    last_attempt_at: dt.datetime | None
    last_success_at: dt.datetime | None
    last_error: str | None
    last_reason: str | None
    attempts: int  # consecutive failed attempts; 0 after a success
    round_id: int | None  # None when written by a save
    # The last reading recorded with it (None: none, or the last listing did not find the
    # object), its fields read from their columns by `core.facts.READING`.
    reading: PhaseReading | None = None


@dataclass(frozen=True, slots=True)
class PolicyStatusRows:
    """One policy as `/v1/policies/{id}/status` reads it (`Store.policy_status()`): the stored
    row, why it cannot be delivered (validated now, None if it can), the known clusters its
    boundary covers, and its records on every cluster."""

    policy: PolicyRow
    invalid: str | None
    scope: frozenset[ClusterId]
    deliveries: tuple[DeliveryRow, ...]
    # When its deletion began (None: not being deleted); the clusters with a record still
    # hold it, or may.
    deletion_requested_at: dt.datetime | None = None


@dataclass(frozen=True, slots=True)
class PendingDeletion:
    """A policy whose deletion began and has not finished (`Store.pending_deletions()`): some
    cluster did not confirm the removal, and nobody has retried since."""

    policy: PolicyId
    requested_at: dt.datetime
    holders: int  # clusters still recorded as holding it
    held_by: tuple[ClusterId, ...]  # the first few of them, by id


@dataclass(frozen=True, slots=True)
class PendingDeletions:
    """How many deletions are pending, and the oldest of them."""

    total: int = 0
    oldest_first: tuple[PendingDeletion, ...] = ()

    @property
    def oldest_requested_at(self) -> dt.datetime | None:
        return self.oldest_first[0].requested_at if self.oldest_first else None


@dataclass(frozen=True, slots=True)
class ClusterStatusRows:
    """One cluster as `/v1/clusters/{id}` reads it (`Store.cluster_status()`): whether the
    database knows it, its records, and the current revision of each policy asked about or
    recorded there (absent: not in the database, or being deleted)."""

    known: bool
    deliveries: tuple[DeliveryRow, ...]
    current: Mapping[PolicyId, int]


@dataclass(frozen=True, slots=True)
class BoundaryPolicy:
    """One policy of a boundary as its view reads it: the stored row, why it cannot be
    delivered (validated now, None if it can), when its deletion began (None: not)."""

    policy: PolicyRow
    invalid: str | None
    deletion_requested_at: dt.datetime | None


@dataclass(frozen=True, slots=True)
class BoundaryRows:
    """One boundary as `/v1/boundaries/{boundary}` reads it (`Store.boundary_status()`): the
    known clusters it covers (by id), its policies (by id, at most the view's limit), how
    many policies it has in all, and the ids of its policies' live rollouts (any number: at
    most one per policy)."""

    clusters: tuple[ClusterId, ...]
    policies: tuple[BoundaryPolicy, ...]
    policies_total: int
    rollouts: frozenset[int] = frozenset()


# A boundary's view reads at most this many of its policies (by id).
BOUNDARY_POLICIES_LISTED = 500
