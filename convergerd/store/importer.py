"""`convergerd import FILE`: upsert clusters, boundaries and policies from YAML.

    clusters:   [{id: c0001, labels: {ring: canary}}, {id: c0002}]   # or plain ids: [c0001]
    boundaries: [{id: team-a, clusters: [c0001, c0002]}]
    rolloutStrategies:
      - {id: careful, waves: [{name: canary, selector: {ring: canary}},
                              {name: half, fraction: 0.5}, {name: rest, fraction: 1.0}]}
    policies:
      - {id: p-latest, boundary: team-a, enabled: true, rule: {type: ForbidLatestTag}}
      - {id: p-regs, boundary: team-a, enforcement: Warn,
         rule: {type: AllowedRegistries, registries: [registry.example.com]}}
    exceptions:
      - {policy: p-latest, id: legacy-web, namespace: team-a-web, selector: {matchLabels:
         {app: legacy}}, reason: TICKET-123, requestedBy: dev@team-a, approvedBy: admin,
         expiresAt: 2027-01-31}

A policy's `enforcement` is `Deny` (the default), `Warn` or `Audit` (docs/design.md, "Modes").
A policy's or a boundary's `rolloutStrategy` names a strategy of the file or the database
(`core.rollout.parse_strategy` checks each; docs/design.md, "Rollouts"); a cluster's `labels`
choose its wave. What the file says replaces what was stored: a cluster listed without labels
has none, a policy or boundary without `rolloutStrategy` has none (its saves go everywhere at
once). Strategies are only added or changed, never deleted, by a file.

The file is read with bounds (size, UTF-8, one YAML document, nesting, alias expansion: see
`yamlfile`). Validation is pure (`parse_import`, `check_references`), applies the same rules
as a converge round (`render.validate_policy`), and names the entry and field of every problem;
a file with any problem changes nothing. The database part applies a valid file in one
transaction. A boundary's cluster list replaces its previous one; a policy's revision increases
only when its content (boundary, rule, enabled, enforcement) changes, and new policies start
at 1. An exception (`core.exceptions`: checked as the API checks a grant, its expiry in the
future and within `CONVERGERD_EXCEPTION_MAX_DAYS`) is upserted by (policy, id); a new or
changed one is a new revision of its policy and is recorded as an `import` change by its
approver.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Iterator, Mapping, Sequence, Set
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg

from convergerd.config import IMPORT_MAX_BYTES_DEFAULT, SETTINGS_BY_KEY, default_of
from convergerd.core.errors import BadFile, ConvergerdError
from convergerd.core.exceptions import FIELDS, check_grant, parse_exception
from convergerd.core.model import (
    DEFAULT_ENFORCEMENT,
    Enforcement,
    InvalidPolicy,
    PolicyException,
    PolicyRow,
    RuleError,
    check_boundary_id,
    check_cluster_id,
    check_policy_id,
    field_names,
    parse_enforcement,
    parse_rule,
)
from convergerd.core.render import validate_policy
from convergerd.core.rollout import (
    STRATEGY_FIELDS,
    Strategy,
    StrategyError,
    check_labels,
    check_strategy_id,
    parse_strategy,
)
from convergerd.core.shown import shown
from convergerd.files import read_bounded
from convergerd.store import rollouts
from convergerd.store.errors import database_errors
from convergerd.store.exceptions import upsert as upsert_exception
from convergerd.store.revisions import set_actor
from convergerd.store.schema import check_schema
from convergerd.store.yamlfile import load_yaml

TOP_LEVEL_KEYS = ("clusters", "boundaries", "rolloutStrategies", "policies", "exceptions")
CLUSTER_FIELDS = ("id", "labels")
BOUNDARY_FIELDS = ("id", "clusters", "rolloutStrategy")
POLICY_FIELDS = ("id", "boundary", "enabled", "rule", "enforcement", "rolloutStrategy")
EXCEPTION_MAX_DAYS_DEFAULT: float = default_of("exception_max_days")
# pg_advisory_xact_lock key serialising concurrent imports ("convergerd import").
IMPORT_LOCK_KEY = 0x636F6E76_696D7072
# A file with thousands of bad entries is reported by its first ones and a count.
MAX_PROBLEMS_LISTED = 50
MAX_PROBLEM_CHARS = 300
# Policies are checked as the largest revision the database holds would render them, so a
# file cannot store a policy that a later round finds too large.
_REVISION_BOUND = 2**63 - 1


class ImportFileError(ConvergerdError):
    """The file cannot be imported; `problems` name each entry and field (the first
    `MAX_PROBLEMS_LISTED`), `more` counts those left out."""

    def __init__(self, source: str, problems: Sequence[str], more: int = 0) -> None:
        self.problems = list(problems)
        self.more = more
        if len(self.problems) == 1 and not more:
            super().__init__(f"{source}: rejected, nothing imported: {self.problems[0]}")
            return
        count = len(self.problems) + more
        listed = "".join(f"\n  {p}" for p in self.problems)
        tail = f"\n  ... and {more} more" if more else ""
        super().__init__(
            f"{source}: rejected, nothing imported ({count} problem{'s' * (count != 1)}):"
            f"{listed}{tail}"
        )

    def naming(self, source: str) -> ImportFileError:
        return ImportFileError(source, self.problems, self.more)


@dataclass(frozen=True, slots=True)
class ImportedBoundary:
    id: str
    clusters: tuple[str, ...]
    rollout_strategy: str | None = None


@dataclass(frozen=True, slots=True)
class ImportedPolicy:
    id: str
    boundary: str
    rule: Mapping[str, Any]  # normalised by model.parse_rule
    enabled: bool
    enforcement: Enforcement = DEFAULT_ENFORCEMENT
    rollout_strategy: str | None = None


@dataclass(frozen=True, slots=True)
class ImportPlan:
    clusters: tuple[str, ...] = ()
    boundaries: tuple[ImportedBoundary, ...] = ()
    policies: tuple[ImportedPolicy, ...] = ()
    exceptions: tuple[tuple[str, PolicyException], ...] = ()  # (policy id, exception)
    labels: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # by cluster
    strategies: tuple[Strategy, ...] = ()


@dataclass(slots=True)
class Counts:
    created: int = 0
    updated: int = 0
    unchanged: int = 0

    def __str__(self) -> str:
        return f"{self.created} created, {self.updated} updated, {self.unchanged} unchanged"


@dataclass(slots=True)
class ImportSummary:
    clusters: Counts = field(default_factory=Counts)
    boundaries: Counts = field(default_factory=Counts)
    policies: Counts = field(default_factory=Counts)
    strategies: Counts = field(default_factory=Counts)  # `updated`: written (new or changed)
    exceptions: Counts = field(default_factory=Counts)

    def __str__(self) -> str:
        lines = [f"{kind}: {getattr(self, kind)}" for kind in ("clusters", "boundaries",
                                                              "policies")]
        if self.exceptions.created or self.exceptions.updated or self.exceptions.unchanged:
            lines.append(f"exceptions: {self.exceptions}")
        if self.strategies.updated:
            lines.append(f"rollout strategies: {self.strategies.updated} written")
        return "\n".join(lines)


# ---- pure validation ---------------------------------------------------------------------------


def _renamed(exc: RuleError, field_name: str) -> str:
    """model's id messages start with what the id is ("boundary: ", "cluster id: "); in a
    file the field is `id`."""
    message = str(exc)
    for prefix in ("boundary: ", "cluster id: ", "id: "):
        if message.startswith(prefix):
            return f"{field_name}: {message.removeprefix(prefix)}"
    return message


class _Problems:
    def __init__(self) -> None:
        self.items: list[str] = []
        self.more = 0

    def add(self, where: str, message: str) -> None:
        if len(self.items) < MAX_PROBLEMS_LISTED:
            self.items.append(shown(f"{where}: {message}", MAX_PROBLEM_CHARS, style="text"))
        else:
            self.more += 1

    def raise_any(self) -> None:
        if self.items:
            raise ImportFileError("file", self.items, self.more)


def _entries(data: Mapping[str, Any], key: str, problems: _Problems) -> list[tuple[str, Any]]:
    value = data.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        problems.add(key, f"must be a list, got {type(value).__name__}")
        return []
    return [(f"{key}[{i}]", entry) for i, entry in enumerate(value)]


def _entry_id(
    where: str, entry: Any, fields: Sequence[str], problems: _Problems
) -> tuple[str, str | None]:
    """The entry's label for messages (`policies[1] (id 'p-regs')`) and its id if it has a
    string one; reports a non-mapping entry and unknown fields."""
    if not isinstance(entry, Mapping):
        problems.add(where, f"must be a mapping with {', '.join(fields)}, got {shown(entry)}")
        return where, None
    raw_id = entry.get("id")
    label = f"{where} (id {shown(raw_id, 60)})" if raw_id is not None else where
    unknown = [k for k in entry if k not in fields]
    if unknown:
        problems.add(label, f"unknown field(s) {field_names(unknown)}; known: {', '.join(fields)}")
    if raw_id is None:
        problems.add(label, "id: required")
        return label, None
    if not isinstance(raw_id, str):
        problems.add(label, f"id: must be a string, got {shown(raw_id)}")
        return label, None
    return label, raw_id


def _check_duplicate(label: str, kind: str, ident: str, seen: set[str], p: _Problems) -> bool:
    if ident in seen:
        p.add(label, f"id: duplicate {kind} id {shown(ident)}")
        return False
    seen.add(ident)
    return True


def _entries_with_valid_id(
    data: Mapping[str, Any], key: str, fields: Sequence[str], check: Callable[[str], None],
    problems: _Problems,
) -> Iterator[tuple[str, str, Mapping[str, Any]]]:
    """The entries of `data[key]` whose id passes `check`, as (label, id, entry); reports the
    others. Lazily, so problems stay in file order."""
    for where, entry in _entries(data, key, problems):
        label, ident = _entry_id(where, entry, fields, problems)
        if ident is None:
            continue
        try:
            check(ident)
        except RuleError as exc:
            problems.add(label, _renamed(exc, "id"))
            continue
        yield label, ident, entry


def _parse_clusters(data: Mapping[str, Any], problems: _Problems,
                    labels: dict[str, Mapping[str, str]]) -> list[str]:
    """The clusters' ids; their labels into `labels`. An entry may be a plain id."""
    if isinstance(data.get("clusters"), list):
        data = {**data, "clusters": [{"id": e} if isinstance(e, str) else e
                                     for e in data["clusters"]]}
    clusters: list[str] = []
    seen: set[str] = set()
    for label, ident, entry in _entries_with_valid_id(
        data, "clusters", CLUSTER_FIELDS, check_cluster_id, problems
    ):
        try:
            labels[ident] = check_labels(entry.get("labels", {}), "labels")
        except StrategyError as exc:
            problems.add(label, str(exc))
        if _check_duplicate(label, "cluster", ident, seen, problems):
            clusters.append(ident)
    return clusters


