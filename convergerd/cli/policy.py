"""`convergerd policy apply ID` and `convergerd policy delete ID`: ask a running daemon to save
or delete one policy now (`POST /v1/policies/{id}/apply`, `DELETE /v1/policies/{id}`) and print
the per-cluster result as a table (`--json`: the daemon's answer as is). `policy apply ID
--enforcement Warn` stores a new mode first (Deny, Warn or Audit; a new revision), then saves.
`convergerd policy eval` needs no daemon: it evaluates a policy on objects, a live cluster or a
recorded session (`policy eval --help`).

The bearer token comes from `--api-token-file`, else `CONVERGERD_API_TOKEN`, else
`CONVERGERD_API_TOKEN_FILE` (never from a flag holding the token itself: `ps` would show it).

Exit codes, for scripts:

- 0: done on every cluster (`status: ok`);
- 1: done but some cluster failed or is still pending (`partial`), or refused: a deletion
  some cluster did not confirm or a save of a policy being deleted (409), an invalid policy
  (422);
- 2: usage, connection or authentication errors: a bad id, no token, the daemon unreachable,
  and the answers 400, 401, 404 (no such policy), 413, 503 or any other.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from convergerd.cli.status import DEFAULT_ADDR, NoRedirects, table
from convergerd.config import SETTINGS_BY_KEY, read_secret_file
from convergerd.core.decode import bounded_json
from convergerd.core.errors import ConfigError, NotJSON
from convergerd.core.model import ENFORCEMENTS, RuleError, check_policy_id
from convergerd.core.shown import shown

EXIT_OK = 0
EXIT_NOT_DONE = 1
EXIT_USAGE = 2
# Commands with no partial outcome (rollout, token): the daemon refused (no such object, or not
# in a state the command applies to).
EXIT_REFUSED = EXIT_NOT_DONE
# Answers that say "the request was understood, the work is not (all) done".
_REFUSED = frozenset({409, 422})
_MAX_CELL = 80
_MAX_ANSWER_BYTES = 4 * 1024 * 1024


def add_arguments(sub: Any) -> None:
    """Adds `apply` and `delete` to the `policy` command's subcommands (`sub`)."""
    apply = sub.add_parser("apply", help="save a policy now: apply it to every cluster in scope")
    apply.add_argument("--allow-mass-removal", action="store_true",
                       help="remove it from the clusters that left its scope even when that "
                            "is most of them (the guard otherwise skips those removals)")
    apply.add_argument("--enforcement", choices=ENFORCEMENTS,
                       help="store this mode first (a new revision), then save: Deny rejects "
                            "what fails the rule, Warn admits it with a warning, Audit admits "
                            "it and records it in the API server's audit log [default: keep "
                            "the stored mode]")
    delete = sub.add_parser("delete", help="delete a policy from every cluster, then the "
                            "database (refused while some cluster still holds it)")
    for action in (apply, delete):
        action.add_argument("id", help="the policy id")
        action.add_argument("--api-token-file", type=Path, metavar="PATH",
                            help="file holding the API token [default: CONVERGERD_API_TOKEN, "
                                 "else the file in CONVERGERD_API_TOKEN_FILE]")
        add_daemon_arguments(action)


def add_daemon_arguments(action: Any, *, timeout_s: int = 60, with_json: bool = True) -> None:
    """`--addr`, `--timeout` and (`with_json`) `--json`: the flags of every subcommand that
    asks a running daemon (`action`, an argparse parser)."""
    action.add_argument("--addr", default=DEFAULT_ADDR,
                        help=f"the daemon's HTTP address (default {DEFAULT_ADDR})")
    action.add_argument("--timeout", type=float, default=float(timeout_s),
                        help=f"seconds to wait for the answer (default {timeout_s})")
    if with_json:
        action.add_argument("--json", action="store_true",
                            help="print the daemon's JSON answer as is")


class Failed(Exception):
    """An exit-2 error: the message says what to fix."""


@dataclass(frozen=True)
class Answer:
    status: int
    body: dict[str, Any]


def api_token(flag_file: Path | None, env: Mapping[str, str]) -> str:
    """The token: `--api-token-file`, `CONVERGERD_API_TOKEN`, `CONVERGERD_API_TOKEN_FILE`."""
    token_env = SETTINGS_BY_KEY["api_token"].env
    file_env = SETTINGS_BY_KEY["api_token_file"].env
    try:
        if flag_file is not None:
            return read_secret_file("--api-token-file", flag_file)
        if env.get(token_env):
            return env[token_env].strip()
        if env.get(file_env):
            return read_secret_file(file_env, Path(env[file_env]))
    except ConfigError as exc:
        raise Failed(str(exc)) from None
    raise Failed(f"no API token: set {token_env} or {file_env}, or give --api-token-file")


def optional_api_token(flag_file: Path | None, env: Mapping[str, str]) -> str | None:
    """For a read the daemon may serve without a token: None when no token is given at all
    (flag or either variable), else `api_token`'s — and a given token that cannot be read
    stops the command, never silently sends nothing."""
    given = flag_file is not None or any(
        env.get(SETTINGS_BY_KEY[key].env) for key in ("api_token", "api_token_file"))
    return api_token(flag_file, env) if given else None


def _base(addr: str) -> str:
    base = addr.rstrip("/")
    if "://" not in base:
        base = f"http://{base}"
    if not base.startswith(("http://", "https://")):
        raise Failed(f"{addr} is not an http(s) address")
    return base


