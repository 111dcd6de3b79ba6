"""The web page's HTML (pure): the sign-in form, the fleet (the admin's), a boundary (its
tenant's), one policy, and the answers that are not a page (not found, too many reads). The
data is the JSON views' (`/status`'s head and cluster summaries, a boundary's view, a policy's
view, `status.views.record_view` per cell); this module only lays it out.

Every value is escaped where it is written (`h`, `url`), whatever it is: ids are checked at
the edge but messages come from clusters and operators. Colour is never the only signal: a
cell says its phase in words and marks Verified and violations with a sign the legend
explains; every table has a caption and header cells. No script; one stylesheet, from the
package (`ui_static/`), so the page works offline under a strict Content-Security-Policy.
"""

from __future__ import annotations

import html
import urllib.parse
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from convergerd.core.gates import Gate
from convergerd.status.phases import (
    ADMITTED,
    NOT_VERIFIED,
    STALE,
    STALE_VERIFICATION,
    UNKNOWN_VERIFICATION,
    VERIFIED,
)

# What a cluster-level failure's reason (`core.errors`, a slug) means, in plain words.
PLAIN_REASONS: Mapping[str, str] = {
    "unreachable": "the cluster could not be reached (no connection, or it timed out)",
    "no_context": "there are no credentials for this cluster in the kubeconfig",
    "server_error": "the cluster's API server failed (a 5xx answer)",
    "throttled": "the cluster asked convergerd to slow down (429) until the deadline",
    "cluster_rejected": "the cluster refused convergerd's credentials, or has no Policy API",
    "rejected": "the cluster rejected the policy",
    "superseded": "a newer write won",
    "bad_response": "the cluster answered with something unusable",
    "deadline": "the round's deadline passed before the cluster answered",
    "fenced": "this replica lost its leadership before writing",
}
# A Verified verdict (`status.phases.VERIFICATIONS`): its sign in a cell and its words.
VERIFICATION_SIGNS: Mapping[str, tuple[str, str]] = {
    VERIFIED: ("✓", "verified: a violating object was denied at the last probe"),
    ADMITTED: ("✗", "NOT enforced: a violating object was admitted at the last probe"),
    NOT_VERIFIED: ("!", "not verified: the probe failed or cannot be believed"),
    STALE_VERIFICATION: ("…", "the last probe is too old to count"),
    UNKNOWN_VERIFICATION: ("?", "no probe read yet"),
}
VIOLATIONS_SIGN = "⚠"
STYLESHEET = "/ui/static/ui.css"
# What holds a rollout (`core.gates.Gate`), in words.
GATE_WORDS: Mapping[str, str] = {
    Gate.DELIVERING.value: "some of the wave's clusters have not reported the new revision yet",
    Gate.UNREACHED.value: "more of the wave's clusters are unreached than the strategy "
                          "tolerates",
    Gate.BAKE.value: "every cluster of the wave reported: the bake time runs",
    Gate.ERROR_PHASES.value: "clusters of the wave report Error at the new revision",
    Gate.NEW_VIOLATIONS.value: "the new revision would deny objects already running",
    Gate.DENIALS.value: "admission denied requests under the new revision",
    Gate.WARNINGS.value: "admission warned about requests under the new revision",
    Gate.APPROVAL.value: "the wave waits for an approval (convergerd rollout approve)",
    Gate.PAUSED.value: "paused by a command (convergerd rollout resume)",
    Gate.HALTED.value: "a gate failed and the strategy says pause (convergerd rollout resume "
                       "or abort)",
    Gate.DONE.value: "done",
}
# Where a wave of a rollout in force is (`api.rollouts.wave_progress`), in words.
PROGRESS_WORDS: Mapping[str, str] = {
    "done": "done", "current": "current", "waiting": "waiting",
    "sent_back": "sent back (its clusters returned to their previous revision)",
    "not_reached": "not reached (the rollout ended before it)",
}
# The live rollouts a page lists (the others counted).
ROLLOUTS_LISTED = 100


def h(value: object) -> str:
    """`value` as HTML text or an attribute's value (None: nothing)."""
    return "" if value is None else html.escape(str(value), quote=True)