def _strategy_name(label: str, entry: Mapping[str, Any], p: _Problems) -> str | None:
    """An entry's `rolloutStrategy` (None: none); a bad one reported."""
    value = entry.get("rolloutStrategy")
    if value is None:
        return None
    try:
        return check_strategy_id(value, "rolloutStrategy")
    except StrategyError as exc:
        p.add(label, str(exc))
        return None


def _parse_strategies(data: Mapping[str, Any], problems: _Problems) -> list[Strategy]:
    strategies: list[Strategy] = []
    seen: set[str] = set()
    for where, entry in _entries(data, "rolloutStrategies", problems):
        label, ident = _entry_id(where, entry, STRATEGY_FIELDS, problems)
        if ident is None:
            continue
        try:
            strategy = parse_strategy(entry)
        except StrategyError as exc:
            problems.add(label, str(exc).removeprefix("strategy: "))
            continue
        if _check_duplicate(label, "strategy", ident, seen, problems):
            strategies.append(strategy)
    return strategies


def _parse_member_list(label: str, raw: Any, problems: _Problems) -> tuple[str, ...] | None:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        problems.add(label, f"clusters: must be a list of cluster ids, got {shown(raw)}")
        return None
    members: dict[str, None] = {}  # in file order; a list's `in` made 80,000 ids quadratic
    ok = True
    for i, cluster in enumerate(raw):
        try:
            check_cluster_id(cluster)
        except RuleError as exc:
            problems.add(label, _renamed(exc, f"clusters[{i}]"))
            ok = False
            continue
        if cluster in members:
            problems.add(label, f"clusters[{i}]: duplicate cluster {shown(cluster)}")
            ok = False
            continue
        members[cluster] = None
    return tuple(members) if ok else None


