"""`convergerd policy except ID ...` and `convergerd policy exceptions [ID]`: grant an exception
to a policy through a running daemon (`POST /v1/policies/{id}/exceptions`, with the API token)
and list them with their expiry (`GET /v1/exceptions`, a fleet view: the API token is sent when
one is given, as a daemon with CONVERGERD_FLEET_READS_NEED_TOKEN asks).

    convergerd policy except regs --namespace team-a-web --selector app=legacy \\
        --reason "moving to the internal registry, TICKET-123" --expires 2027-01-31

`--expires` is ISO 8601: a date (that day's 00:00 UTC) or a time with its zone
(`2027-01-31T12:00:00Z`); the daemon refuses one in the past or further than
CONVERGERD_EXCEPTION_MAX_DAYS. `--name` and `--selector` (equality pairs `key=value,...`) are
exclusive; with neither, the whole namespace is excepted. Who asked and who approved are the
local user unless `--requested-by` / `--approved-by` say otherwise. The grant is saved to the
policy's clusters at once, and the per-cluster results are printed as `policy apply` prints
them. Exit codes as `policy apply`'s: 0 done everywhere, 1 some cluster failed or is pending,
2 refused or unreachable (the daemon's message says why).
"""

from __future__ import annotations

import argparse
import datetime as dt
import getpass
import os
import sys
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

