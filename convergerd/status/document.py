"""The `/status` document, built from the state's read-only face (`StatusReader`): the head
(`snapshot_head`: identity, leader, round, invalid policies, pending deletions, shards, the
Unsupported roll-up, the fleet's audits, the live rollouts), one summary per cluster
(`cluster_summary`), worst first (`sorted_clusters`), and the whole of it (`snapshot`;
`convergerd.api.server` builds the same document in slices, and past
`Settings.status_max_clusters` a summary of it). Also what
the per-cluster and per-policy views take from the state (`merged_policies`,
`audit_sample_view`). Pure: the state and `now` in, plain JSON out.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Collection, Iterable
from typing import Any

from convergerd.core.model import ClusterId, PolicyId
from convergerd.core.rows import DeliveryRow
from convergerd.core.shards import orphaned
from convergerd.status.admissions import AdmissionTally, PolicyTotals
from convergerd.status.cluster import ClusterFacts
from convergerd.status.listing import FleetTally, listing, worst_first_key
from convergerd.status.phases import (
    AuditTally,
    age_s,
    audit_stale_after_s,
    known_violations,
    stale_after_s,
    verified_stale_after_s,
)
from convergerd.status.reader import StatusReader
from convergerd.status.records import PolicyRecord, merge_records
from convergerd.status.shards import last_rounds, orphans
from convergerd.status.views import (
    AUDIT_POLICIES_LISTED,
    iso,
    unsupported_of,
    unsupported_rollup,
)


def snapshot(state: StatusReader, now: dt.datetime | None = None) -> dict[str, Any]:
    """The `/status` document listing every cluster: `snapshot_head`, the fleet's counts and
    the clusters' summaries, worst first."""
    now = now or state.clock()
    clusters = [cluster_summary(state, c, now) for c in sorted_clusters(state, now)]
    tally = FleetTally(stale_after_s(state.interval_s))
    tally.add(clusters)
    return {**snapshot_head(state, now, unsupported_of(clusters)), "fleet": tally.counts,
            "listing": listing(order="worst_first", listed=len(clusters), complete=True,
                               following=None),
            "clusters": clusters}


def snapshot_head(state: StatusReader, now: dt.datetime,
                  unsupported: Iterable[tuple[str, str | None]]) -> dict[str, Any]:
    """The `/status` document but its clusters; `unsupported`: the Unsupported clusters and
    their versions (`unsupported_of` the summaries)."""
    leader = state.leader()
    return {
        "identity": state.identity,
        "now": iso(now),
        "leader": {"is_leader": leader.is_leader, "holder": leader.holder,
                   "since": iso(leader.since)},
        "interval_seconds": state.interval_s,
        "stale_after_seconds": stale_after_s(state.interval_s),
        "verified_stale_after_seconds": verified_stale_after_s(state.probe_period_s),
        "last_round": round_view(state),
        "next_round_at": iso(state.next_round_at),
        "invalid_policies": [{"id": k, "reason": v} for k, v in sorted(state.invalid.items())],
        "pending_deletions": pending_view(state, now),
        "shards": shards_view(state, now),
        "unsupported_by_version": unsupported_rollup(unsupported),
        "audit": audit_fleet_view(state, now),
        "admission": admission_fleet_view(state),
        "rollouts": rollouts_view(state),
    }


def rollouts_view(state: StatusReader,
                  only: Collection[int] | None = None) -> list[dict[str, Any]]:
    """Each live rollout (with `only`, those of these ids: a boundary's): its wave and state,
    the gate that holds it, and how many clusters report its new revision and how many
    another (as of the last database sync)."""
    return [{
        "policy": r.policy, "id": r.id, "to_revision": r.to_revision,
        "from_revision": r.from_revision, "strategy": r.strategy, "state": r.state.value,
        "wave": {"index": r.wave, "name": r.wave_name, "of": r.waves, "warn_step": r.warn_step},
        "gate": r.gate.value if r.gate is not None else None, "reason": r.reason,
        "since": iso(r.since),
        "clusters": {"new": r.clusters_new, "old": r.clusters_old},
    } for r in state.rollouts if only is None or r.id in only]


def sorted_clusters(state: StatusReader, now: dt.datetime) -> list[ClusterFacts]:
    """The clusters worst first (`listing.worst_first_key`)."""
    return sorted(
        state.clusters.values(),
        key=lambda c: worst_first_key(cluster=c.id, reachable=c.reachable,
                                      failing=c.failing, lag_s=c.lag_s(now)),
    )


