"""What admission did with each policy, as the operators report it beside the phase (the mode
of the binding in force, `status.enforcementAction`; the API server's counts,
`status.admission`; the audit's excepted objects, `status.audit.excepted`), counted per
cluster when its readings change (`AdmissionTally`) and summed per policy over the fleet
(`PolicyAdmissions`, kept up to date from the clusters' tallies as they change), so a scrape or
the `/status` head costs a few operations per policy, never per policy and cluster. Pure.

- **A mode** is counted under its name (`ENFORCEMENT_ACTIONS`), any other value under `other`;
  a reading without one (no binding: `Inert`, or an operator from before modes) is not counted.
- **Counts** are those the reading can say (`known_admissions`: read, and readable); they are
  since each cluster's installed revision (`admission_revision`), so a fleet sum is what the
  policy's revisions in force have counted, and over the last hour of each cluster's last read.
- **Excepted** is counted where an audit says it (only while exceptions are in force).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple, TypeVar, cast

from convergerd.core.model import PolicyId
from convergerd.core.report import PhaseReading

ENFORCEMENT_ACTIONS: Final = ("Deny", "Warn", "Audit")
OTHER_ENFORCEMENT: Final = "other"  # a mode this version does not know
ENFORCEMENT_LABELS: Final = (*ENFORCEMENT_ACTIONS, OTHER_ENFORCEMENT)
# The API server's `enforcement_action` label values, in the order of the figures.
ACTIONS: Final = ("deny", "warn", "audit")

# A reading's figures: its six counts (denied, warned, audited since its revision; the same
# over the last hour), and the audit's excepted objects (None: not said).
Counts = tuple[int, int, int, int, int, int]
Figures = tuple[Counts, int | None]
_NO_COUNTS: Counts = (0, 0, 0, 0, 0, 0)
_ZERO: Figures = (_NO_COUNTS, None)

T = TypeVar("T")


def enforcement_label(mode: str | None) -> str | None:
    """How a mode is counted (None: not counted, no binding)."""
    if mode is None:
        return None
    return mode if mode in ENFORCEMENT_ACTIONS else OTHER_ENFORCEMENT


def admission_read(reading: PhaseReading) -> bool:
    """Whether the reading carries `status.admission` (readable or not)."""
    return reading.admission_read_at is not None or reading.admission_problem is not None


def known_admissions(reading: PhaseReading) -> Counts | None:
    """The reading's six counts (since its revision, then the last hour's), None when none
    were read or they could not be."""
    d, w, a = reading.admission_denied, reading.admission_warned, reading.admission_audited
    hd, hw, ha = (reading.admission_last_hour_denied, reading.admission_last_hour_warned,
                  reading.admission_last_hour_audited)
    if (reading.admission_problem is not None or d is None or w is None or a is None
            or hd is None or hw is None or ha is None):
        return None
    return d, w, a, hd, hw, ha


def figures_of(reading: PhaseReading) -> Figures:
    """The reading's figures (unknown counts as 0: a sum counts what can be known)."""
    return known_admissions(reading) or _NO_COUNTS, reading.audit_excepted


@dataclass(frozen=True, slots=True)
class AdmissionTally:
    """One cluster's readings as admission counts them, counted when they change (replaced
    whole, never changed in place). Times in seconds since the epoch."""

    # The policies per mode of their binding in force (`enforcement_label`), in reading order.
    modes: Mapping[str, tuple[PolicyId, ...]] = field(default_factory=dict)
    # The policies with a count above 0 or an excepted count said, with their figures.
    figures: Mapping[PolicyId, Figures] = field(default_factory=dict)
    read: int = 0  # policies read with `status.admission`
    unknown: int = 0  # of which unreadable
    totals: Figures = _ZERO  # the figures summed over the policies
    # Its views as made by `shown`, by the function that made them.
    _shown: dict[Callable[..., Any], Any] = field(default_factory=dict, init=False, repr=False,
                                                  compare=False)

    def mode_counts(self) -> dict[str, int]:
        """Policies per mode in force (those with one)."""
        return {mode: len(policies) for mode, policies in self.modes.items() if policies}

    def shown(self, view: Callable[[AdmissionTally], T]) -> T:
        """`view(self)`, made on the first asking and kept: the tally never changes, and a
        cluster keeps its tally while its readings' figures do not change (most rounds), so
        `/status` builds a cluster's admission views once, not once per build. Shared by all
        who ask: never to be changed."""
        shown = self._shown
        if view not in shown:
            shown[view] = view(self)
        return cast(T, shown[view])


NO_ADMISSIONS = AdmissionTally()


