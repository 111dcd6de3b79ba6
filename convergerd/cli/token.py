"""`convergerd token create --boundary B --name N [--expires TIME]`, `token list`,
`token revoke N`: a boundary's read tokens, through a running daemon's API (`/v1/tokens`, the
admin token: `--api-token-file`, else `CONVERGERD_API_TOKEN`, else `CONVERGERD_API_TOKEN_FILE`).

`create` prints the token's record, then the token alone on the last line of stdout; it is
shown this once (only its SHA-256 is kept), so hand it to the tenant now. The tenant reads its
boundary with it: `convergerd status --boundary B --token-file FILE`, or
`GET /v1/boundaries/B` with `Authorization: Bearer <token>`. TIME is ISO 8601: a date
(`2027-01-31`: the token stops working when that day begins, UTC) or a time with its offset
(`2027-01-31T12:00:00Z`). Who asked is recorded as `--by` (default: user@host).

Exit codes: 0 done; 1 refused (a name taken, an unknown boundary, no such token to revoke);
2 usage, connection or authentication errors.
"""

from __future__ import annotations

import argparse
import getpass
import os
import socket
import sys
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
)
from convergerd.cli.status import table
from convergerd.core.report import utc_now
from convergerd.core.tokens import check_boundary, check_token_name, parse_time

_REFUSED = frozenset({404, 409, 422})


def add_arguments(sub: Any) -> None:
    """Adds `create`, `list` and `revoke` to the `token` command's subcommands (`sub`)."""
    create = sub.add_parser("create", help="create a read token for one boundary (printed "
                            "once, alone on the last line)")
    create.add_argument("--boundary", required=True, help="the boundary it reads")
    create.add_argument("--name", required=True, help="its name (a DNS label), to list and "
                        "revoke it by")
    create.add_argument("--expires", metavar="TIME",
                        help="ISO 8601 date or time with offset (default: never)")
    listing = sub.add_parser("list", help="the read tokens (never the tokens themselves)")
    listing.add_argument("--all", action="store_true", help="the revoked ones too")
    revoke = sub.add_parser("revoke", help="revoke a read token: it stops working at once")
    revoke.add_argument("name", help="the token's name")
    for action in (create, listing, revoke):
        action.add_argument("--api-token-file", type=Path, metavar="PATH",
                            help="file holding the admin token [default: "
                                 "CONVERGERD_API_TOKEN, else the file in "
                                 "CONVERGERD_API_TOKEN_FILE]")
        add_daemon_arguments(action, timeout_s=30, with_json=False)
    for action in (create, revoke):
        action.add_argument("--by", help="who asks, recorded with the change (default: "
                            "user@host)")


def who(given: str | None) -> str:
    """`--by`, or user@host: who asks, as the admin's client says it."""
    if given:
        return given
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def _request(args: argparse.Namespace, token: str) -> Answer:
    command: str = args.token_command
    timeout_s = float(args.timeout)
    if command == "create":
        body: dict[str, Any] = {"boundary": check_boundary(args.boundary),
                                "name": check_token_name(args.name), "by": who(args.by)}
        if args.expires is not None:
            parse_time(args.expires, now=utc_now())  # said here, before asking
            body["expires_at"] = args.expires
        return call(args.addr, "POST", "/v1/tokens", token=token, body=body,
                    timeout_s=timeout_s)
    if command == "list":
        path = "/v1/tokens?revoked=true" if args.all else "/v1/tokens"
        return call(args.addr, "GET", path, token=token, body=None, timeout_s=timeout_s)
    name = check_token_name(args.name)
    return call(args.addr, "DELETE", f"/v1/tokens/{name}", token=token,
                body={"by": who(args.by)}, timeout_s=timeout_s)


def render_record(record: Mapping[str, Any]) -> list[str]:
    return [f"name: {cell(record.get('name'))}", f"boundary: {cell(record.get('boundary'))}",
            f"created: {cell(record.get('created_at'))} by {cell(record.get('created_by'))}",
            f"expires: {cell(record.get('expires_at')) if record.get('expires_at') else 'never'}"]


def render_list(tokens: list[Any]) -> str:
    rows = [["NAME", "BOUNDARY", "CREATED", "BY", "EXPIRES", "STATE"]]
    for t in tokens:
        if not isinstance(t, Mapping):
            continue
        state = ("revoked by " + cell(t.get("revoked_by"), 40) if t.get("revoked_at")
                 else "expired" if t.get("expired") else "live")
        rows.append([cell(t.get("name")), cell(t.get("boundary")), cell(t.get("created_at")),
                     cell(t.get("created_by"), 40), cell(t.get("expires_at")), state])
    if len(rows) == 1:
        return "no read tokens\n"
    return "\n".join(table(rows)) + "\n"


def run(args: argparse.Namespace, *, env: Mapping[str, str] | None = None,
        out: TextIO | None = None, err: TextIO | None = None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    command: str = args.token_command
    answer = answered(
        f"token {command}",
        lambda: _request(args, api_token(args.api_token_file,
                                         os.environ if env is None else env)),
        as_json=False, refused=_REFUSED, out=out, err=err, success=(200, 201))
    if isinstance(answer, int):
        return answer
    body = answer.body
    if command == "create":
        secret = body.get("token")
        if not isinstance(secret, str) or not secret.isprintable():
            err.write(f"convergerd token {command}: the daemon's answer has no token\n")
            return EXIT_USAGE
        out.write("\n".join(render_record(body)) + "\n")
        out.write("the token, shown this once (hand it to the tenant now):\n")
        out.write(secret + "\n")
    elif command == "list":
        out.write(render_list(body.get("tokens") or []))
    else:
        revoked = body.get("revoked") or {}
        out.write(f"revoked {cell(revoked.get('name'))} of boundary "
                  f"{cell(revoked.get('boundary'))} at {cell(revoked.get('revoked_at'))}\n")
    return EXIT_OK