def _parse_boundaries(data: Mapping[str, Any], problems: _Problems) -> list[ImportedBoundary]:
    boundaries: list[ImportedBoundary] = []
    seen: set[str] = set()
    for label, ident, entry in _entries_with_valid_id(
        data, "boundaries", BOUNDARY_FIELDS, check_boundary_id, problems
    ):
        members = _parse_member_list(label, entry.get("clusters"), problems)
        strategy = _strategy_name(label, entry, problems)
        if _check_duplicate(label, "boundary", ident, seen, problems) and members is not None:
            boundaries.append(ImportedBoundary(ident, members, strategy))
    return boundaries


def _parse_policy(label: str, ident: str, entry: Mapping[str, Any], p: _Problems) -> (
    ImportedPolicy | None
):
    ok = True
    try:
        check_policy_id(ident)
    except RuleError as exc:
        p.add(label, _renamed(exc, "id"))
        ok = False
    boundary = entry.get("boundary")
    if boundary is None:
        p.add(label, "boundary: required")
        ok = False
    else:
        try:
            check_boundary_id(boundary)
        except RuleError as exc:
            p.add(label, _renamed(exc, "boundary"))
            ok = False
    enabled = entry.get("enabled", True)
    if not isinstance(enabled, bool):
        p.add(label, f"enabled: must be true or false, got {shown(enabled)}")
        ok = False
    enforcement = DEFAULT_ENFORCEMENT
    try:
        enforcement = parse_enforcement(entry.get("enforcement", DEFAULT_ENFORCEMENT.value))
    except RuleError as exc:
        p.add(label, str(exc))
        ok = False
    strategy = _strategy_name(label, entry, p)
    if "rolloutStrategy" in entry and strategy is None:
        ok = False
    if "rule" not in entry:
        p.add(label, "rule: required")
        return None
    try:
        parse_rule(entry["rule"])
    except RuleError as exc:
        p.add(label, str(exc))
        return None
    if not ok or not isinstance(boundary, str):
        return None
    # The round's own check, for what only the whole policy shows (the rendered size).
    result = validate_policy(PolicyRow(ident, boundary, entry["rule"], enabled, _REVISION_BOUND,
                                       enforcement.value))
    if isinstance(result, InvalidPolicy):
        p.add(label, result.reason)
        return None
    return ImportedPolicy(ident, boundary, result.rule.as_dict(), enabled, enforcement, strategy)