from convergerd.cli.policy import (
    EXIT_OK,
    EXIT_USAGE,
    Answer,
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
from convergerd.core.exceptions import parse_exception, parse_expiry, selector_from_text
from convergerd.core.model import RuleError, check_policy_id


def add_arguments(sub: Any) -> None:
    """Adds `except` and `exceptions` to the `policy` command's subcommands (`sub`)."""
    grant = sub.add_parser("except", help="grant an exception to a policy, until it expires",
                           description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    grant.add_argument("id", help="the policy id")
    grant.add_argument("--namespace", required=True, help="the namespace excepted")
    which = grant.add_mutually_exclusive_group()
    which.add_argument("--name", help="only the object of this name in the namespace")
    which.add_argument("--selector", help="only the objects whose labels carry every "
                       "key=value pair (comma-separated)")
    grant.add_argument("--reason", required=True, help="why (a ticket, a plan)")
    grant.add_argument("--expires", required=True, metavar="TIME",
                       help="ISO 8601: 2027-01-31 (00:00 UTC) or 2027-01-31T12:00:00Z")
    grant.add_argument("--id", dest="exception_id", help="the exception's id (a DNS label; "
                       "default: one chosen by the daemon)")
    grant.add_argument("--requested-by", help="who asked (default: the local user)")
    grant.add_argument("--approved-by", help="who approved (default: the local user)")
    listing = sub.add_parser("exceptions", help="list the exceptions (of one policy), with "
                             "their expiry")
    listing.add_argument("id", nargs="?", help="only this policy's")
    for action in (grant, listing):
        action.add_argument("--api-token-file", type=Path, metavar="PATH",
                            help="file holding the API token [default: CONVERGERD_API_TOKEN, "
                                 "else the file in CONVERGERD_API_TOKEN_FILE; for the list, "
                                 "none when neither is set]")
        add_daemon_arguments(action)


def _user(env: Mapping[str, str]) -> str:
    try:
        return env.get("USER") or env.get("LOGNAME") or getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def grant_body(args: argparse.Namespace, env: Mapping[str, str]) -> dict[str, Any]:
    """The request body, checked here as the daemon checks it (the daemon also checks the
    expiry against its clock and maximum); `RuleError` naming the field and value."""
    expires = parse_expiry(args.expires, "--expires")
    body: dict[str, Any] = {
        "namespace": args.namespace, "reason": args.reason,
        "requestedBy": args.requested_by or _user(env),
        "approvedBy": args.approved_by or _user(env),
        "expiresAt": expires.strftime("%Y-%m-%dT%H:%M:%SZ")}
    if args.exception_id is not None:
        body["id"] = args.exception_id
    if args.name is not None:
        body["name"] = args.name
    if args.selector is not None:
        body["selector"] = selector_from_text(args.selector)
    parse_exception({"id": "check", **body}, "exception")
    return body


def _until(expires: object, now: dt.datetime) -> str:
    try:
        moment = parse_expiry(expires)
    except RuleError:
        return "-"
    seconds = (moment - now).total_seconds()
    if seconds <= 0:
        return "expired"
    if seconds >= 86400:
        return f"in {seconds / 86400:.0f}d"
    return f"in {seconds / 3600:.1f}h" if seconds >= 3600 else f"in {seconds / 60:.0f}m"


def render_list(body: Mapping[str, Any], now: dt.datetime) -> str:
    """The exceptions as a table, soonest expiry first (as the daemon sends them)."""
    found = body.get("exceptions")
    rows = [["POLICY", "ID", "NAMESPACE", "WHICH", "EXPIRES", "", "STATE", "APPROVED BY",
             "REASON"]]
    for e in found if isinstance(found, list) else []:
        if not isinstance(e, dict):
            continue
        selector = e.get("selector")
        labels = selector.get("matchLabels") if isinstance(selector, dict) else None
        which = (f"name={e['name']}" if e.get("name") else
                 ",".join(f"{k}={v}" for k, v in labels.items())
                 if isinstance(labels, dict) else "all")
        rows.append([cell(e.get("policy")), cell(e.get("id")), cell(e.get("namespace")),
                     cell(which, 40), cell(e.get("expiresAt")), _until(e.get("expiresAt"), now),
                     cell(e.get("state")), cell(e.get("approvedBy"), 30),
                     cell(e.get("reason"), 60)])
    if len(rows) == 1:
        return "no exceptions\n"
    return "".join(line + "\n" for line in table(rows))


def run(args: argparse.Namespace, *, env: Mapping[str, str] | None = None,
        out: TextIO | None = None, err: TextIO | None = None,
        now: dt.datetime | None = None) -> int:
    out, err = out or sys.stdout, err or sys.stderr
    env = os.environ if env is None else env
    action: str = args.policy_command
    try:
        if args.id is not None:
            check_policy_id(args.id)
        body = grant_body(args, env) if action == "except" else None
    except RuleError as exc:
        err.write(f"convergerd policy {action}: {exc}\n")
        return EXIT_USAGE

    def request() -> Answer:
        if action == "except":
            return call(args.addr, "POST", f"/v1/policies/{args.id}/exceptions",
                        token=api_token(args.api_token_file, env), body=body,
                        timeout_s=float(args.timeout))
        query = f"?{urllib.parse.urlencode({'policy': args.id})}" if args.id else ""
        return call(args.addr, "GET", f"/v1/exceptions{query}",
                    token=optional_api_token(args.api_token_file, env), body=None,
                    timeout_s=float(args.timeout))

    answer = answered(f"policy {action}", request, as_json=args.json, refused=(), out=out,
                      err=err, success=(200, 201))
    if isinstance(answer, int):
        return answer
    if action == "exceptions":
        if not args.json:
            out.write(render_list(answer.body, now or dt.datetime.now(dt.UTC)))
        return EXIT_OK
    return _granted(answer, out, quiet=args.json)


def _granted(answer: Answer, out: TextIO, *, quiet: bool) -> int:
    granted = answer.body.get("granted")
    save = answer.body.get("save")
    save_answer = Answer(200, save if isinstance(save, dict) else {})
    if not quiet and isinstance(granted, dict):
        out.write(f"exception {cell(granted.get('id'))} granted to policy "
                  f"{cell(answer.body.get('policy'))} (revision "
                  f"{cell(answer.body.get('revision'))}), until "
                  f"{cell(granted.get('expiresAt'))}\n")
        if "operation" in save_answer.body:
            out.write(render(save_answer))
    return exit_code(save_answer)