def call(addr: str, method: str, path: str, *, token: str | None,
         body: dict[str, Any] | None, timeout_s: float) -> Answer:
    """One request (`token`: the bearer token, None: none sent); any HTTP answer with a JSON
    object body is an `Answer`. A redirect is an error naming its status and (shortened)
    `Location`, never followed: it would carry the token."""
    base = _base(addr)
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Accept": "application/json", "Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(  # noqa: S310 - the scheme is checked by _base
        base + path, data=data, method=method, headers=headers)
    try:
        opener = urllib.request.build_opener(NoRedirects)
        with opener.open(request, timeout=timeout_s) as response:
            status, raw = response.status, response.read(_MAX_ANSWER_BYTES)
    except urllib.error.HTTPError as exc:
        if 300 <= exc.code < 400:
            location = exc.headers.get("Location", "") if exc.headers else ""
            exc.close()
            raise Failed(f"{method} {base}{path} answered {exc.code}, a redirect to "
                         f"{shown(location, style='text')}: not followed (it would carry the "
                         "API token); give --addr the daemon's own address") from None
        status, raw = exc.code, exc.read(_MAX_ANSWER_BYTES)
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise Failed(f"cannot reach convergerd at {base} ({reason}); is the daemon running, "
                     "and is --addr its CONVERGERD_HTTP_ADDR?") from None
    try:
        doc = bounded_json(raw)
    except NotJSON:
        doc = None
    if not isinstance(doc, dict):
        raise Failed(f"{method} {base}{path} answered {status} without a JSON object")
    return Answer(status, doc)


# ---------------------------------------------------------------------------------------------
# Rendering (pure)


def cell(value: object, limit: int = _MAX_CELL) -> str:
    """A table cell from the daemon's answer: one line, printable, at most `limit` chars."""
    if value is None or value == "":
        return "-"
    return shown(value, limit, style="prose")


def daemon_answered(answer: Answer) -> str:
    """The error line for an answer that is not a success: its status and the daemon's error."""
    return f"the daemon answered {answer.status}: {cell(answer.body.get('error'), 400)}"


def answered(command: str, request: Callable[[], Answer], *, as_json: bool,
             refused: Collection[int], out: TextIO, err: TextIO,
             success: Collection[int] = (200,)) -> Answer | int:
    """The daemon's answer to `request` when it is a success, else the exit code that ends
    `convergerd <command>`, its line written: `EXIT_USAGE` for a request never answered (a bad
    id, an unreadable token, no connection), `EXIT_REFUSED` for an answer in `refused`,
    `EXIT_USAGE` for any other. With `as_json` the body is printed whatever it holds."""
    try:
        answer = request()
    except (Failed, RuleError) as exc:
        err.write(f"convergerd {command}: {exc}\n")
        return EXIT_USAGE
    if as_json:
        out.write(json.dumps(answer.body, indent=2) + "\n")
    if answer.status not in success:
        err.write(f"convergerd {command}: {daemon_answered(answer)}\n")
        return EXIT_REFUSED if answer.status in refused else EXIT_USAGE
    return answer


def exit_code(answer: Answer) -> int:
    if answer.status == 200:
        return EXIT_OK if answer.body.get("status") == "ok" else EXIT_NOT_DONE
    return EXIT_NOT_DONE if answer.status in _REFUSED else EXIT_USAGE


def render(answer: Answer) -> str:
    body = answer.body
    clusters = body.get("clusters")
    rows = [["CLUSTER", "ACTION", "RESULT", "REASON", "ERROR"]]
    if isinstance(clusters, list):
        rows.extend([cell(c.get("cluster")), cell(c.get("action")), cell(c.get("result")),
                     cell(c.get("reason")), cell(c.get("error"))]
                    for c in clusters if isinstance(c, dict))
    about = [f"revision {cell(body.get('revision'))}"] if body.get("revision") is not None else []
    if body.get("enforcement") is not None:
        about.append(f"enforcement {cell(body.get('enforcement'))}")
    lines = [f"{cell(body.get('operation'))} {cell(body.get('policy'))}"
             + (f" ({', '.join(about)})" if about else "")
             + f": {cell(body.get('status'))}"]
    if body.get("error"):
        lines.append(f"error: {cell(body['error'], 400)}")
    if body.get("skipped_reason"):
        lines.append(f"removals skipped: {cell(body['skipped_reason'], 400)}")
    if len(rows) > 1:
        lines.append("")
        lines.extend(table(rows))
        failed = sum(r[2] == "failed" for r in rows[1:])
        lines.append("")
        lines.append(f"{len(rows) - 1} cluster(s), {failed} failed")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# The command


def run(args: argparse.Namespace, *, env: Mapping[str, str] | None = None,
        out: TextIO | None = None, err: TextIO | None = None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    action: str = args.policy_command
    try:
        check_policy_id(args.id)
    except RuleError as exc:
        err.write(f"convergerd policy {action}: {exc}\n")
        return EXIT_USAGE
    try:
        token = api_token(args.api_token_file, os.environ if env is None else env)
        if action == "apply":
            asked: dict[str, Any] = {}
            if args.allow_mass_removal:
                asked["allow_mass_removal"] = True
            if args.enforcement is not None:
                asked["enforcement"] = args.enforcement
            body = asked or None
            answer = call(args.addr, "POST", f"/v1/policies/{args.id}/apply", token=token,
                          body=body, timeout_s=float(args.timeout))
        else:
            answer = call(args.addr, "DELETE", f"/v1/policies/{args.id}", token=token,
                          body=None, timeout_s=float(args.timeout))
    except Failed as exc:
        err.write(f"convergerd policy {action}: {exc}\n")
        return EXIT_USAGE
    code = exit_code(answer)
    if args.json:
        out.write(json.dumps(answer.body, indent=2) + "\n")
    elif "operation" in answer.body:
        out.write(render(answer))
    if code == EXIT_USAGE or (args.json and answer.status != 200):
        err.write(f"convergerd policy {action}: {daemon_answered(answer)}\n")
    return code
