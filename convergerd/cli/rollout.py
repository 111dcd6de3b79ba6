"""`convergerd rollout status [ID]`, `pause ID`, `resume ID`, `approve ID`, `abort ID`: see and
operate rollouts through a running daemon's API.

`status` without an id lists every live rollout (`GET /v1/rollouts`; with `--boundary B`,
that boundary's, `GET /v1/boundaries/{b}/rollouts`, which its read token may ask): the
policy, the revision it rolls out, its state, its wave (`2/3 half`) and the gate that holds
it. With an id (`GET /v1/policies/{id}/rollout`): the policy's rollout in force, else its
latest, wave by wave (which clusters are in it, which revisions they report, which waves wait
for an approval), what holds it now, and its events (who, when, what).

`pause` keeps a rollout in progress where it is; `resume` goes on from where a paused or halted
one stopped (a gate that still fails halts it again); `approve` lets the wave a rollout waits
at have the new revision (at once); `abort` sends every cluster back to the revision it had
before (at once). Each through `POST /v1/policies/{id}/rollout/{command}` with the admin token
(`--api-token-file`, `CONVERGERD_API_TOKEN`, `CONVERGERD_API_TOKEN_FILE`); who asked is recorded
as `--by` (default user@host). The fleet views need no token unless the daemon sets
CONVERGERD_FLEET_READS_NEED_TOKEN (then the admin token is sent when one is set).

Exit codes: 0 done; 1 refused (no such rollout, or not in a state the command applies to);
2 usage, connection or authentication errors.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

from convergerd.cli.policy import (
    EXIT_OK,
    Answer,
    add_daemon_arguments,
    answered,
    api_token,
    call,
    cell,
    optional_api_token,
)
from convergerd.cli.status import table
from convergerd.cli.token import who
from convergerd.core.model import check_boundary_id, check_policy_id

_REFUSED = frozenset({404, 409})
COMMANDS = ("pause", "resume", "approve", "abort")


def add_arguments(sub: Any) -> None:
    """The `rollout` command's subcommands (`sub`)."""
    status = sub.add_parser("status", help="every live rollout, or one policy's wave by wave")
    status.add_argument("id", nargs="?", help="a policy id: its rollout in detail")
    status.add_argument("--boundary", metavar="B",
                        help="that boundary's view (its policies' rollouts), which its read "
                             "token may ask (give it with --api-token-file)")
    helps = {"pause": "keep a rollout in progress where it is",
             "resume": "go on from where a paused or halted rollout stopped",
             "approve": "let the wave a rollout waits at have the new revision now",
             "abort": "send every cluster back to the revision it had before"}
    actions = [status]
    for name in COMMANDS:
        action = sub.add_parser(name, help=helps[name])
        action.add_argument("id", help="the policy id")
        action.add_argument("--by", help="who asks, recorded with the rollout's event "
                            "(default: user@host)")
        actions.append(action)
    for action in actions:
        add_daemon_arguments(action)
        action.add_argument("--api-token-file", type=Path, metavar="PATH",
                            help="file holding the admin token (for status with --boundary, "
                                 "that boundary's read token serves too) [default: "
                                 "CONVERGERD_API_TOKEN, else the file in "
                                 "CONVERGERD_API_TOKEN_FILE]")


def _wave(doc: Mapping[str, Any]) -> str:
    wave = doc.get("wave")
    if not isinstance(wave, Mapping):
        return "-"
    index = wave.get("index")
    position = f"{index + 1}/{cell(wave.get('of'))}" if isinstance(index, int) else "-"
    warn = " (warn step)" if wave.get("warn_step") else ""
    return f"{position} {cell(wave.get('name'))}{warn}"


def render_list(body: Mapping[str, Any]) -> str:
    """The live rollouts, one line each."""
    rollouts = body.get("rollouts")
    found = [r for r in rollouts if isinstance(r, Mapping)] if isinstance(rollouts, list) else []
    if not found:
        return "no rollout in progress\n"
    rows = [["POLICY", "REVISION", "STATE", "WAVE", "GATE", "REASON"]]
    rows.extend([cell(r.get("policy")), f"{cell(r.get('from_revision'))} -> "
                 f"{cell(r.get('to_revision'))}", cell(r.get("state")), _wave(r),
                 cell(r.get("gate")), cell(r.get("reason"), 100)] for r in found)
    return "\n".join(table(rows)) + "\n"