def _parse_exceptions(data: Mapping[str, Any], problems: _Problems, *, now: dt.datetime,
                      max_days: float) -> list[tuple[str, PolicyException]]:
    found: list[tuple[str, PolicyException]] = []
    seen: set[tuple[str, str]] = set()
    for where, entry in _entries(data, "exceptions", problems):
        if not isinstance(entry, Mapping):
            problems.add(where, f"must be a mapping with policy, {', '.join(FIELDS)}, got "
                         f"{shown(entry)}")
            continue
        label = f"{where} (id {shown(entry.get('id'), 60)})"
        policy = entry.get("policy")
        if not isinstance(policy, str):
            problems.add(label, f"policy: required, a policy id (got {shown(policy)})")
            continue
        try:
            check_policy_id(policy)
        except RuleError as exc:
            problems.add(label, _renamed(exc, "policy"))
            continue
        try:
            exception = parse_exception({k: v for k, v in entry.items() if k != "policy"},
                                        "exception")
            check_grant(exception, now=now, max_days=max_days, where="expiresAt")
        except RuleError as exc:
            problems.add(label, str(exc).removeprefix("exception."))
            continue
        if (policy, exception.id) in seen:
            problems.add(label, f"id: duplicate exception {shown(exception.id)} of policy "
                         f"{shown(policy)}")
            continue
        seen.add((policy, exception.id))
        found.append((policy, exception))
    return found