def cluster_summary(state: StatusReader, cluster: ClusterFacts,
                    now: dt.datetime) -> dict[str, Any]:
    """The cluster as `/status` lists it. Its phase and verification counts are its readings'
    tally (`ClusterState.phase_tally`, what the metrics count too), so a summary costs a few
    numbers, not one per policy."""
    counted = cluster.counts(now.timestamp(), state.interval_s,
                             verified_stale_after_s(state.probe_period_s))
    shards = state.shards
    return {
        "id": cluster.id,
        "reachable": cluster.reachable,
        "checked_at": iso(cluster.checked_at),
        "lag_seconds": round(cluster.lag_s(now), 3),
        "last_success_at": iso(cluster.last_success_at),
        "last_attempt_at": iso(cluster.last_attempt_at),
        "desired": cluster.desired,
        "in_sync": cluster.in_sync,
        "failed": cluster.failed,
        # Shared with the next summaries while the counts hold: never changed.
        "phases": counted.shown,
        "verification": counted.verification,
        "last_error": cluster.error,
        "last_reason": (cluster.last_reason if cluster.error == cluster.last_error
                        else "unreachable"),
        "server_version": cluster.server_version,
        "audit": cluster_audit_view(state, cluster, now),
        # The modes in force beside the phases, and admission's counts, over its policies:
        # made once per tally (`AdmissionTally.shown`), shared, never changed.
        "enforcement": (admitted := cluster.admission_tally).shown(AdmissionTally.mode_counts),
        "admission": admitted.shown(cluster_admission_view),
        "shard": (k := shards.of(cluster.id)),
        "holder": shards.holders[k] or None,
        "orphaned": orphaned(cluster.since_round_s(now), state.interval_s),
    }


def _audit_unsettled(state: StatusReader, tally: AuditTally, now: dt.datetime) -> bool:
    return tally.unsettled(now.timestamp(), state.interval_s,
                           audit_stale_after_s(state.probe_period_s))


def cluster_audit_view(state: StatusReader, cluster: ClusterFacts,
                       now: dt.datetime) -> dict[str, Any] | None:
    """A cluster's audits summed over its policies (None: none read there)."""
    tally = cluster.audit_tally
    if not tally.audited:
        return None
    return {"violations": tally.violations, "policies_with_violations": len(tally.by_policy),
            "policies_audited": tally.audited, "unknown": tally.unknown,
            "unsynced": _audit_unsettled(state, tally, now)}


def audit_fleet_view(state: StatusReader, now: dt.datetime) -> dict[str, Any]:
    """The audits over the fleet, and per policy its total (worst first, at most
    `AUDIT_POLICIES_LISTED` listed): cost grows with the violating (cluster, policy) pairs, not
    with the fleet's policies."""
    totals: dict[PolicyId, list[int]] = {}
    audited = violations = with_violations = unsynced = 0
    for cluster in state.clusters.values():
        tally = cluster.audit_tally
        if not tally.audited:
            continue
        audited += 1
        violations += tally.violations
        with_violations += tally.violations > 0
        unsynced += _audit_unsettled(state, tally, now)
        for pid, count in tally.by_policy.items():
            entry = totals.setdefault(pid, [0, 0])
            entry[0] += count
            entry[1] += 1
    worst = sorted(totals.items(), key=lambda kv: (-kv[1][0], kv[0]))
    return {"violations": violations, "clusters_audited": audited,
            "clusters_with_violations": with_violations, "unsynced_clusters": unsynced,
            "policies_with_violations": len(worst),
            "policies": [{"id": pid, "violations": v, "clusters": n}
                         for pid, (v, n) in worst[:AUDIT_POLICIES_LISTED]]}


def cluster_admission_view(tally: AdmissionTally) -> dict[str, Any] | None:
    """A cluster's admission counts summed over its policies (None: none read there)."""
    if not tally.read:
        return None
    (d, w, a, hd, hw, ha), excepted = tally.totals
    return {"denied": d, "warned": w, "audited": a,
            "last_hour": {"denied": hd, "warned": hw, "audited": ha},
            "policies_counted": tally.read - tally.unknown, "unknown": tally.unknown,
            "excepted": excepted}