def render_one(body: Mapping[str, Any]) -> str:
    """One policy's rollout, wave by wave, what holds it now and its events."""
    ended = "" if body.get("in_force") else " (ended)"
    lines = [f"policy {cell(body.get('policy'))}: rollout {cell(body.get('id'))} of revision "
             f"{cell(body.get('to_revision'))} (from {cell(body.get('from_revision'))}), "
             f"strategy {cell(body.get('strategy'))}: {cell(body.get('state'))}{ended}, "
             f"wave {_wave(body)}"]
    now = body.get("now")
    if isinstance(now, Mapping):
        lines.append(f"held by {cell(now.get('gate'))}: {cell(now.get('detail'), 200)}")
    elif body.get("reason"):
        lines.append(f"reason: {cell(body.get('reason'), 200)}")
    clusters = body.get("clusters")
    if isinstance(clusters, Mapping):
        lines.append(f"clusters: {cell(clusters.get('new'))} report the new revision, "
                     f"{cell(clusters.get('old'))} another, {cell(clusters.get('none'))} none")
    waves = body.get("waves")
    if isinstance(waves, list) and waves:
        rows = [["WAVE", "CHOSEN BY", "CLUSTERS", "REVISIONS REPORTED", "APPROVAL"]]
        for w in waves:
            if not isinstance(w, Mapping):
                continue
            chosen = (", ".join(f"{k}={v}" for k, v in w["selector"].items())
                      if isinstance(w.get("selector"), Mapping)
                      else f"fraction {cell(w.get('fraction'))}")
            held = w.get("revisions")
            reported = ", ".join(
                f"{cell(r.get('revision'))}: {cell(r.get('clusters'))}"
                for r in held if isinstance(r, Mapping)) if isinstance(held, list) else "-"
            rows.append([f"{cell(w.get('index'))} {cell(w.get('name'))}"
                         + (" (warn first)" if w.get("warn_first") else ""),
                         cell(chosen, 60), cell(w.get("clusters")), reported or "-",
                         "yes" if w.get("approval") else "-"])
        lines += ["", *table(rows)]
    events = body.get("events")
    if isinstance(events, list) and events:
        rows = [["AT", "BY", "WHAT", "WAVE", "DETAIL"]]
        rows.extend([cell(e.get("at")), cell(e.get("by"), 60), cell(e.get("what")),
                     cell(e.get("wave")), cell(e.get("detail"), 120)]
                    for e in events if isinstance(e, Mapping))
        lines += ["", *table(rows)]
    return "\n".join(lines) + "\n"


def render_command(body: Mapping[str, Any]) -> str:
    written = body.get("clusters_written")
    done = [c for c in written if isinstance(c, Mapping)] if isinstance(written, list) else []
    failed = [c for c in done if c.get("result") == "failed"]
    line = (f"policy {cell(body.get('policy'))}: rollout {cell(body.get('id'))} is "
            f"{cell(body.get('state'))} at wave {_wave(body)}; {len(done)} cluster(s) written")
    if failed:
        line += ", failed: " + ", ".join(f"{cell(c.get('cluster'))} ({cell(c.get('reason'))})"
                                         for c in failed[:10])
    return line + "\n"


def _request(args: argparse.Namespace, env: Mapping[str, str]) -> Answer:
    timeout_s = float(args.timeout)
    command: str = args.rollout_command
    if command == "status":
        base = "/v1" if args.boundary is None else f"/v1/boundaries/{args.boundary}"
        if args.boundary is not None:
            check_boundary_id(args.boundary)
        path = f"{base}/rollouts" if args.id is None else f"{base}/policies/{args.id}/rollout"
        if args.id is not None:
            check_policy_id(args.id)
        return call(args.addr, "GET", path, token=optional_api_token(args.api_token_file, env),
                    body=None, timeout_s=timeout_s)
    check_policy_id(args.id)
    return call(args.addr, "POST", f"/v1/policies/{args.id}/rollout/{command}",
                token=api_token(args.api_token_file, env), body={"by": who(args.by)},
                timeout_s=timeout_s)


def run(args: argparse.Namespace, *, env: Mapping[str, str] | None = None,
        out: TextIO | None = None, err: TextIO | None = None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    command: str = args.rollout_command
    answer = answered(f"rollout {command}",
                      lambda: _request(args, os.environ if env is None else env),
                      as_json=args.json, refused=_REFUSED, out=out, err=err)
    if isinstance(answer, int):
        return answer
    if not args.json:
        if command == "status":
            out.write(render_one(answer.body) if args.id else render_list(answer.body))
        else:
            out.write(render_command(answer.body))
    return EXIT_OK