def parse_import(data: Any, *, now: dt.datetime | None = None,
                 exception_max_days: float = EXCEPTION_MAX_DAYS_DEFAULT) -> ImportPlan:
    """Validate a loaded YAML document into an `ImportPlan`; `ImportFileError` lists every
    problem, each naming the entry and field. Exceptions' expiries are checked against `now`
    (the current time when None) and `exception_max_days`."""
    problems = _Problems()
    if not isinstance(data, Mapping):
        shown = "an empty file" if data is None else type(data).__name__
        raise ImportFileError("file", [
            f"file: must be a mapping with {', '.join(TOP_LEVEL_KEYS)}, got {shown}"
        ])
    unknown = [k for k in data if k not in TOP_LEVEL_KEYS]
    if unknown:
        problems.add(
            "file", f"unknown key(s) {field_names(unknown)}; known: {', '.join(TOP_LEVEL_KEYS)}"
        )
    labels: dict[str, Mapping[str, str]] = {}
    clusters = _parse_clusters(data, problems, labels)
    boundaries = _parse_boundaries(data, problems)
    strategies = _parse_strategies(data, problems)
    policies: list[ImportedPolicy] = []
    seen: set[str] = set()
    for where, entry in _entries(data, "policies", problems):
        label, ident = _entry_id(where, entry, POLICY_FIELDS, problems)
        if ident is None:
            continue
        policy = _parse_policy(label, ident, entry, problems)
        if _check_duplicate(label, "policy", ident, seen, problems) and policy is not None:
            policies.append(policy)
    exceptions = _parse_exceptions(data, problems, now=now or dt.datetime.now(dt.UTC),
                                   max_days=exception_max_days)
    problems.raise_any()
    return ImportPlan(tuple(clusters), tuple(boundaries), tuple(policies), tuple(exceptions),
                      labels, tuple(strategies))


def check_references(
    plan: ImportPlan, *, known_clusters: Set[str], known_boundaries: Set[str],
    known_policies: Set[str] = frozenset(),
    known_strategies: Set[str] = frozenset(),
) -> None:
    """Every boundary's clusters, every policy's boundary and every named rollout strategy
    must exist, in the file or in the database (`known_*`)."""
    problems = _Problems()
    strategies = {s.id for s in plan.strategies} | set(known_strategies)
    named = [(f"boundaries[{i}] (id {shown(b.id)})", b.rollout_strategy)
             for i, b in enumerate(plan.boundaries)]
    named += [(f"policies[{i}] (id {shown(p.id)})", p.rollout_strategy)
              for i, p in enumerate(plan.policies)]
    for label, strategy in named:
        if strategy is not None and strategy not in strategies:
            problems.add(label, f"rolloutStrategy: unknown strategy {shown(strategy)} (not in "
                         "the file nor the database)")
    clusters = set(plan.clusters) | set(known_clusters)
    boundaries = {b.id for b in plan.boundaries} | set(known_boundaries)
    for i, boundary in enumerate(plan.boundaries):
        for j, cluster in enumerate(boundary.clusters):
            if cluster not in clusters:
                problems.add(
                    f"boundaries[{i}] (id {shown(boundary.id)})",
                    f"clusters[{j}]: unknown cluster {shown(cluster)} (not in the file nor the "
                    "database)",
                )
    for i, (policy_id, exception) in enumerate(plan.exceptions):
        if policy_id not in {p.id for p in plan.policies} | set(known_policies):
            problems.add(f"exceptions[{i}] (id {shown(exception.id)})",
                         f"policy: unknown policy {shown(policy_id)} (not in the file nor the "
                         "database)")
    for i, policy in enumerate(plan.policies):
        if policy.boundary not in boundaries:
            problems.add(
                f"policies[{i}] (id {shown(policy.id)})",
                f"boundary: unknown boundary {shown(policy.boundary)} (not in the file nor the "
                "database)",
            )
    problems.raise_any()


