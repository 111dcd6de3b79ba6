"""One cluster's live facts, as this replica knows them: `ClusterState`, which only the state's
feeders change (`convergerd.status.state.StatusState`), and `ClusterFacts`, the read-only face
of it that every reader gets (`StatusReader.clusters`): mypy refuses a reader that assigns a
field or changes a record. Pure: time is passed in.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from convergerd.core.model import ClusterId, PolicyId
from convergerd.core.report import PhaseReading
from convergerd.status.admissions import NO_ADMISSIONS, AdmissionTally, admission_tally
from convergerd.status.phases import (
    NO_AUDITS,
    AuditTally,
    PhaseTally,
    TallyCounts,
    TallyGroup,
    TallyKey,
    age_s,
    audit_tally,
    tally,
    tally_counts,
)
from convergerd.status.records import PolicyRecord, PolicyRecords, RecordRow


class ClusterFacts(Protocol):
    """What a reader may see of a cluster (`ClusterState`, read-only)."""

    @property
    def id(self) -> ClusterId: ...
    @property
    def known_since(self) -> dt.datetime: ...
    @property
    def reachable(self) -> bool | None: ...
    @property
    def checked_at(self) -> dt.datetime | None: ...
    @property
    def last_error(self) -> str | None: ...
    @property
    def last_reason(self) -> str | None: ...
    @property
    def last_attempt_at(self) -> dt.datetime | None: ...
    @property
    def last_success_at(self) -> dt.datetime | None: ...
    @property
    def desired(self) -> int: ...
    @property
    def in_sync(self) -> int: ...
    @property
    def failed(self) -> int: ...
    @property
    def server_version(self) -> str | None: ...
    @property
    def duration_s(self) -> float | None: ...
    @property
    def policies(self) -> Mapping[PolicyId, PolicyRecord]:
        """Per policy its record, built anew on each read (changing one changes nothing)."""
    @property
    def audit_tally(self) -> AuditTally: ...
    @property
    def admission_tally(self) -> AdmissionTally: ...
    @property
    def caught_up(self) -> bool: ...
    @property
    def error(self) -> str | None: ...
    @property
    def failing(self) -> bool: ...
    def lag_s(self, now: dt.datetime) -> float: ...
    def since_round_s(self, now: dt.datetime) -> float: ...
    def readings(self) -> list[PhaseReading]: ...
    def record_rows(self, policies: Iterable[PolicyId]) -> list[RecordRow | None]:
        """`PolicyRecords.record_rows`: each of `policies`' record as its row, None where
        none."""
    def counts(self, now: float, interval_s: float, verified_stale_s: float) -> TallyCounts: ...
    def record_values(self, policy: PolicyId,
                      positions: Sequence[int]) -> tuple[Any, ...] | None:
        """The fields at `positions` (in `core.facts.RECORD_ROW`) of `policy`'s record (None:
        no record), without building it."""


@dataclass(slots=True)
class ClusterState:
    id: ClusterId
    known_since: dt.datetime
    reachable: bool | None = None  # None: never attempted
    checked_at: dt.datetime | None = None  # last attempt to reach it (round or probe)
    probe_error: str | None = None  # why the last reachability check failed
    last_error: str | None = None  # the last round's cluster-level reason
    last_reason: str | None = None
    last_attempt_at: dt.datetime | None = None  # last round that worked on it
    last_success_at: dt.datetime | None = None  # last round in which it fully converged
    desired: int = 0
    in_sync: int = 0
    failed: int = 0
    server_version: str | None = None
    duration_s: float | None = None
    # Filled in by `__post_init__` (it needs `id`): the per-policy records, compactly.
    policies: PolicyRecords = field(init=False)
    own_round_at: dt.datetime | None = None  # when this replica's own round last worked on it
    stored_attempt_at: dt.datetime | None = None  # the database's last attempt, as last read
    rows_read_for: dt.datetime | None = None  # the database attempt whose rows were absorbed
    # The readings as status and the metrics count them, recounted whenever they change
    # (`recount_phases`): a scrape then costs a few additions per cluster, not per policy.
    # Replaced whole, never changed in place (`counts` keeps its answer for the same tally).
    phase_tally: dict[TallyKey, TallyGroup] = field(default_factory=dict)
    audit_tally: AuditTally = NO_AUDITS  # likewise, the audits (`phases.audit_tally`)
    admission_tally: AdmissionTally = NO_ADMISSIONS  # and modes and admission counts
    # `counts`' last answer, kept while it holds: (the tally counted, the counts).
    _counted: tuple[PhaseTally, TallyCounts] | None = None

    @property
    def caught_up(self) -> bool:
        """The last round that worked on it left it in sync."""
        return (self.last_attempt_at is not None and self.last_error is None
                and self.in_sync == self.desired)

    def __post_init__(self) -> None:
        self.policies = PolicyRecords(self.id)

    def needs_rows(self) -> bool:
        """Whether the database holds per-policy records newer than this replica has: a round
        by another replica (this one is a standby) that was not read yet."""
        stored = self.stored_attempt_at
        return stored is not None and not (
            (self.own_round_at is not None and self.own_round_at >= stored)
            or (self.rows_read_for is not None and self.rows_read_for >= stored)
        )

    @property
    def error(self) -> str | None:
        """The readable reason shown in status: unreached now beats an older round error."""
        if self.reachable is False and self.probe_error:
            return self.probe_error
        return self.last_error

    @property
    def failing(self) -> bool:
        return self.error is not None or self.failed > 0

    def lag_s(self, now: dt.datetime) -> float:
        """Seconds since it last fully converged; before any success, since it became known."""
        return age_s(self.last_success_at or self.known_since, now)

    def since_round_s(self, now: dt.datetime) -> float:
        """Seconds since a round last finished on it (by any replica, as recorded), or since
        it joined the fleet when none has."""
        return age_s(self.last_attempt_at or self.known_since, now)

    def readings(self) -> list[PhaseReading]:
        return self.policies.readings()

    def record_rows(self, policies: Iterable[PolicyId]) -> list[RecordRow | None]:
        return self.policies.record_rows(policies)

    def record_values(self, policy: PolicyId,
                      positions: Sequence[int]) -> tuple[Any, ...] | None:
        return self.policies.fields_of(policy, positions)

    def counts(self, now: float, interval_s: float, verified_stale_s: float) -> TallyCounts:
        """The readings' counts at `now` (`phases.tally_counts`), counted again only when the
        tally changed or a count did (a reading turned stale, a probe aged): status and every
        scrape ask for each cluster's."""
        kept = self._counted
        if (kept is not None and kept[0] is self.phase_tally
                and kept[1].hold_at(now, interval_s, verified_stale_s)):
            return kept[1]
        counted = tally_counts(self.phase_tally, now, interval_s,
                               verified_stale_s=verified_stale_s)
        self._counted = (self.phase_tally, counted)  # the tally held: `is` stays true to it
        return counted

    def recount_phases(self) -> None:
        """Told after the readings changed."""
        readings = self.readings()
        self.phase_tally = tally(readings)
        self.audit_tally = audit_tally(readings)
        self.admission_tally = admission_tally(readings)
