"""`convergerd status [--addr URL]`: a running daemon's `/status` as a table in the terminal;
`convergerd status --boundary B --token T`: what one boundary's tenant sees
(`/v1/boundaries/{boundary}`): its clusters and its policies, nothing of other boundaries.
`convergerd status --policy ID`: one policy per cluster (`/v1/policies/{id}/status`; with
`--boundary`, `/v1/boundaries/{boundary}/policies/{id}`): its phase with the mode in force
beside it, the probe, what admission counted and the audit, and its totals over the fleet.

Wherever a phase is shown, the mode of the binding in force (`status.enforcementAction`:
Deny, Warn, Audit) is shown beside it, so a Warn policy is never taken for one that denies;
the admission counts (the API server's failed validations denied, warned, audited, since each
cluster's installed revision) are shown per policy.

Clusters are listed worst first (unreached, never checked, failing, then by lag), under a header
saying which replica answered, who leads, and the last and next round. Any replica can answer:
standbys read the leader's records from the database. Past the daemon's
CONVERGERD_STATUS_MAX_CLUSTERS the answer lists only the worst clusters, with the fleet's counts
(said under the table); `--all` walks the pages of every cluster (`?limit=&after=`) and lists
them all.

The token (`--token`, `--token-file`) is sent as a bearer token: a boundary's read token, or
the admin token (needed for the fleet when the daemon sets CONVERGERD_FLEET_READS_NEED_TOKEN).
With a token no redirect is followed (it would carry the token on).

Under the table, per policy with exceptions in force (`GET /v1/exceptions`, read with the same
token): how many, and the first to expire with its time left.

Exit codes: 0 status shown; 2 the daemon could not be reached or did not answer with status
(a token refused included).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from convergerd.config import read_secret_file
from convergerd.core.decode import bounded_json, rfc3339
from convergerd.core.errors import ConfigError, NotJSON
from convergerd.core.model import RuleError, check_boundary_id, check_policy_id
from convergerd.core.shown import shown
from convergerd.status.listing import worst_first_key

DEFAULT_ADDR = "http://127.0.0.1:8080"
EXIT_OK = 0
EXIT_UNREACHABLE = 2
_MAX_ERROR = 60
_MAX_REASON = 200  # a rollout's reason names its gate and the worst clusters
# The status of 10,000 clusters is a few MB; an answer over this is not a status (a wrong
# --addr, or a peer that never stops sending) and is not read further.
MAX_STATUS_BYTES = 64 * 2**20
# The exceptions' list (at most 64 in force per policy, and the expired ones kept a while).
MAX_EXCEPTIONS_BYTES = 16 * 2**20
# Policies with exceptions shown under the table; `convergerd policy exceptions` lists them all.
EXCEPTION_LINES = 20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--addr", default=DEFAULT_ADDR,
                        help=f"the daemon's HTTP address (default {DEFAULT_ADDR})")
    parser.add_argument("--timeout", type=float, default=10.0,
                        help="seconds to wait for the answer (default 10)")
    parser.add_argument("--json", action="store_true", help="print the raw /status JSON")
    parser.add_argument("--all", action="store_true",
                        help="list every cluster of a fleet the daemon summarises (past its "
                             "CONVERGERD_STATUS_MAX_CLUSTERS), reading it page by page")
    parser.add_argument("--boundary", metavar="B",
                        help="only this boundary, as its tenant sees it (with its read token "
                             "or the admin token)")
    parser.add_argument("--policy", metavar="ID",
                        help="one policy on each cluster: phase and mode, probe, admission "
                             "counts, audit")
    parser.add_argument("--token", metavar="TOKEN",
                        help="bearer token to send (a boundary's read token, or the admin "
                             "token); `ps` shows it: prefer --token-file")
    parser.add_argument("--token-file", type=Path, metavar="PATH",
                        help="file holding the token to send")


def _token(args: argparse.Namespace) -> str | None:
    if getattr(args, "token_file", None) is not None:
        return read_secret_file("--token-file", args.token_file)
    token: str | None = getattr(args, "token", None)
    return token


def run(args: argparse.Namespace, *, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    addr = str(args.addr).rstrip("/")
    if "://" not in addr:
        addr = f"http://{addr}"
    boundary: str | None = getattr(args, "boundary", None)
    policy: str | None = getattr(args, "policy", None)
    try:
        token = _token(args)
        if policy is not None:
            check_policy_id(policy)
            if boundary is not None:
                check_boundary_id(boundary)
            path = (f"/v1/boundaries/{boundary}/policies/{policy}" if boundary is not None
                    else f"/v1/policies/{policy}/status")
            doc = fetch_status(addr, timeout_s=float(args.timeout), path=path, token=token)
        elif boundary is not None:
            check_boundary_id(boundary)
            path = f"/v1/boundaries/{boundary}"
            doc = with_every_cluster(fetch_status(addr, timeout_s=float(args.timeout),
                                                  path=path, token=token),
                                     addr, timeout_s=float(args.timeout), token=token,
                                     path=path)
        else:
            doc = fetch_status(addr, timeout_s=float(args.timeout), token=token)
            if args.all:
                doc = with_every_cluster(doc, addr, timeout_s=float(args.timeout),
                                         token=token)
    except (StatusUnavailable, ConfigError, RuleError) as exc:
        err.write(f"convergerd status: {exc}\n")
        return EXIT_UNREACHABLE
    if args.json:
        out.write(json.dumps(doc, indent=2) + "\n")
    elif policy is not None:
        out.write(render_policy(doc, addr=addr))
    elif boundary is not None:
        out.write(render_boundary(doc, addr=addr))
    else:
        exceptions = fetch_exceptions(addr, timeout_s=float(args.timeout), token=token)
        out.write(render_status(doc, addr=addr, exceptions=exceptions))
    return EXIT_OK


def fetch_exceptions(addr: str, *, timeout_s: float, token: str | None) -> list[Any] | str:
    """The daemon's exceptions (`GET /v1/exceptions`, the same fleet view as `/status`), or
    why they could not be read."""
    try:
        doc = fetch_status(addr, timeout_s=timeout_s, path="/v1/exceptions", token=token,
                           max_bytes=MAX_EXCEPTIONS_BYTES)
    except StatusUnavailable as exc:
        return str(exc)
    found = doc.get("exceptions")
    return found if isinstance(found, list) else "the answer lists no exceptions"


class StatusUnavailable(Exception):
    pass


# A boundary's pages list at most this many clusters in all.
_MAX_WALKED = 1_000_000
# A 429's Retry-After is honoured up to this many seconds (and within --timeout).
_MAX_RETRY_AFTER_S = 10


def _retry_after(exc: urllib.error.HTTPError) -> int | None:
    try:
        value = int(exc.headers.get("Retry-After", ""))
    except ValueError:
        return None
    return value if 0 <= value <= _MAX_RETRY_AFTER_S else None


def fetch_status(
    addr: str, *, timeout_s: float, max_bytes: int = MAX_STATUS_BYTES, path: str = "/status",
    token: str | None = None,
) -> dict[str, Any]:
    """`path` (`/status`, or one of its pages) of the daemon at `addr`, read up to
    `max_bytes`, with `token` as the bearer token if given. A daemon shedding status reads
    (429) is asked again after its Retry-After, while that fits in `timeout_s`."""
    url = f"{addr}{path}"
    if not url.startswith(("http://", "https://")):
        raise StatusUnavailable(f"{addr} is not an http(s) address")
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            body = _get(addr, url, timeout_s=max(0.1, deadline - time.monotonic()),
                        max_bytes=max_bytes, token=token)
            if len(body) > max_bytes:
                raise StatusUnavailable(f"{url} answered more than {max_bytes} bytes")
            break
        except urllib.error.HTTPError as exc:
            wait = _retry_after(exc) if exc.code == 429 else None
            if wait is None or time.monotonic() + wait >= deadline:
                raise StatusUnavailable(f"{url} answered {exc.code} {exc.reason}"
                                        + _refusal(exc)) from None
            time.sleep(wait)
    try:
        doc = bounded_json(body)
    except NotJSON:
        raise StatusUnavailable(f"{url} did not answer with JSON") from None
    if not isinstance(doc, dict):
        raise StatusUnavailable(f"{url} did not answer with a status document")
    return doc


def _refusal(exc: urllib.error.HTTPError) -> str:
    """The daemon's `error` of a refused request (a token refused says why), shortened."""
    try:
        doc = bounded_json(exc.read(4096))
    except (NotJSON, OSError):
        return ""
    error = doc.get("error") if isinstance(doc, dict) else None
    return f": {shown(error, 200, style='prose')}" if error else ""


