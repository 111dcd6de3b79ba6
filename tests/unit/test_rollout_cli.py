"""`convergerd rollout`: what it prints from the daemon's answers, whatever they hold (the
answers come from a daemon, but over a network: every value is shown bounded, one line)."""

from __future__ import annotations

import io

from convergerd.cli.main import build_parser
from convergerd.cli.rollout import render_command, render_list, render_one

LIVE = {"rollouts": [
    {"policy": "regs", "id": 4, "to_revision": 7, "from_revision": 6, "state": "halted",
     "wave": {"index": 0, "name": "canary", "of": 3, "warn_step": False}, "gate": "halted",
     "reason": "new_violations: 1 cluster(s) with more than 0 audit violation(s) at revision "
               "7: c0001 (4)"},
    {"policy": "labels", "id": 5, "to_revision": 2, "from_revision": None,
     "state": "progressing", "wave": {"index": 1, "name": "half", "of": 3, "warn_step": True},
     "gate": "bake", "reason": "bake: baking, 30 s left"}]}


def test_the_live_rollouts_one_line_each() -> None:
    lines = render_list(LIVE).splitlines()
    assert lines[0].split() == ["POLICY", "REVISION", "STATE", "WAVE", "GATE", "REASON"]
    assert lines[1].split()[:7] == ["regs", "6", "->", "7", "halted", "1/3", "canary"]
    assert lines[2].split()[:9] == ["labels", "-", "->", "2", "progressing", "2/3", "half",
                                    "(warn", "step)"]
    assert render_list({"rollouts": []}) == "no rollout in progress\n"


def test_one_rollout_wave_by_wave_with_its_events_and_what_holds_it_now() -> None:
    doc = {**LIVE["rollouts"][1], "in_force": True,
           "now": {"gate": "delivering", "detail": "1 of 2 cluster(s) report revision 2"},
           "clusters": {"new": 3, "old": 9, "none": 0},
           "waves": [{"index": 0, "name": "canary", "selector": {"ring": "canary"},
                      "clusters": 1, "revisions": [{"revision": 2, "clusters": 1}]},
                     {"index": 1, "name": "half", "fraction": 0.5, "warn_first": True,
                      "clusters": 2, "approval": True,
                      "revisions": [{"revision": 2, "clusters": 1},
                                    {"revision": None, "clusters": 1}]}],
           "events": [{"at": "2026-12-06T10:00:00Z", "by": "alice", "what": "approve",
                       "wave": 1, "detail": None}]}
    lines = render_one(doc).splitlines()
    assert lines[0] == ("policy labels: rollout 5 of revision 2 (from -), strategy -: "
                        "progressing, wave 2/3 half (warn step)")
    assert lines[1] == "held by delivering: 1 of 2 cluster(s) report revision 2"
    assert lines[2] == "clusters: 3 report the new revision, 9 another, 0 none"
    assert lines[6].split() == ["1", "half", "(warn", "first)", "fraction", "0.5", "2", "2:",
                                "1,", "-:", "1", "yes"]
    assert lines[-1].split()[:4] == ["2026-12-06T10:00:00Z", "alice", "approve", "1"]


def test_what_comes_back_is_shown_bounded_and_on_one_line() -> None:
    hostile = {"policy": "x\n\x1b[31mred", "id": "y" * 10_000, "state": ["not", "text"],
               "wave": "not a mapping", "waves": [None, {"selector": "nope"}],
               "events": ["nope", {"at": None}], "clusters": None}
    for text in (render_one(hostile), render_list({"rollouts": [hostile, 3]}),
                 render_command({**hostile, "clusters_written": [{"result": "failed"}, 7]})):
        assert "\x1b" not in text
        assert max(len(line) for line in text.splitlines()) < 1000
    assert render_list({"rollouts": "nope"}) == "no rollout in progress\n"


def test_the_commands_parse() -> None:
    parser = build_parser()
    args = parser.parse_args(["rollout", "approve", "regs", "--by", "alice"])
    assert (args.rollout_command, args.id, args.by) == ("approve", "regs", "alice")
    assert parser.parse_args(["rollout", "status"]).id is None


def test_a_read_with_a_token_given_that_cannot_be_read_stops_and_says_which() -> None:
    """Every command that may read without a token (rollout status, policy history, policy
    exceptions) follows one rule: no token given, none sent; a token given but unreadable is
    an error naming where it was given — never a silent request without it."""
    from convergerd.cli import exceptions, revisions, rollout

    parser = build_parser()
    missing = "/nonexistent/convergerd-token"
    commands = [(rollout.run, ["rollout", "status"]),
                (revisions.run, ["policy", "history", "regs"]),
                (exceptions.run, ["policy", "exceptions"])]
    for run, argv in commands:
        for env, flag, named in (({"CONVERGERD_API_TOKEN_FILE": missing}, [],
                                  "CONVERGERD_API_TOKEN_FILE"),
                                 ({}, ["--api-token-file", missing], "--api-token-file")):
            if run is revisions.run and flag:
                continue  # history's own flag is --token-file (a boundary's token too)
            err = io.StringIO()
            # A closed port: had the command gone on without its token, it would have
            # failed on the connection instead, with another message.
            code = run(parser.parse_args([*argv, *flag, "--addr", "127.0.0.1:9"]), env=env,
                       out=io.StringIO(), err=err)
            assert code == 2, (argv, env, flag, err.getvalue())
            assert named in err.getvalue(), err.getvalue()
            assert missing in err.getvalue(), err.getvalue()
