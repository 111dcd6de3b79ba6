"""`convergerd policy history ID` and `convergerd policy rollback ID --to REV [--now]`, through
a running daemon's API.

`history` lists the policy's kept revisions, newest first: the revision, when and by whom it
was saved (`alice@host (rollback to 3)`, `convergerd import`, a database role for a plain SQL
write such as `portal (SQL)`), and what changed from the revision before (`rule: registries`,
`enabled: true → false`, `created`, `deleted`). `GET /v1/policies/{id}/revisions`; with
`--boundary B`, that boundary's view (`GET /v1/boundaries/{B}/policies/{id}/revisions`, with
its read token). The token: `--token-file`, else the admin token (`CONVERGERD_API_TOKEN`,
`CONVERGERD_API_TOKEN_FILE`) when one is set, else none (the fleet views are open unless the
daemon sets CONVERGERD_FLEET_READS_NEED_TOKEN).

`rollback` writes the content of revision REV as the policy's new revision (a deleted policy is
created again) and saves it like `policy apply`: through the policy's rollout strategy when it
has one, else (or with `--now`) to every cluster in scope at once
(`POST /v1/policies/{id}/rollback`, the admin token); who asked is recorded as `--by` (default
user@host). Refused, writing nothing: a revision not kept, one that is a deletion, one whose
content is not a valid policy now, a policy whose deletion has begun.

Exit codes: 0 done (a rollback's save `ok`); 1 a rollback refused, or its save `partial`;
2 usage, connection or authentication errors.
"""

from __future__ import annotations

import argparse
import os
import sys
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

from convergerd.cli.policy import (
    EXIT_OK,
    Answer,
    Failed,
    add_daemon_arguments,
    answered,
    api_token,
    call,
    cell,
    exit_code,
    optional_api_token,
    render,
)
from convergerd.cli.status import table
from convergerd.cli.token import who
from convergerd.config import read_secret_file
from convergerd.core.errors import ConfigError
from convergerd.core.model import check_boundary_id, check_policy_id

_REFUSED = frozenset({404, 409, 422})
_CHANGE_CELL = 120


def add_arguments(sub: Any) -> None:
    """Adds `history` and `rollback` to the `policy` command's subcommands (`sub`)."""
    history = sub.add_parser("history", help="a policy's kept revisions: when, by whom, what "
                             "changed")
    history.add_argument("--limit", type=int, default=20,
                         help="revisions listed (newest first; default 20, at most 100)")
    history.add_argument("--before", type=int, metavar="REV",
                         help="only revisions older than REV (the next page)")
    history.add_argument("--boundary", metavar="B",
                         help="that boundary's view of it (with its read token)")
    history.add_argument("--token-file", type=Path, metavar="PATH",
                         help="file holding the bearer token to send (a boundary's read token "
                              "or the admin token) [default: the admin token when set]")
    rollback = sub.add_parser(
        "rollback", help="a new revision with an old revision's content, saved to every "
        "cluster at once")
    rollback.add_argument("--to", type=int, required=True, metavar="REV",
                          help="the revision whose content to restore (`policy history`)")
    rollback.add_argument("--now", action="store_true",
                          help="skip the policy's rollout strategy: every cluster at once "
                               "(an emergency; a rollout in progress is ended)")
    rollback.add_argument("--by", help="who asks, recorded with the revision (default: "
                          "user@host)")
    rollback.add_argument("--api-token-file", type=Path, metavar="PATH",
                          help="file holding the admin token [default: CONVERGERD_API_TOKEN, "
                               "else the file in CONVERGERD_API_TOKEN_FILE]")
    for action in (history, rollback):
        action.add_argument("id", help="the policy id")
        add_daemon_arguments(action)


def _read_token(args: argparse.Namespace, env: Mapping[str, str]) -> str | None:
    if args.token_file is not None:
        try:
            return read_secret_file("--token-file", args.token_file)
        except ConfigError as exc:
            raise Failed(str(exc)) from None
    return optional_api_token(None, env)


def history_path(args: argparse.Namespace) -> str:
    query = {"limit": args.limit} | ({"before": args.before} if args.before else {})
    base = (f"/v1/boundaries/{args.boundary}/policies/{args.id}" if args.boundary
            else f"/v1/policies/{args.id}")
    return f"{base}/revisions?{urllib.parse.urlencode(query)}"


def render_history(body: Mapping[str, Any]) -> str:
    """The history as a table, newest first, with the next page's flag when there is one."""
    revisions = body.get("revisions")
    rows = [["REVISION", "SAVED AT", "BY", "WHAT CHANGED"]]
    for r in revisions if isinstance(revisions, list) else ():
        if not isinstance(r, Mapping):
            continue
        changed = r.get("what_changed")
        summary = changed.get("summary") if isinstance(changed, Mapping) else None
        rows.append([cell(r.get("revision")), cell(r.get("saved_at")),
                     cell(r.get("saved_by"), 60), cell(summary, _CHANGE_CELL)])
    retention = body.get("retention")
    kept = retention.get("keep_last") if isinstance(retention, Mapping) else None
    lines = [f"policy {cell(body.get('policy'))} (boundary {cell(body.get('boundary'))}): "
             f"{len(rows) - 1} revision(s) listed, the last {cell(kept)} of each policy kept"]
    if len(rows) > 1:
        lines.append("")
        lines.extend(table(rows))
    listing = body.get("listing")
    if isinstance(listing, Mapping) and listing.get("next") and len(rows) > 1:
        lines.append("")
        lines.append(f"older revisions: --before {rows[-1][0]}")
    return "\n".join(lines) + "\n"


def render_rollback(answer: Answer) -> str:
    body = answer.body
    to, revision = cell(body.get("rolled_back_to")), cell(body.get("revision"))
    head = (f"policy {cell(body.get('policy'))}: revision {to}'s content is revision "
            f"{revision} now" if body.get("changed") else
            f"policy {cell(body.get('policy'))} already had revision {to}'s content "
            f"(revision {revision}): saved again")
    return head + "\n" + render(answer)


def _request(args: argparse.Namespace, env: Mapping[str, str]) -> Answer:
    check_policy_id(args.id)
    timeout_s = float(args.timeout)
    if args.policy_command == "history":
        if args.boundary is not None:
            check_boundary_id(args.boundary)
        return call(args.addr, "GET", history_path(args), token=_read_token(args, env),
                    body=None, timeout_s=timeout_s)
    body: dict[str, Any] = {"to": args.to, "by": who(args.by)}
    if args.now:
        body["now"] = True
    return call(args.addr, "POST", f"/v1/policies/{args.id}/rollback",
                token=api_token(args.api_token_file, env), body=body, timeout_s=timeout_s)


def run(args: argparse.Namespace, *, env: Mapping[str, str] | None = None,
        out: TextIO | None = None, err: TextIO | None = None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    action: str = args.policy_command
    answer = answered(f"policy {action}",
                      lambda: _request(args, os.environ if env is None else env),
                      as_json=args.json, refused=_REFUSED, out=out, err=err)
    if isinstance(answer, int):
        return answer
    if not args.json:
        out.write(render_history(answer.body) if action == "history"
                  else render_rollback(answer))
    return EXIT_OK if action == "history" else exit_code(answer)