def admission_tally(readings: Iterable[PhaseReading]) -> AdmissionTally:
    """`admission_tally_grouped` of readings each its own group."""
    return admission_tally_grouped((r, (r.policy,)) for r in readings)


def admission_tally_grouped(
    groups: Iterable[tuple[PhaseReading, Sequence[PolicyId]]],
) -> AdmissionTally:
    """The admission figures of readings given in groups: per group a reading standing for all
    of them and each one's policy (they agree on all else but their revision and own times,
    which the tally does not read)."""
    modes: dict[str, list[PolicyId]] = {}
    figures: dict[PolicyId, Figures] = {}
    read = unknown = 0
    sums = [0] * 7
    said = False
    for r, policies in groups:
        if not policies:
            continue
        n = len(policies)
        label = enforcement_label(r.enforcement_action)
        if label is not None:
            modes.setdefault(label, []).extend(policies)
        if admission_read(r):
            read += n
            unknown += n if known_admissions(r) is None else 0
        found = figures_of(r)
        if found == _ZERO:
            continue
        figures.update(dict.fromkeys(policies, found))
        counts, excepted = found
        for i, count in enumerate(counts):
            sums[i] += count * n
        if excepted is not None:
            said = True
            sums[6] += excepted * n
    if not modes and not figures and not read:
        return NO_ADMISSIONS
    totals: Figures = ((sums[0], sums[1], sums[2], sums[3], sums[4], sums[5]),
                       sums[6] if said else None)
    return AdmissionTally({m: tuple(ps) for m, ps in modes.items()}, figures, read, unknown,
                          totals)


class PolicyTotals(NamedTuple):
    """One policy's figures summed over the fleet's clusters (each since its installed
    revision), the clusters per mode in force, and the excepted objects where said."""

    denied: int
    warned: int
    audited: int
    last_hour_denied: int
    last_hour_warned: int
    last_hour_audited: int
    excepted: int | None  # None: no cluster says
    clusters_by_enforcement: Mapping[str, int]  # every one of `ENFORCEMENT_LABELS`


# A policy's running sums: the six counts, excepted, clusters saying excepted, then clusters
# per mode (`ENFORCEMENT_LABELS`).
_EXCEPTED, _SAYING, _MODES = 6, 7, 8
_WIDTH = _MODES + len(ENFORCEMENT_LABELS)
_MODE_AT = {label: _MODES + i for i, label in enumerate(ENFORCEMENT_LABELS)}


class PolicyAdmissions(Mapping[PolicyId, PolicyTotals]):
    """The fleet's totals per policy, kept up to date as each cluster's tally is replaced
    (`change`): a cluster whose tally is unchanged costs one comparison; a policy no cluster
    counts any more is dropped. Read as a mapping, each value made on reading."""

    __slots__ = ("_sums",)

    def __init__(self) -> None:
        self._sums: dict[PolicyId, list[int]] = {}

    def __getitem__(self, policy: PolicyId) -> PolicyTotals:
        s = self._sums[policy]
        return PolicyTotals(s[0], s[1], s[2], s[3], s[4], s[5],
                            s[_EXCEPTED] if s[_SAYING] else None,
                            dict(zip(ENFORCEMENT_LABELS, s[_MODES:], strict=True)))

    def __iter__(self) -> Iterator[PolicyId]:
        return iter(self._sums)

    def __len__(self) -> int:
        return len(self._sums)

    def change(self, old: AdmissionTally, new: AdmissionTally) -> None:
        """A cluster's tally `old` replaced by `new`."""
        if old is new:
            return
        touched: set[PolicyId] = set()
        if old.modes != new.modes:
            touched.update(self._count_modes(old, -1), self._count_modes(new, 1))
        if old.figures != new.figures:
            touched.update(self._add_figures(old, -1), self._add_figures(new, 1))
        for policy in touched:
            if not any(self._sums[policy]):
                del self._sums[policy]

    def _count_modes(self, tally: AdmissionTally, sign: int) -> Iterator[PolicyId]:
        for mode, policies in tally.modes.items():
            at = _MODE_AT[mode]
            for policy in policies:
                self._row(policy)[at] += sign
            yield from policies

    def _add_figures(self, tally: AdmissionTally, sign: int) -> Iterator[PolicyId]:
        for policy, (counts, excepted) in tally.figures.items():
            row = self._row(policy)
            for i, count in enumerate(counts):
                row[i] += sign * count
            if excepted is not None:
                row[_EXCEPTED] += sign * excepted
                row[_SAYING] += sign
            yield policy

    def _row(self, policy: PolicyId) -> list[int]:
        row = self._sums.get(policy)
        if row is None:
            row = self._sums[policy] = [0] * _WIDTH
        return row