def parse_file_bytes(data: bytes, *,
                     exception_max_days: float = EXCEPTION_MAX_DAYS_DEFAULT) -> ImportPlan:
    """Validate a file's bytes: one bounded YAML document, then `parse_import`."""
    try:
        document = load_yaml(data)
    except BadFile as exc:
        raise ImportFileError("file", [str(exc)]) from None
    return parse_import(document, exception_max_days=exception_max_days)


def load_file(path: Path, *, max_bytes: int = IMPORT_MAX_BYTES_DEFAULT,
              exception_max_days: float = EXCEPTION_MAX_DAYS_DEFAULT) -> ImportPlan:
    """Read (at most `max_bytes`) and validate a file; `ImportFileError` names the file."""
    try:
        data = read_bounded(path, max_bytes, setting=SETTINGS_BY_KEY["import_max_bytes"].env)
        return parse_file_bytes(data, exception_max_days=exception_max_days)
    except BadFile as exc:
        raise ImportFileError(str(path), [str(exc)]) from None
    except ImportFileError as exc:
        raise exc.naming(str(path)) from None


# ---- the database part -------------------------------------------------------------------------

_UPSERT_POLICIES = """
INSERT INTO policies AS p (id, boundary_id, rule, enabled, enforcement, rollout_strategy)
SELECT u.id, u.boundary_id, u.rule::jsonb, u.enabled, u.enforcement, u.rollout_strategy
FROM unnest($1::text[], $2::text[], $3::text[], $4::boolean[], $5::text[], $6::text[])
     AS u(id, boundary_id, rule, enabled, enforcement, rollout_strategy)
ON CONFLICT (id) DO UPDATE SET
    boundary_id = EXCLUDED.boundary_id,
    rule = EXCLUDED.rule,
    enabled = EXCLUDED.enabled,
    enforcement = EXCLUDED.enforcement,
    revision = p.revision + 1,
    deleted_at = NULL,
    updated_at = now()
WHERE (p.boundary_id, p.rule, p.enabled, p.enforcement) IS DISTINCT FROM
      (EXCLUDED.boundary_id, EXCLUDED.rule, EXCLUDED.enabled, EXCLUDED.enforcement)
   OR p.deleted_at IS NOT NULL
RETURNING p.id, (p.xmax = 0) AS inserted
"""


async def _apply_clusters(conn: asyncpg.Connection, plan: ImportPlan, counts: Counts) -> None:
    created = await conn.fetch(
        "INSERT INTO clusters (id) SELECT unnest($1::text[]) ON CONFLICT DO NOTHING RETURNING id",
        list(plan.clusters),
    )
    counts.created = len(created)
    counts.unchanged = len(plan.clusters) - len(created)