def with_every_cluster(doc: dict[str, Any], addr: str, *, timeout_s: float,
                       token: str | None = None, path: str = "/status") -> dict[str, Any]:
    """`doc` (of `path`: `/status` or a boundary's) with every cluster, when it lists only
    some: its `listing.next` page, and each page's next, until the last (each page read within
    `timeout_s`). A walk is bounded: at most twice the clusters the fleet counted (clusters
    may join during the walk), never a loop."""
    listing = doc.get("listing")
    if not isinstance(listing, Mapping) or listing.get("complete") is not False:
        return doc  # every cluster already, or a daemon that does not page
    counted = (doc.get("fleet") or {}).get("clusters")
    most = 2 * counted + 1 if isinstance(counted, int) else 0
    clusters: list[Any] = []
    if path != "/status":
        # A boundary's document is its first page (a fleet's lists the worst instead), and
        # does not count its clusters: the walk is bounded by `_MAX_WALKED`.
        clusters, most = list(doc.get("clusters") or []), _MAX_WALKED
    following = listing.get("next")
    while following is not None:
        if not isinstance(following, str) or not following.startswith(f"{path}?"):
            raise StatusUnavailable(f"{addr}{path} gave no page to read next: "
                                    f"{shown(following, style='text')}")
        page = fetch_status(addr, timeout_s=timeout_s, path=following, token=token)
        listed = page.get("clusters")
        if not isinstance(listed, list) or not isinstance(page.get("listing"), Mapping):
            raise StatusUnavailable(f"{addr}{following} did not answer with a page of "
                                    "clusters")
        clusters.extend(listed)
        if len(clusters) > most:
            raise StatusUnavailable(f"{addr}{path} pages list more than {most} clusters, "
                                    f"twice the {counted} it counted")
        following = page["listing"].get("next")
    return {**doc, "clusters": clusters,
            "listing": {**listing, "complete": True, "listed": len(clusters), "next": None}}


class NoRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect is not followed: urllib would send the bearer token on to wherever the
    `Location` points. The 3xx comes back as an `HTTPError`."""

    def redirect_request(  # noqa: PLR0917 - urllib calls it so
            self, req: urllib.request.Request, fp: Any, code: int, msg: str,
            headers: Any, newurl: str) -> None:
        return None


def _get(addr: str, url: str, *, timeout_s: float, max_bytes: int,
         token: str | None = None) -> bytes:
    """The answer's body, at most `max_bytes` + 1 bytes of it (one more: "too long"); with
    `token`, sent as the bearer token and no redirect followed."""
    headers = {"Accept": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, headers=headers)  # noqa: S310
    opener = urllib.request.build_opener(*([NoRedirects] if token is not None else []))
    try:
        with opener.open(request, timeout=timeout_s) as response:
            body: bytes = response.read(max_bytes + 1)
            return body
    except urllib.error.HTTPError:
        raise  # an answer: the caller decides
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise StatusUnavailable(
            f"cannot reach convergerd at {addr} ({reason}); is the daemon running, "
            "and is --addr its CONVERGERD_HTTP_ADDR?"
        ) from None


# ---------------------------------------------------------------------------------------------
# Rendering (pure)


def format_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = round(seconds)
    if s < 120:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 172800:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s // 86400}d{(s % 86400) // 3600:02d}h"


def _reachable(value: object) -> str:
    if value is True:
        return "up"
    return "DOWN" if value is False else "?"


def _phases(counts: Mapping[str, int] | None) -> str:
    if not counts:
        return "-"
    return " ".join(f"{phase}={n}" for phase, n in sorted(counts.items()) if n)


def _verified(counts: object) -> str:
    """`verified/policies`, and `ADMITTED=n` when a violating pod was admitted (not enforced),
    `STALE=n` when the last probe is too old to be current (the operator stopped probing)."""
    if not isinstance(counts, Mapping):
        return "-"
    numbers = {k: v for k, v in counts.items() if isinstance(v, int)}
    total = sum(numbers.values())
    if not total:
        return "-"
    parts = [f"{numbers.get('verified', 0)}/{total}"]
    parts += [f"{label}={numbers[key]}" for key, label in (("admitted", "ADMITTED"),
                                                             ("stale", "STALE"))
              if numbers.get(key)]
    return " ".join(parts)


def _violations(audit: object) -> str:
    """The audit's count of existing objects the cluster's policies would deny; `UNKNOWN=n`
    for audits that cannot be read, `UNSYNCED` when some audit is not current; `?` when none
    can be read, `-` when none was read."""
    if not isinstance(audit, Mapping):
        return "-"
    count, unknown, audited = (audit.get(k) for k in ("violations", "unknown",
                                                       "policies_audited"))
    if not _is_count(count) or (_is_count(unknown) and unknown and unknown == audited):
        return "?"
    parts = [str(count)]
    if _is_count(unknown) and unknown:
        parts.append(f"UNKNOWN={unknown}")
    if audit.get("unsynced") is True:
        parts.append("UNSYNCED")
    return " ".join(parts)


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# Policies listed under the table with their fleet-wide violations, worst first.
_POLICIES_SHOWN = 10


def _audit_lines(audit: object) -> list[str]:
    """Per policy, the existing objects it would deny over the fleet (the operator's audit)."""
    if not isinstance(audit, Mapping) or not audit.get("clusters_audited"):
        return []
    listed = [p for p in audit.get("policies") or [] if isinstance(p, Mapping)]
    total = audit.get("policies_with_violations")
    lines = [f"existing workloads the policies would deny (operator audit): "
             f"{audit.get('violations', '?')} on {audit.get('clusters_with_violations', '?')} "
             f"of {audit.get('clusters_audited', '?')} audited clusters"
             + (f"; {audit['unsynced_clusters']} with an audit not current (UNSYNCED)"
                if audit.get("unsynced_clusters") else "")]
    for p in listed[:_POLICIES_SHOWN]:
        clusters = p.get("clusters")
        lines.append(f"  {shown(p.get('id'), style='text')}: {p.get('violations')} on "
                     f"{clusters} cluster{'' if clusters == 1 else 's'}")
    shown_count = min(len(listed), _POLICIES_SHOWN)
    if isinstance(total, int) and total > shown_count:
        lines.append(f"  and {total - shown_count} more policies "
                     "(GET /v1/policies/ID/status for one)")
    return lines


def sort_clusters(clusters: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return sorted(clusters, key=lambda c: worst_first_key(
        cluster=str(c.get("id", "")),
        reachable=c.get("reachable"),
        failing=bool(c.get("last_error")) or bool(c.get("failed")),
        lag_s=c.get("lag_seconds"),
    ))


def table(rows: list[list[str]]) -> list[str]:
    """`rows` (the first one the header) as lines of left-aligned columns two spaces apart."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip()
            for r in rows]


def _when(value: object) -> str:
    if not value:
        return "-"
    moment = rfc3339(value)  # in UTC; an offset past year 1 or 9999 is no time, not a crash
    if moment is None:
        return shown(value, _MAX_ERROR, style="prose")
    return f"{moment.year:04d}-{moment:%m-%d %H:%M:%S} UTC"


def _header(doc: Mapping[str, Any], addr: str | None) -> list[str]:
    leader = doc.get("leader") or {}
    holder = leader.get("holder")
    if leader.get("is_leader"):
        leads = "this replica leads"
    elif holder:
        leads = f"leader: {holder} (this replica is a standby)"
    else:
        leads = "NO LEADER known"
    lines = [f"convergerd {doc.get('version', '')} at {addr or '?'}: replica "
             f"{doc.get('identity', '?')}, {leads}"]
    last = doc.get("last_round")
    if last:
        counts = last.get("counts") or {}
        lines.append(
            f"last round: {last.get('result', '?')}, started {_when(last.get('started_at'))}, "
            f"finished {_when(last.get('finished_at'))} by {last.get('leader') or '?'}: "
            f"{counts.get('clusters', 0)} clusters, {counts.get('converged', 0)} converged, "
            f"{counts.get('unreached', 0)} unreached"
            + (f"; {last['error']}" if last.get("error") else "")
        )
    else:
        lines.append("last round: none recorded yet")
    lines.append(f"next round: {_when(doc.get('next_round_at'))}")
    lines.extend(_shard_lines(doc.get("shards")))
    database = doc.get("database") or {}
    if database and not database.get("reachable", True):
        error = shown(database.get("error") or "", 120, style="prose")
        lines.append(f"DATABASE UNREACHABLE: {error} (cluster data may be old)")
    invalid = doc.get("invalid_policies") or []
    if invalid:
        lines.append(f"invalid policies ({len(invalid)}, never delivered):")
        lines.extend(f"  {shown(p.get('id'), style='text')}: "
                     f"{shown(p.get('reason') or '', style='prose')}" for p in invalid)
    lines.extend(_pending_lines(doc.get("pending_deletions")))
    lines.extend(_rollout_lines(doc.get("rollouts")))
    unsupported = doc.get("unsupported_by_version") or {}
    if unsupported:
        lines.append("Unsupported (no ValidatingAdmissionPolicy, nothing enforced):")
        lines.extend(f"  Kubernetes {version}: {', '.join(clusters)}"
                     for version, clusters in sorted(unsupported.items()))
    return lines


def _sharded(doc: Mapping[str, Any]) -> bool:
    shards = doc.get("shards")
    return isinstance(shards, Mapping) and isinstance(shards.get("count"), int) \
        and shards["count"] > 1


def _shard_lines(shards: object) -> list[str]:
    """With more than one shard: who holds which (as this replica sees the Leases), each
    shard's last round (from the database) and the orphans."""
    if not isinstance(shards, Mapping) or not isinstance(shards.get("count"), int) \
            or shards["count"] <= 1:
        return []
    listed = [k for k in shards.get("shards") or [] if isinstance(k, Mapping)]
    unheld = [str(k.get("shard")) for k in listed if not k.get("holder")]
    members = ", ".join(shown(m, 40, style="text") for m in shards.get("members") or [])
    held = ", ".join(str(k) for k in shards.get("held_here") or []) or "none"
    lines = [f"shards: {shards['count']}; this replica holds {held} (share "
             f"{shards.get('share', '?')}); live replicas: {members or '?'}; "
             f"UNHELD: {', '.join(unheld)}" if unheld else
             f"shards: {shards['count']}; this replica holds {held} (share "
             f"{shards.get('share', '?')}); live replicas: {members or '?'}"]
    orphans = shards.get("orphan_clusters") or 0
    if orphans:
        lines.append(f"ORPHAN CLUSTERS: {orphans} without a finished round for two intervals")
    rows = [["SHARD", "HOLDER", "CLUSTERS", "ORPHANS", "LAST ROUND"]]
    rows.extend([str(k.get("shard", "?")), shown(k.get("holder") or "-", 40, style="text"),
                 str(k.get("clusters", 0)), str(k.get("orphan_clusters", 0)),
                 _when(k.get("last_round_at"))] for k in listed)
    lines.extend(f"  {line}" for line in table(rows))
    return lines


def _pending_lines(pending: object) -> list[str]:
    """Deletions some cluster did not confirm: the policy is still enforced there."""
    if not isinstance(pending, Mapping) or not pending.get("count"):
        return []
    listed = [p for p in pending.get("oldest_first") or [] if isinstance(p, Mapping)]
    lines = [f"pending deletions ({pending['count']}, still enforced where held; retry "
             "`convergerd policy delete ID`):"]
    for p in listed:
        held = ", ".join(str(c) for c in p.get("held_by") or [])
        more = (p.get("clusters_holding") or 0) - len(p.get("held_by") or [])
        lines.append(f"  {p.get('id')}: pending {format_duration(p.get('pending_seconds'))}, "
                     f"held by {held or 'no recorded cluster'}"
                     + (f" and {more} more" if more > 0 else ""))
    return lines


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _rollout_lines(rollouts: object) -> list[str]:
    """Each live rollout: its wave, state, clusters per revision and the gate that holds it
    (`convergerd rollout status ID` for one in detail)."""
    listed = ([r for r in rollouts if isinstance(r, Mapping)]
              if isinstance(rollouts, list) else [])
    if not listed:
        return []
    lines = [f"rollouts in progress ({len(listed)}; `convergerd rollout status ID` for one):"]
    rows = [["POLICY", "REVISION", "STATE", "WAVE", "NEW", "OLD", "HELD BY"]]
    for r in listed:
        wave = _mapping(r.get("wave"))
        index = wave.get("index")
        position = (f"{index + 1}/{wave.get('of', '?')} "
                    f"{shown(wave.get('name'), 40, style='text')}"
                    if isinstance(index, int) else "?")
        if wave.get("warn_step"):
            position += " (warn)"
        clusters = _mapping(r.get("clusters"))
        rows.append([shown(r.get("policy"), 50, style="text"),
                     f"{r.get('from_revision') or '-'} -> {r.get('to_revision', '?')}",
                     shown(r.get("state"), 20, style="text"), position,
                     str(clusters.get("new", "?")), str(clusters.get("old", "?")),
                     shown(r.get("reason") or r.get("gate") or "-", _MAX_REASON,
                           style="prose")])
    lines.extend(f"  {line}" for line in table(rows))
    return lines


def render_status(doc: Mapping[str, Any], *, addr: str | None = None,
                  exceptions: Sequence[Any] | str | None = None) -> str:
    """`doc` (`/status`) as the table; with `exceptions` (`GET /v1/exceptions`' list, or why
    it could not be read), a line per policy with exceptions in force."""
    lines = _header(doc, addr)
    clusters = sort_clusters(doc.get("clusters") or [])
    lines.append("")
    if not clusters:
        lines.append("no clusters known")
        return "\n".join(lines) + "\n"
    sharded = _sharded(doc)
    rows = [["CLUSTER", *(["SHARD", "HOLDER"] if sharded else []), "REACHED", "LAG", "DESIRED",
             "IN-SYNC", "FAILED", "PHASES", "MODES", "VERIFIED", "VIOLATIONS", "VERSION",
             "LAST ERROR"]]
    rows.extend(
        [
            str(c.get("id", "?")),
            *([str(c.get("shard", "?")),
               ("ORPHAN " if c.get("orphaned") else "")
               + shown(c.get("holder") or "-", 40, style="text")] if sharded else []),
            _reachable(c.get("reachable")),
            format_duration(c.get("lag_seconds")),
            str(c.get("desired", 0)),
            str(c.get("in_sync", 0)),
            str(c.get("failed", 0)),
            _phases(c.get("phases")),
            _phases(c.get("enforcement")),
            _verified(c.get("verification")),
            _violations(c.get("audit")),
            str(c.get("server_version") or "-"),
            shown(c.get("last_error") or "", _MAX_ERROR, style="prose"),
        ]
        for c in clusters
    )
    lines.extend(table(rows))
    lines.append("")
    lines.extend(_fleet_lines(doc, clusters))
    lines.extend(_audit_lines(doc.get("audit")))
    lines.extend(_admission_lines(doc.get("admission")))
    lines.extend(_exception_lines(exceptions, rfc3339(doc.get("now"))))
    return "\n".join(lines) + "\n"


def _exception_lines(exceptions: Sequence[Any] | str | None,
                     now: dt.datetime | None) -> list[str]:
    """Per policy, its exceptions in force and the soonest to expire (the list comes soonest
    first); nothing when there are none."""
    if exceptions is None:
        return []
    if isinstance(exceptions, str):
        return [f"exceptions: not read ({shown(exceptions, 120, style='prose')})"]
    by_policy: dict[str, list[Mapping[str, Any]]] = {}
    for e in exceptions:
        if isinstance(e, Mapping) and e.get("state") == "active":
            by_policy.setdefault(shown(e.get("policy"), style="text"), []).append(e)
    if not by_policy:
        return []
    lines = ["exceptions in force (`convergerd policy exceptions` lists them):"]
    for policy, found in list(by_policy.items())[:EXCEPTION_LINES]:
        first = found[0]
        expires = rfc3339(first.get("expiresAt"))
        left = (f", in {format_duration((expires - now).total_seconds())}"
                if expires is not None and now is not None else "")
        lines.append(f"  {policy}: {len(found)}, the first to expire "
                     f"{shown(first.get('id'), style='text')} (namespace "
                     f"{shown(first.get('namespace'), style='text')}) at "
                     f"{_when(first.get('expiresAt'))}{left}")
    if len(by_policy) > EXCEPTION_LINES:
        lines.append(f"  and {len(by_policy) - EXCEPTION_LINES} more policies")
    return lines


def _fleet_lines(doc: Mapping[str, Any], clusters: Sequence[Mapping[str, Any]]) -> list[str]:
    """The counts under the table: the fleet's (the daemon's `fleet`) when the answer lists
    only the worst clusters, else counted from the list."""
    fleet = doc.get("fleet")
    listing = doc.get("listing")
    if isinstance(fleet, Mapping) and isinstance(listing, Mapping) \
            and listing.get("complete") is False:
        def n(key: str) -> object:
            return fleet.get(key, "?")
        return [f"{n('clusters')} clusters: {n('unreached')} unreached, {n('failing')} "
                f"reached but failing, {n('lagging')} lagging, {n('in_sync')} in sync",
                f"the {len(clusters)} worst listed (past the daemon's "
                "CONVERGERD_STATUS_MAX_CLUSTERS); `convergerd status --all` lists every one"]
    down = sum(c.get("reachable") is False for c in clusters)
    failing = sum(c.get("reachable") is not False and (bool(c.get("last_error"))
                                                       or bool(c.get("failed")))
                  for c in clusters)
    return [f"{len(clusters)} clusters: {down} unreached, {failing} reached but failing"]


_ACTIONS = ("denied", "warned", "audited")


def _admissions(figures: object) -> str:
    """Admission's counts (`denied`, `warned`, `audited`): the ones above 0 by name, `0` when
    none is, `?` when they cannot be read, `-` when none were read."""
    if not isinstance(figures, Mapping):
        return "-"
    counts = [(k, figures.get(k)) for k in _ACTIONS]
    if not all(_is_count(n) for _, n in counts):
        return "?"
    return " ".join(f"{k}={n}" for k, n in counts if n) or "0"


def _admission_lines(admission: object) -> list[str]:
    """Per policy admission counted or in force in a mode other than Deny somewhere, over the
    fleet: its counts since each cluster's revision, the last hour's, its clusters per mode."""
    if not isinstance(admission, Mapping):
        return []
    listed = [p for p in admission.get("policies") or [] if isinstance(p, Mapping)]
    if not listed:
        return []
    lines = [f"admission (the API server's counts since each cluster's revision): "
             f"{_admissions(admission)}; last hour {_admissions(admission.get('last_hour'))}"]
    lines.extend(
        f"  {shown(p.get('id'), style='text')}: {_admissions(p)} (last hour "
        f"{_admissions(p.get('last_hour'))}); in force as "
        f"{_phases(p.get('clusters_by_enforcement'))}"
        + (f"; excepted {p['excepted']}" if _is_count(p.get("excepted")) else "")
        for p in listed[:_POLICIES_SHOWN])
    total = admission.get("policies_total")
    if isinstance(total, int) and total > min(len(listed), _POLICIES_SHOWN):
        lines.append(f"  and {total - min(len(listed), _POLICIES_SHOWN)} more policies "
                     "(convergerd status --policy ID for one)")
    return lines


def render_policy(doc: Mapping[str, Any], *, addr: str | None = None) -> str:
    """`/v1/policies/{id}/status` as a table: per cluster its phase with the mode in force
    beside it, the probe, admission's counts and the audit; the totals over the fleet."""
    policy = _mapping(doc.get("policy"))
    lines = [f"policy {shown(policy.get('id'), style='text')} of boundary "
             f"{shown(policy.get('boundary'), style='text')} at {addr or '?'}: revision "
             f"{policy.get('revision', '?')}, saved as "
             f"{shown(policy.get('enforcement'), style='text')}, "
             + ("enabled" if policy.get("enabled") else "DISABLED")
             + (f", INVALID: {shown(policy['invalid'], _MAX_ERROR, style='prose')}"
                if policy.get("invalid") else "")]
    admission = doc.get("admission")
    if isinstance(admission, Mapping):
        lines.append(f"admission over {admission.get('clusters_counted', '?')} clusters "
                     f"counting (since each one's revision): {_admissions(admission)}; last "
                     f"hour {_admissions(admission.get('last_hour'))}; in force as "
                     f"{_phases(admission.get('clusters_by_enforcement'))}"
                     + (f"; {admission['clusters_unknown']} UNREADABLE"
                        if admission.get("clusters_unknown") else "")
                     + (f"; {admission['clusters_stale']} STALE"
                        if admission.get("clusters_stale") else ""))
    audit = doc.get("audit")
    if isinstance(audit, Mapping) and audit.get("clusters_audited"):
        lines.append(f"existing workloads it would deny (operator audit): "
                     f"{audit.get('violations', '?')} on "
                     f"{audit.get('clusters_with_violations', '?')} of "
                     f"{audit.get('clusters_audited', '?')} audited clusters"
                     + (f"; {audit['excepted']} excepted" if _is_count(audit.get("excepted"))
                        else ""))
    clusters = [c for c in doc.get("clusters") or [] if isinstance(c, Mapping)]
    lines.append("")
    if not clusters:
        lines.append("no clusters")
        return "\n".join(lines) + "\n"
    rows = [["CLUSTER", "REVISION", "PHASE", "MODE", "VERIFIED", "ADMISSIONS", "LAST HOUR",
             "EXCEPTED", "VIOLATIONS", "LAST ERROR"]]
    for c in clusters:
        audit_c = _mapping(c.get("audit"))
        verified = _mapping(c.get("verified"))
        found = c.get("admission") if isinstance(c.get("admission"), Mapping) else None
        rows.append([
            shown(c.get("cluster"), style="text"),
            str(c.get("delivered_revision") if c.get("delivered_revision") is not None
                else "-"),
            shown(c.get("phase") or "-", 20, style="text") + (" STALE" if c.get("stale")
                                                               else ""),
            shown(c.get("enforcement_action") or "-", 20, style="text"),
            shown(verified.get("verification") or "-", 20, style="text"),
            _admissions(found) + (" STALE" if found and found.get("stale") else ""),
            _admissions(found.get("last_hour")) if found else "-",
            str(audit_c.get("excepted")) if _is_count(audit_c.get("excepted")) else "-",
            str(audit_c.get("violations")) if _is_count(audit_c.get("violations")) else "-",
            shown(c.get("last_error") or "", _MAX_ERROR, style="prose"),
        ])
    lines.extend(table(rows))
    return "\n".join(lines) + "\n"


def render_boundary(doc: Mapping[str, Any], *, addr: str | None = None) -> str:
    """`/v1/boundaries/{boundary}` as tables: its policies, then its clusters."""
    lines = [f"boundary {shown(doc.get('boundary'), style='text')} at {addr or '?'}, as of "
             f"{_when(doc.get('now'))} (replica {shown(doc.get('identity'), style='text')})"]
    policies = [p for p in doc.get("policies") or [] if isinstance(p, Mapping)]
    lines.append("")
    if policies:
        rows = [["POLICY", "REVISION", "ENABLED", "CLUSTERS", "IN-SYNC", "FAILED", "PHASES",
                 "MODES", "VERIFIED", "ADMISSIONS", "VIOLATIONS", "INVALID"]]
        rows.extend([shown(p.get("id"), style="text"), str(p.get("revision", "?")),
                     "yes" if p.get("enabled") else "no", str(p.get("clusters", "?")),
                     str(p.get("in_sync", 0)), str(p.get("failed", 0)),
                     _phases(p.get("phases")), _phases(p.get("enforcement")),
                     _verified(p.get("verification")), _admissions(p.get("admission")),
                     str(p.get("violations", 0)),
                     shown(p.get("invalid") or "", _MAX_ERROR, style="prose")]
                    for p in policies)
        lines.extend(table(rows))
    else:
        lines.append("no policies")
    total = doc.get("policies_total")
    if isinstance(total, int) and total > len(policies):
        lines.append(f"the first {len(policies)} of {total} policies listed")
    lines.extend(f"  {shown(p.get('id'), style='text')} would deny "
                 f"{shown(sample.get('kind'), style='text')} "
                 f"{shown(sample.get('namespace') or '', style='text')}/"
                 f"{shown(sample.get('name'), style='text')} on "
                 f"{shown(sample.get('cluster'), style='text')}: "
                 f"{shown(sample.get('message') or '', _MAX_ERROR, style='prose')}"
                 for p in policies for sample in (p.get("audit") or {}).get("sample") or []
                 if isinstance(sample, Mapping))
    unsupported = doc.get("unsupported_by_version") or {}
    if isinstance(unsupported, Mapping) and unsupported:
        lines.append("Unsupported (no ValidatingAdmissionPolicy, nothing enforced):")
        lines.extend(f"  Kubernetes {shown(v, style='text')}: "
                     f"{', '.join(shown(c, style='text') for c in cs)}"
                     for v, cs in sorted(unsupported.items()))
    clusters = sort_clusters([c for c in doc.get("clusters") or [] if isinstance(c, Mapping)])
    lines.append("")
    if not clusters:
        lines.append("no clusters")
        return "\n".join(lines) + "\n"
    rows = [["CLUSTER", "REACHED", "LAG", "IN-SYNC", "FAILED", "PHASES", "MODES", "VERIFIED",
             "VIOLATIONS", "VERSION", "FAILURE"]]
    rows.extend([shown(c.get("id"), style="text"), _reachable(c.get("reachable")),
                 format_duration(c.get("lag_seconds")), str(c.get("in_sync", 0)),
                 str(c.get("failed", 0)), _phases(c.get("phases")),
                 _phases(c.get("enforcement")),
                 _verified(c.get("verification")), str(c.get("violations", 0)),
                 shown(c.get("server_version") or "-", 40, style="text"),
                 shown(c.get("failure") or "", _MAX_ERROR, style="prose")]
                for c in clusters)
    lines.extend(table(rows))
    down = sum(c.get("reachable") is False for c in clusters)
    lines.append("")
    lines.append(f"{len(clusters)} clusters: {down} unreached")
    return "\n".join(lines) + "\n"