def url(path: str, **query: object) -> str:
    """`path` with `query` (the None values left out), escaped for an attribute."""
    pairs = {k: str(v) for k, v in query.items() if v is not None}
    return h(path + ("?" + urllib.parse.urlencode(pairs) if pairs else ""))


def seg(value: str) -> str:
    """One path segment."""
    return urllib.parse.quote(value, safe="")


def lag_text(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def reached_text(reachable: bool | None) -> str:
    return "yes" if reachable is True else "NO" if reachable is False else "not checked yet"


def plain_reason(reason: str | None) -> str:
    if not reason:
        return ""
    return PLAIN_REASONS.get(reason, reason)


@dataclass(frozen=True, slots=True)
class Viewer:
    """Who the page is shown to: how to name them (never the token) and their home page."""

    label: str
    home: str


@dataclass(frozen=True, slots=True)
class Cell:
    """One policy on one cluster, as a grid cell (None phase: nothing read there)."""

    phase: str | None
    verification: str
    violations: int | None
    held: bool  # a record of it there at all


def cell_of(view: Mapping[str, Any] | None) -> Cell:
    """A cell from `status.views.record_view`'s view (None: no record there)."""
    if view is None:
        return Cell(None, UNKNOWN_VERIFICATION, None, held=False)
    phase = view["phase"]
    if phase is not None and view["stale"]:
        phase = STALE
    verified = view["verified"]
    audit = view["audit"]
    return Cell(phase, verified["verification"] if verified else UNKNOWN_VERIFICATION,
                audit["violations"] if audit else None, held=True)


@dataclass(frozen=True, slots=True)
class Row:
    """A cluster of the grid: how it is reached, and its cells in the columns' order."""

    cluster: str
    reachable: bool | None
    lag_s: float | None
    failure: str | None  # a reason slug
    cells: Sequence[Cell]


@dataclass(frozen=True, slots=True)
class Pager:
    """Where the other pages are: `links` (label, href) already built."""

    text: str
    links: Sequence[tuple[str, str]]


@dataclass(frozen=True, slots=True)
class Grid:
    """Policies by clusters: `policies` the columns, `rows` the clusters of this page."""

    caption: str
    policies: Sequence[str]
    rows: Sequence[Row]
    pager: Pager


# ---------------------------------------------------------------------------------------------
# The frame


def document(title: str, body: str, *, viewer: Viewer | None = None,
             read_at: str | None = None) -> str:
    """A whole page: head, the signed-in bar, `body`, when its data was read."""
    bar = ""
    if viewer is not None:
        bar = (f'<nav aria-label="session"><a href="{h(viewer.home)}">Home</a> '
               f"<span>signed in with the {h(viewer.label)}</span> "
               '<form method="post" action="/ui/logout"><button type="submit">Sign out'
               "</button></form></nav>")
    foot = (f'<footer><p>Data read at <time datetime="{h(read_at)}">{h(read_at)}</time>. '
            "Reload the page for newer data.</p></footer>" if read_at else "")
    return ("<!DOCTYPE html>\n"
            '<html lang="en"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{h(title)} · convergerd</title>"
            f'<link rel="stylesheet" href="{STYLESHEET}"></head>'
            f'<body><header><p class="brand">convergerd</p>{bar}</header>'
            f"<main><h1>{h(title)}</h1>{body}</main>{foot}</body></html>\n")


def login_page(message: str | None = None, *, next_page: str | None = None) -> str:
    """The sign-in form; `next_page`: where to go once signed in (the page asked for)."""
    note = f'<p class="problem" role="alert">{h(message)}</p>' if message else ""
    then = (f'<input type="hidden" name="next" value="{h(next_page)}">'
            if next_page and next_page != "/ui/" else "")
    body = (f"{note}<p>Type the token your platform admin gave you: a boundary's read token "
            "(<code>cvg_b_…</code>) shows that boundary's policies and clusters; the admin "
            "token shows the fleet. It is kept in a cookie of this browser until you sign "
            "out or close it, never in an address.</p>"
            '<form method="post" action="/ui/login">'
            '<label for="token">Token</label> '
            '<input id="token" name="token" type="password" autocomplete="off" required '
            f'maxlength="1000">{then} <button type="submit">Sign in</button></form>')
    return document("Sign in", body)


def message_page(title: str, text: str, viewer: Viewer | None = None) -> str:
    """A page that is only a sentence: not found, too many reads, the database is down."""
    return document(title, f"<p>{h(text)}</p>", viewer=viewer)


def not_found_policy(pid: str, viewer: Viewer | None) -> str:
    """The one answer for a policy that does not exist and another boundary's: the same."""
    return message_page("Not found", f"There is no policy {pid!r} that you can see.", viewer)


def not_found_rollout(pid: str, viewer: Viewer | None) -> str:
    """The one answer for a policy without a rollout, one that does not exist and another
    boundary's: the same."""
    return message_page("Not found", f"There is no rollout of policy {pid!r} that you can "
                                     "see.", viewer)


def not_found_boundary(boundary: str, viewer: Viewer | None) -> str:
    return message_page("Not found", f"There is no boundary {boundary!r} that you can see.",
                        viewer)


# ---------------------------------------------------------------------------------------------
# Parts


def _table(caption: str, headers: Sequence[str], rows: Iterable[Sequence[str]],
           *, css: str = "") -> str:
    """A table; `rows`' cells are HTML already (escaped by the caller), the first a row
    header."""
    head = "".join(f'<th scope="col">{h(x)}</th>' for x in headers)
    body = "".join("<tr>" + f'<th scope="row">{r[0]}</th>' + "".join(f"<td>{c}</td>"
                                                                        for c in r[1:])
                   + "</tr>" for r in rows)
    if not body:
        body = f'<tr><td colspan="{len(headers)}">none</td></tr>'
    cls = f' class="{h(css)}"' if css else ""
    return (f"<table{cls}><caption>{h(caption)}</caption><thead><tr>{head}</tr></thead>"
            f"<tbody>{body}</tbody></table>")


def _pager(pager: Pager) -> str:
    links = " ".join(f'<a href="{href}">{h(label)}</a>' for label, href in pager.links)
    return f'<p class="pager">{h(pager.text)} {links}</p>'


def _counts(counts: Mapping[str, Any]) -> str:
    if not counts:
        return "none"
    return ", ".join(f"{h(k)}: {h(v)}" for k, v in counts.items())


def _cell(cell: Cell) -> str:
    if not cell.held:
        return '<td class="ph ph-none">—</td>'
    phase = cell.phase or "no reading"
    sign, words = VERIFICATION_SIGNS.get(cell.verification, ("?", cell.verification))
    violations = ""
    if cell.violations:
        violations = (f' <span class="viol" title="violations">{h(cell.violations)}'
                      f"{VIOLATIONS_SIGN}</span>")
    css = "ph-" + (cell.phase or "unknown").lower()
    return (f'<td class="ph {h(css)}">{h(phase)} '
            f'<abbr class="ver ver-{h(cell.verification)}" title="{h(words)}">{h(sign)}</abbr>'
            f"{violations}</td>")


def _legend() -> str:
    items = "".join(f"<li><b>{h(sign)}</b> {h(words)}</li>"
                    for sign, words in VERIFICATION_SIGNS.values())
    return ('<details class="legend"><summary>How to read the grid</summary><ul>'
            "<li>Each cell is one policy on one cluster: the phase the in-cluster operator "
            "reported (Enforcing, Inert: disabled, Unsupported: Kubernetes without "
            "ValidatingAdmissionPolicy, Error, Stale: not read back lately), then the "
            "verdict of its enforcement probe:</li>"
            f"{items}<li><b>n{VIOLATIONS_SIGN}</b> objects already running that the policy "
            "would deny (the operator's audit)</li><li><b>—</b> the policy is not on this "
            "cluster</li></ul></details>")


def grid(g: Grid, policy_href: Mapping[str, str]) -> str:
    head = "".join(f'<th scope="col"><a href="{policy_href[p]}">{h(p)}</a></th>'
                   for p in g.policies)
    rows = []
    for r in g.rows:
        failure = (f' <span class="problem">{h(plain_reason(r.failure))}</span>'
                   if r.failure else "")
        reached = reached_text(r.reachable)
        css = ' class="unreached"' if r.reachable is False else ""
        rows.append(f'<tr{css}><th scope="row">{h(r.cluster)}{failure}</th>'
                    f"<td>{h(reached)}</td><td>{h(lag_text(r.lag_s))}</td>"
                    + "".join(_cell(c) for c in r.cells) + "</tr>")
    body = "".join(rows) or f'<tr><td colspan="{3 + len(g.policies)}">no clusters</td></tr>'
    return (f'<div class="scroll"><table class="grid"><caption>{h(g.caption)}</caption>'
            '<thead><tr><th scope="col">Cluster</th><th scope="col">Reached</th>'
            f'<th scope="col">Lag</th>{head}</tr></thead><tbody>{body}</tbody></table></div>'
            f"{_pager(g.pager)}{_legend()}")


def unreached_table(rows: Sequence[Mapping[str, Any]], total: int) -> str:
    shown = f"{len(rows)} of {total}" if total > len(rows) else f"{total}"
    return _table(f"Unreached clusters ({shown}) and how long since each fully converged",
                  ("Cluster", "Lag", "Why"),
                  ([h(r["id"]), h(lag_text(r.get("lag_seconds"))),
                    h(r.get("why") or "")] for r in rows))


def unsupported_table(rollup: Mapping[str, Sequence[str]], total: int | None = None) -> str:
    named = sum(len(c) for c in rollup.values())
    caption = "Unsupported clusters (no ValidatingAdmissionPolicy), by Kubernetes version"
    if total is not None and total > named:
        caption += f": {named} of {total} named"
    return _table(caption, ("Kubernetes version", "Clusters"),
                  ([h(v), h(", ".join(cs))] for v, cs in rollup.items()))


# ---------------------------------------------------------------------------------------------
# Pages


def fleet_page(viewer: Viewer, head: Mapping[str, Any], g: Grid,
               unreached: Sequence[Mapping[str, Any]], read_at: str | None) -> str:
    """The admin's page: the fleet's counts (`/status`'s head), the unreached clusters, the
    Unsupported ones, the invalid policies and the grid."""
    fleet = head.get("fleet", {})
    last = head.get("last_round") or {}
    leader = head.get("leader") or {}
    facts = _table("The fleet", ("What", "Value"), [
        ["Clusters", h(_counts(fleet))],
        ["Leader", h(leader.get("holder") or "none seen")],
        ["Last round", h(f"{last.get('result') or '-'} (finished {last.get('finished_at')})"
                         if last else "none yet")],
        ["Next round", h(head.get("next_round_at") or "-")],
        ["Pending deletions", h((head.get("pending_deletions") or {}).get("count", 0))],
    ])
    invalid = _table("Invalid policies (never written to a cluster)", ("Policy", "Why"),
                     ([h(p["id"]), h(p["reason"])] for p in head.get("invalid_policies", [])))
    hrefs = {p: url(f"/ui/policies/{seg(p)}") for p in g.policies}
    body = (facts + unreached_table(unreached, int(fleet.get("unreached", len(unreached))))
            + unsupported_table(head.get("unsupported_by_version", {}),
                                fleet.get("unsupported"))
            + invalid + rollouts_table(head.get("rollouts", []))
            + "<h2>Policies by cluster</h2>" + grid(g, hrefs))
    return document("Fleet", body, viewer=viewer, read_at=read_at)


def boundary_page(viewer: Viewer, doc: Mapping[str, Any], *,
                  policies: Sequence[Mapping[str, Any]], g: Grid,
                  unreached: Sequence[Mapping[str, Any]], total_unreached: int) -> str:
    """One boundary: its policies' roll-up (those of this page of columns), the grid, its
    unreached and Unsupported clusters (`doc`: the boundary view)."""
    rows = []
    for p in policies:
        audit = p["audit"]
        state = ("deletion pending" if p["deletion_requested_at"]
                 else "invalid: " + p["invalid"] if p["invalid"]
                 else "enabled" if p["enabled"] else "disabled")
        rows.append([f'<a href="{url("/ui/policies/" + seg(p["id"]))}">{h(p["id"])}</a>',
                     h(p["rule_type"]), h(p["revision"]), h(state),
                     h(_counts(p["phases"])), h(_counts(p["verification"])),
                     h(f"{p['in_sync']} of {p['clusters']}"), h(audit["violations"])])
    total = doc["policies_total"]
    caption = (f"Policies ({len(policies)} of {total} on this page)" if total > len(policies)
               else f"Policies ({total})")
    summary = _table(caption, ("Policy", "Rule", "Revision", "State", "Phases (clusters)",
                               "Verified (clusters)", "Revision delivered", "Violations"),
                     rows)
    hrefs = {p: url(f"/ui/policies/{seg(p)}") for p in g.policies}
    body = (summary + rollouts_table(doc.get("rollouts", []))
            + unreached_table(unreached, total_unreached)
            + unsupported_table(doc["unsupported_by_version"])
            + "<h2>Policies by cluster</h2>" + grid(g, hrefs))
    return document(f"Boundary {doc['boundary']}", body, viewer=viewer, read_at=doc["now"])


def policy_page(viewer: Viewer, view: Mapping[str, Any], *,
                clusters: Sequence[Mapping[str, Any]], counts: Mapping[str, Mapping[str, int]],
                unsupported: Mapping[str, Sequence[str]], pager: Pager,
                boundary_href: str | None, read_at: str | None,
                rollout: Mapping[str, Any] | None = None) -> str:
    """One policy: what it is, its phases and verdicts counted over every cluster, the audit
    and its sample, the Unsupported clusters by version, then per cluster (this page of
    them): revisions, phase, Verified, audit, the last error in plain words; `rollout`: its
    live rollout as `/status` lists it (None: none live)."""
    p = view["policy"]
    boundary = (f'<a href="{h(boundary_href)}">{h(p["boundary"])}</a>' if boundary_href
                else h(p["boundary"]))
    deletion = p.get("deletion")
    facts = _table("The policy", ("What", "Value"), [
        ["Boundary", boundary],
        ["Rule", h(p["rule_type"])],
        ["Revision", h(p["revision"])],
        ["Enabled", h("yes" if p["enabled"] else "no (Inert: installed, not bound)")],
        ["Written to clusters", h("yes" if p["delivered_to_clusters"] else "no")],
        ["Invalid", h(p["invalid"] or "no")],
        ["Deletion", h(f"pending since {deletion['requested_at']}" if deletion else "no")],
        ["Rollout", _rollout_link(p["id"], rollout)],
    ])
    tallies = _table("Over all its clusters", ("Counted", "Clusters"),
                     ([h(name), h(_counts(c))] for name, c in counts.items()))
    audit = view["audit"]
    audit_text = (f"{audit['violations']} objects already running would be denied, on "
                  f"{audit['clusters_with_violations']} of {audit['clusters_audited']} "
                  f"clusters audited ({audit['clusters_unknown']} unknown, "
                  f"{audit['clusters_not_current']} not current).")
    sample = _table("A sample of them", ("Cluster", "Object", "Why it would be denied"),
                    ([h(s["cluster"]), h(f"{s['kind']} {s['namespace']}/{s['name']}"),
                      h(s["message"])] for s in audit["sample"]))
    rows = [_cluster_row(c) for c in clusters]
    per_cluster = _table("Per cluster", ("Cluster", "Revision (delivered / current)",
                                         "Phase", "Verified", "Violations",
                                         "Last error"), rows, css="clusters")
    body = (facts + tallies + "<h2>Audit</h2>" + f"<p>{h(audit_text)}</p>" + sample
            + unsupported_table(unsupported) + "<h2>Clusters</h2>" + per_cluster
            + _pager(pager))
    return document(f"Policy {p['id']}", body, viewer=viewer, read_at=read_at)


def _cluster_row(c: Mapping[str, Any]) -> list[str]:
    cell = cell_of(c)
    phase = cell.phase or "no reading"
    ready = ""
    if c.get("ready_reason") or c.get("ready_message"):
        ready = (f'<br><span class="detail">Ready: {h(c.get("ready_reason"))} '
                 f'{h(c.get("ready_message"))}</span>')
    sign, words = VERIFICATION_SIGNS.get(cell.verification, ("?", cell.verification))
    verified = c.get("verified") or {}
    probe = (f'<br><span class="detail">{h(verified.get("reason"))} '
             f'{h(verified.get("message"))}</span>' if verified.get("message") else "")
    error = ""
    if c.get("last_error") or c.get("last_reason"):
        error = (f'{h(plain_reason(c.get("last_reason")))}<br><span class="detail">'
                 f'{h(c.get("last_error"))}</span>')
    if c.get("cluster_reachable") is False:
        error = "the cluster is not reached now" + ("<br>" + error if error else "")
    revision = f"{c['delivered_revision'] if c['delivered_revision'] is not None else '-'}"
    revision += f" / {c['current_revision']}"
    if not c["in_scope"]:
        revision += " (not in scope)"
    violations = "-" if cell.violations is None else str(cell.violations)
    css = "ph-" + (cell.phase or "unknown").lower()
    return [h(c["cluster"]), h(revision),
            f'<span class="ph {h(css)}">{h(phase)}</span>{ready}',
            f"{h(sign)} {h(words)}{probe}", h(violations), error]


# ---------------------------------------------------------------------------------------------
# Rollouts


def rollout_href(pid: str) -> str:
    return url(f"/ui/policies/{seg(pid)}/rollout")


def _wave_at(wave: Mapping[str, Any]) -> str:
    return f"{int(wave['index']) + 1} of {wave['of']}: {wave['name']}" + (
        " (Warn step)" if wave.get("warn_step") else "")


def _state_text(state: str) -> str:
    return state.replace("_", " ")


def _gate_text(gate: str | None, reason: str | None) -> str:
    """The gate that holds a rollout in words, and its reason (`gate: detail`) under it."""
    if gate is None and not reason:
        return "-"
    head = (f'<span class="gate">{h(gate)}</span>: {h(GATE_WORDS.get(gate, gate))}'
            if gate is not None else "")
    tail = f'<span class="detail">{h(reason)}</span>' if reason else ""
    return head + ("<br>" if head and tail else "") + tail


def _rollout_link(pid: str, rollout: Mapping[str, Any] | None) -> str:
    if rollout is None:
        return (f'none in progress (<a href="{rollout_href(pid)}">its latest rollout</a>, if it '
                "had one)")
    return (f'<a href="{rollout_href(pid)}">{h(_state_text(rollout["state"]))}, wave '
            f"{h(_wave_at(rollout['wave']))}</a>")


def rollouts_table(rollouts: Sequence[Mapping[str, Any]]) -> str:
    """The live rollouts (as `/status` lists them: as of the last database sync), at most
    `ROLLOUTS_LISTED`, each linking to its page."""
    listed = rollouts[:ROLLOUTS_LISTED]
    shown = (f"{len(listed)} of {len(rollouts)}" if len(rollouts) > len(listed)
             else f"{len(rollouts)}")
    rows = ([f'<a href="{rollout_href(r["policy"])}">{h(r["policy"])}</a>',
             h(f"{r['from_revision'] if r['from_revision'] is not None else 'none'} → "
               f"{r['to_revision']}"),
             h(_state_text(r["state"])), h(_wave_at(r["wave"])),
             h(f"{r['clusters']['new']} new, {r['clusters']['old']} old"),
             _gate_text(r.get("gate"), r.get("reason"))] for r in listed)
    return ("<h2>Rollouts</h2>"
            + _table(f"Live rollouts ({shown}), as of the last database sync",
                     ("Policy", "Revision", "State", "Wave", "Clusters", "Held by"), rows,
                     css="rollouts"))


def _chosen(wave: Mapping[str, Any]) -> str:
    selector = wave.get("selector")
    if selector:
        return "labels " + ", ".join(f"{k}={v}" for k, v in selector.items())
    return (f"by share: {float(wave['fraction']):.0%} of the clusters no selector chose, "
            "by the end of this wave")


def _bake(wave: Mapping[str, Any], bake_s: float) -> str:
    bake = lag_text(bake_s)
    return f"{bake} in Warn, then {bake}" if wave.get("warn_first") else bake


def _held(revisions: Sequence[Mapping[str, Any]], to_revision: int) -> str:
    """Which clusters of a wave hold which revision: counts, the first names, the rest
    counted."""
    items = []
    for r in revisions:
        revision = r["revision"]
        what = ("no copy" if revision is None
                else f"revision {revision}" + (" (new)" if revision == to_revision else ""))
        named: Sequence[str] = r.get("named") or []
        more = int(r["clusters"]) - len(named)
        names = ", ".join(named) + (f" and {more} more" if more > 0 else "")
        items.append(f'<li><b>{h(what)}</b>: {h(r["clusters"])} '
                     f'<span class="detail">({h(names)})</span></li>')
    return f'<ul class="held">{"".join(items)}</ul>' if items else "none"


def rollout_page(viewer: Viewer, doc: Mapping[str, Any], *, read_at: str | None) -> str:
    """A policy's rollout (`RolloutHandlers.document`): where it is and what holds it, each
    wave (how its clusters are chosen, the bake, approval, done/current/waiting, which of its
    clusters hold which revision, bounded), and its events."""
    pid = doc["policy"]
    wave = doc["wave"]
    now = doc.get("now")
    clusters = doc.get("clusters")
    rows = [
        ["Policy", f'<a href="{url("/ui/policies/" + seg(pid))}">{h(pid)}</a>'],
        ["Revision", h(f"{doc['from_revision'] if doc['from_revision'] is not None else 'none'}"
                       f" → {doc['to_revision']}")],
        ["Strategy", h(doc["strategy"])],
        ["State", h(_state_text(doc["state"]) + ("" if doc["in_force"] else
                                                 " (ended: later saves decide what each "
                                                 "cluster holds)"))],
        ["Wave", h(_wave_at(wave))],
        ["Held by", _gate_text(doc.get("gate"), doc.get("reason"))],
    ]
    if isinstance(now, Mapping):
        rows.append(["Now", _gate_text(now.get("gate"), now.get("detail"))])
    if isinstance(clusters, Mapping):
        rows.append(["Clusters", h(f"{clusters['new']} report the new revision, "
                                   f"{clusters['old']} another, {clusters['none']} none")])
    if "bake_seconds" in doc:
        rows.append(["Bake, on a halt", h(f"{lag_text(doc['bake_seconds'])} per wave; "
                                          f"{doc['on_halt']}")])
    rows.append(["Last change", h(f"{doc['updated_at']} by {doc['updated_by']}")])
    facts = _table("The rollout", ("What", "Value"), rows)
    waves = doc.get("waves")
    body = facts
    if isinstance(waves, list):
        to = doc["to_revision"]
        body += "<h2>Waves</h2>" + _table(
            "Waves: how each chooses its clusters, and which revision they hold",
            ("Wave", "Clusters chosen by", "Bake", "Approval", "State", "Clusters",
             "Revisions held"),
            ([h(f"{int(w['index']) + 1} {w['name']}"), h(_chosen(w)),
              h(_bake(w, float(doc["bake_seconds"]))),
              h("needed" if w["approval"] else "-"),
              h(PROGRESS_WORDS.get(w["progress"], w["progress"])
                + (f": {_state_text(doc['state'])}" if w["progress"] == "current" else "")),
              h(w["clusters"]), _held(w["revisions"], to)] for w in waves),
            css="waves")
    else:
        body += ("<p>This rollout has ended: its waves no longer decide what each cluster "
                 "holds (the policy's page shows what each holds).</p>")
    events = _table("Events (the latest)", ("At", "By", "What", "Wave", "Detail"),
                    ([h(e["at"]), h(e["by"]), h(e["what"]),
                      h(int(e["wave"]) + 1 if e["wave"] is not None else "-"), h(e["detail"])]
                     for e in doc.get("events", [])), css="events")
    return document(f"Rollout of policy {pid}", body + "<h2>Events</h2>" + events,
                    viewer=viewer, read_at=read_at)