async def _apply_boundaries(conn: asyncpg.Connection, plan: ImportPlan, counts: Counts) -> None:
    ids = [b.id for b in plan.boundaries]
    created = {
        r["id"]
        for r in await conn.fetch(
            "INSERT INTO boundaries (id) SELECT unnest($1::text[]) ON CONFLICT DO NOTHING "
            "RETURNING id",
            ids,
        )
    }
    current = {
        r["boundary_id"]: set(r["clusters"])
        for r in await conn.fetch(
            """SELECT boundary_id, array_agg(cluster_id) AS clusters FROM boundary_clusters
               WHERE boundary_id = ANY($1::text[]) GROUP BY boundary_id""",
            ids,
        )
    }
    changed = [b for b in plan.boundaries if set(b.clusters) != current.get(b.id, set())]
    changed_ids = [b.id for b in changed]
    await conn.execute(
        "DELETE FROM boundary_clusters WHERE boundary_id = ANY($1::text[])", changed_ids
    )
    await conn.execute(
        """INSERT INTO boundary_clusters (boundary_id, cluster_id)
           SELECT * FROM unnest($1::text[], $2::text[])""",
        [b.id for b in changed for _ in b.clusters],
        [c for b in changed for c in b.clusters],
    )
    updated = [i for i in changed_ids if i not in created]
    await conn.execute(
        "UPDATE boundaries SET updated_at = now() WHERE id = ANY($1::text[])", updated
    )
    counts.created = len(created)
    counts.updated = len(updated)
    counts.unchanged = len(ids) - len(created) - len(updated)


async def _apply_policies(conn: asyncpg.Connection, plan: ImportPlan, counts: Counts) -> None:
    rows = await conn.fetch(
        _UPSERT_POLICIES,
        [p.id for p in plan.policies],
        [p.boundary for p in plan.policies],
        [json.dumps(p.rule) for p in plan.policies],
        [p.enabled for p in plan.policies],
        [p.enforcement.value for p in plan.policies],
        # A new policy's strategy (an existing one's was set before: `set_strategies`).
        [p.rollout_strategy for p in plan.policies],
    )
    counts.created = sum(1 for r in rows if r["inserted"])
    counts.updated = len(rows) - counts.created
    counts.unchanged = len(plan.policies) - len(rows)


async def apply_plan(conn: asyncpg.Connection, plan: ImportPlan) -> ImportSummary:
    """Apply a validated plan in one transaction (references are checked inside it)."""
    summary = ImportSummary()
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", IMPORT_LOCK_KEY)
        await set_actor(conn, "convergerd import")  # the revisions' `saved_by`
        known_clusters = {r["id"] for r in await conn.fetch("SELECT id FROM clusters")}
        known_boundaries = {r["id"] for r in await conn.fetch("SELECT id FROM boundaries")}
        known_policies = {r["id"] for r in await conn.fetch(
            "SELECT id FROM policies WHERE deleted_at IS NULL")}
        check_references(plan, known_clusters=known_clusters, known_boundaries=known_boundaries,
                         known_policies=known_policies,
                         known_strategies=await rollouts.strategy_ids(conn))
        await _apply_clusters(conn, plan, summary.clusters)
        await _apply_boundaries(conn, plan, summary.boundaries)
        # Before the policies: a policy's save (on its notification) finds its strategy.
        summary.strategies.updated = await rollouts.upsert_strategies(conn, plan.strategies)
        await rollouts.set_cluster_labels(conn, plan.labels)
        await rollouts.set_strategies(conn, "boundaries",
                                      {b.id: b.rollout_strategy for b in plan.boundaries})
        await rollouts.set_strategies(conn, "policies",
                                      {p.id: p.rollout_strategy for p in plan.policies})
        await _apply_policies(conn, plan, summary.policies)
        for policy_id, exception in plan.exceptions:
            done = await upsert_exception(conn, policy_id, exception)
            setattr(summary.exceptions, done, getattr(summary.exceptions, done) + 1)
    return summary


async def import_file(
    dsn: str, path: Path, *, max_bytes: int = IMPORT_MAX_BYTES_DEFAULT,
    exception_max_days: float = EXCEPTION_MAX_DAYS_DEFAULT,
) -> ImportSummary:
    """`convergerd import FILE`: read at most `max_bytes`, validate, then upsert everything in
    one transaction."""
    plan = load_file(path, max_bytes=max_bytes, exception_max_days=exception_max_days)
    with database_errors(dsn, connecting=True):
        conn = await asyncpg.connect(dsn, timeout=10)
    try:
        await check_schema(conn)
        with database_errors(dsn):
            return await apply_plan(conn, plan)
    except ImportFileError as exc:
        raise exc.naming(str(path)) from None
    finally:
        await conn.close()