def admission_fleet_view(state: StatusReader) -> dict[str, Any]:
    """Admission over the fleet, and per policy its totals (those admission counted or that
    are in force in a mode other than Deny somewhere; the most denied, warned and audited
    first, at most `AUDIT_POLICIES_LISTED`): cost grows with the policies, not the clusters
    (`StatusReader.admission_totals`)."""
    # Read once: each value is made on reading (`PolicyAdmissions`).
    totals = list(state.admission_totals.items())
    listed = [(pid, t) for pid, t in totals
              if t.denied or t.warned or t.audited or t.last_hour_denied
              or t.last_hour_warned or t.last_hour_audited or t.excepted
              or any(n for mode, n in t.clusters_by_enforcement.items() if mode != "Deny")]
    listed.sort(key=lambda kv: (-kv[1].denied, -kv[1].warned, -kv[1].audited, kv[0]))
    sums = [sum(getattr(t, f) for _, t in totals) for f in _FIGURES]
    return {"denied": sums[0], "warned": sums[1], "audited": sums[2],
            "last_hour": {"denied": sums[3], "warned": sums[4], "audited": sums[5]},
            "policies_total": len(listed),
            "policies": [_policy_totals_view(pid, t) for pid, t in
                         listed[:AUDIT_POLICIES_LISTED]]}


_FIGURES = ("denied", "warned", "audited", "last_hour_denied", "last_hour_warned",
            "last_hour_audited")


def _policy_totals_view(policy: PolicyId, t: PolicyTotals) -> dict[str, Any]:
    return {"id": policy, "denied": t.denied, "warned": t.warned, "audited": t.audited,
            "last_hour": {"denied": t.last_hour_denied, "warned": t.last_hour_warned,
                          "audited": t.last_hour_audited},
            "clusters_by_enforcement": dict(t.clusters_by_enforcement),
            "excepted": t.excepted}


def audit_sample_view(state: StatusReader, policy: str) -> list[dict[str, Any]]:
    """The policy's kept samples, of clusters whose current reading still counts
    violations."""
    pid = PolicyId(policy)
    shown_samples = []
    for cluster, sample in state.samples_of(pid):
        live = state.clusters.get(cluster)
        record = live.policies.get(pid) if live is not None else None
        if record is None or record.phase is None or not known_violations(record.phase):
            continue
        shown_samples.append({"cluster": cluster, "kind": sample.kind,
                              "namespace": sample.namespace, "name": sample.name,
                              "message": sample.message})
    return shown_samples


def pending_view(state: StatusReader, now: dt.datetime) -> dict[str, Any]:
    pending = state.pending
    return {
        "count": pending.total,
        "oldest_first": [
            {"id": p.policy, "requested_at": iso(p.requested_at),
             "pending_seconds": round(age_s(p.requested_at, now), 3),
             "clusters_holding": p.holders, "held_by": list(p.held_by)}
            for p in pending.oldest_first],
    }


def round_view(state: StatusReader) -> dict[str, Any] | None:
    r = state.last_round
    if r is None:
        return None
    return {"started_at": iso(r.started_at), "finished_at": iso(r.finished_at),
            "result": r.result, "counts": dict(r.counts), "leader": r.leader, "error": r.error}


def shards_view(state: StatusReader, now: dt.datetime) -> dict[str, Any]:
    shards = state.shards
    last = last_rounds(state.clusters.values(), shards)
    sizes = Counter(shards.of(c) for c in state.clusters)
    orphaned_by_shard = Counter(shards.of(c)
                                for c in orphans(state.clusters.values(), now, state.interval_s))
    return {
        "count": shards.count,
        "held_here": sorted(shards.held),
        "members": list(shards.members),
        "share": shards.share,
        "orphan_clusters": sum(orphaned_by_shard.values()),
        "shards": [
            {"shard": k, "holder": shards.holders[k] or None, "clusters": sizes.get(k, 0),
             "orphan_clusters": orphaned_by_shard.get(k, 0), "last_round_at": iso(last.get(k))}
            for k in range(shards.count)],
    }


def merged_policies(
    state: StatusReader, cluster: str, rows: Iterable[DeliveryRow] = ()
) -> dict[PolicyId, PolicyRecord]:
    """The cluster's per-policy records merged with `rows` just read from the database (the
    newer fact winning), without changing what this replica keeps."""
    live = state.clusters.get(ClusterId(cluster))
    merged = dict(live.policies) if live is not None else {}
    for row in rows:
        pid = PolicyId(row.policy)
        merged[pid] = merge_records(merged.get(pid), PolicyRecord.from_row(row))
    return merged
