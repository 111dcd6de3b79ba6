"""`convergerd status`: the table rendered from a canned /status document, and the read of
/status bounded."""

from __future__ import annotations

import argparse
import http.server
import io
import json
import socket
import threading
import tracemalloc
from collections.abc import Iterator

import pytest

from convergerd.cli.status import (
    EXIT_UNREACHABLE,
    StatusUnavailable,
    add_arguments,
    fetch_status,
    format_duration,
    render_status,
    run,
)

STATUS = {
    "version": "0.1.0",
    "identity": "rep-b",
    "leader": {"is_leader": False, "holder": "rep-a", "since": "2026-01-01T11:00:00Z"},
    "last_round": {"started_at": "2026-01-01T12:00:00Z", "finished_at": "2026-01-01T12:00:04Z",
                   "result": "partial", "leader": "rep-a",
                   "counts": {"clusters": 4, "converged": 2, "unreached": 1}, "error": None},
    "next_round_at": "2026-01-01T12:05:00Z",
    "database": {"reachable": True, "error": None},
    "invalid_policies": [{"id": "Bad_Id", "reason": "id: 'Bad_Id' is not a DNS label"}],
    "unsupported_by_version": {"v1.29.4": ["old-1"]},
    "clusters": [
        {"id": "fine", "reachable": True, "lag_seconds": 12.0, "desired": 3, "in_sync": 3,
         "failed": 0, "phases": {"Enforcing": 3}, "last_error": None,
         "verification": {"verified": 2, "admitted": 1, "not_verified": 0, "unknown": 0},
         "server_version": "v1.31.0"},
        {"id": "old-1", "reachable": True, "lag_seconds": 400.0, "desired": 3, "in_sync": 3,
         "failed": 0, "phases": {"Unsupported": 3}, "last_error": None,
         "server_version": "v1.29.4"},
        {"id": "failing", "reachable": True, "lag_seconds": 30.0, "desired": 3, "in_sync": 2,
         "failed": 1, "phases": {"Enforcing": 2, "Stale": 1}, "last_error": None,
         "verification": {"verified": 0, "admitted": 0, "not_verified": 1, "stale": 2,
                          "unknown": 0},
         "server_version": "v1.31.0"},
        {"id": "down", "reachable": False, "lag_seconds": 3725.0, "desired": 3, "in_sync": 0,
         "failed": 0, "phases": {"Stale": 3}, "last_error": "connect timeout",
         "server_version": None},
    ],
}


def test_table_lists_clusters_worst_first() -> None:
    text = render_status(STATUS, addr="http://x:8080")
    rows = [line.split()[0] for line in text.splitlines()
            if line.split() and line.split()[0] in {"fine", "old-1", "failing", "down"}]
    assert rows == ["down", "failing", "old-1", "fine"]


def test_header_and_cells() -> None:
    text = render_status(STATUS, addr="http://x:8080")
    assert "replica rep-b, leader: rep-a (this replica is a standby)" in text
    assert "last round: partial" in text
    assert "next round: 2026-01-01 12:05:00 UTC" in text
    assert "Bad_Id: id: 'Bad_Id' is not a DNS label" in text
    assert "Kubernetes v1.29.4: old-1" in text
    down = next(line for line in text.splitlines() if line.startswith("down"))
    assert "DOWN" in down
    assert "1h02m" in down
    assert "connect timeout" in down
    assert "Stale=3" in down
    assert "4 clusters: 1 unreached, 1 reached but failing" in text
    header = next(line for line in text.splitlines() if line.startswith("CLUSTER"))
    assert "VERIFIED" in header
    fine = next(line for line in text.splitlines() if line.startswith("fine"))
    assert "2/3 ADMITTED=1" in fine
    assert " - " in down  # no verification known


def test_probes_too_old_to_be_current_show_as_stale_in_the_verified_column() -> None:
    """A dead operator leaves Verified True behind: counted `stale`, not verified."""
    text = render_status(STATUS, addr="http://x:8080")
    failing = next(line for line in text.splitlines() if line.startswith("failing"))
    assert "0/3 STALE=2" in failing


def test_no_leader_and_database_down_are_said_loudly() -> None:
    doc = {**STATUS, "leader": {"is_leader": False, "holder": None},
           "database": {"reachable": False, "error": "DatabaseUnavailable: refused"}}
    text = render_status(doc)
    assert "NO LEADER" in text
    assert "DATABASE UNREACHABLE" in text


def test_pending_deletions_are_listed_with_the_clusters_holding_them() -> None:
    doc = {**STATUS, "pending_deletions": {"count": 2, "oldest_first": [
        {"id": "p-old", "requested_at": "2026-01-01T10:00:00Z", "pending_seconds": 7300.0,
         "clusters_holding": 8, "held_by": ["c1", "c2", "c3", "c4", "c5"]},
        {"id": "p-new", "requested_at": "2026-01-01T11:59:00Z", "pending_seconds": 60.0,
         "clusters_holding": 1, "held_by": ["c9"]}]}}
    lines = render_status(doc).splitlines()
    start = lines.index("pending deletions (2, still enforced where held; retry "
                        "`convergerd policy delete ID`):")
    assert lines[start + 1:start + 3] == [
        "  p-old: pending 2h01m, held by c1, c2, c3, c4, c5 and 3 more",
        "  p-new: pending 60s, held by c9",
    ]
    assert "pending deletions" not in render_status(STATUS)  # none: not a line


def test_exceptions_in_force_are_a_line_per_policy_with_the_first_to_expire() -> None:
    listed = [
        {"policy": "regs", "id": "soon", "namespace": "team-a", "state": "active",
         "expiresAt": "2026-01-03T12:00:00Z"},
        {"policy": "labels", "id": "gone", "namespace": "team-b", "state": "expired",
         "expiresAt": "2025-12-31T00:00:00Z"},
        {"policy": "regs", "id": "later", "namespace": "team-a", "state": "active",
         "expiresAt": "2026-02-01T00:00:00Z"},
    ]
    text = render_status({**STATUS, "now": "2026-01-01T12:00:00Z"}, exceptions=listed)
    assert text.splitlines()[-2:] == [
        "exceptions in force (`convergerd policy exceptions` lists them):",
        "  regs: 2, the first to expire soon (namespace team-a) at 2026-01-03 12:00:00 UTC, "
        "in 2d00h"]
    assert "exceptions" not in render_status(STATUS, exceptions=listed[1:2])
    assert "exceptions" not in render_status(STATUS)
    unread = render_status(STATUS, exceptions="http://x/v1/exceptions answered 503")
    assert unread.splitlines()[-1] == (
        "exceptions: not read (http://x/v1/exceptions answered 503)")


def test_live_rollouts_are_listed_with_their_wave_clusters_and_what_holds_them() -> None:
    doc = {**STATUS, "rollouts": [
        {"policy": "regs", "id": 3, "to_revision": 7, "from_revision": 6, "state": "halted",
         "wave": {"index": 0, "name": "canary", "of": 3, "warn_step": False}, "gate": "halted",
         "reason": "new_violations: 1 cluster(s) with more than 0 audit violation(s) at "
                   "revision 7: c0001 (4)", "clusters": {"new": 1, "old": 11}},
        {"policy": "labels", "id": 4, "to_revision": 2, "from_revision": None,
         "state": "waiting_approval", "wave": {"index": 2, "name": "rest", "of": 3,
                                               "warn_step": True},
         "gate": "approval", "reason": None, "clusters": {"new": 7, "old": 0}}]}
    lines = render_status(doc).splitlines()
    start = lines.index("rollouts in progress (2; `convergerd rollout status ID` for one):")
    assert lines[start + 1].split() == ["POLICY", "REVISION", "STATE", "WAVE", "NEW", "OLD",
                                        "HELD", "BY"]
    assert lines[start + 2].split()[:8] == ["regs", "6", "->", "7", "halted", "1/3", "canary",
                                            "1"]
    assert lines[start + 2].endswith("at revision 7: c0001 (4)")
    assert lines[start + 3].split() == ["labels", "-", "->", "2", "waiting_approval", "3/3",
                                        "rest", "(warn)", "7", "0", "approval"]
    assert "rollouts" not in render_status(STATUS)  # none: no line


def test_durations() -> None:
    assert [format_duration(s) for s in (None, 5, 119, 125, 7300, 200000)] == [
        "-", "5s", "119s", "2m05s", "2h01m", "2d07h"]


def test_unreachable_daemon_is_a_clear_error() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--addr", f"127.0.0.1:{port}", "--timeout", "2"])
    out, err = io.StringIO(), io.StringIO()
    assert run(args, out=out, err=err) == EXIT_UNREACHABLE
    assert f"cannot reach convergerd at http://127.0.0.1:{port}" in err.getvalue()
    assert out.getvalue() == ""


# -- the read of /status is bounded ----------------------------------------------------------------

MiB = 2**20


class _Endless(http.server.BaseHTTPRequestHandler):
    """Answers 200 with a body that never ends (no Content-Length, spaces: still JSON), until
    the client hangs up (or 64 MiB, so that a broken client cannot keep the test running)."""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(json.dumps(STATUS).encode())
        chunk = b" " * 2**16
        try:
            for _ in range(64 * MiB // len(chunk)):
                self.wfile.write(chunk)
        except OSError:
            return  # the client stopped reading

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def endless() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Endless)
    thread = threading.Thread(target=server.serve_forever, name="endless /status")
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_an_endless_status_answer_is_refused_at_the_cap(endless: str) -> None:
    tracemalloc.start()
    try:
        with pytest.raises(StatusUnavailable, match=f"answered more than {MiB} bytes"):
            fetch_status(endless, timeout_s=10, max_bytes=MiB)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 3 * MiB, f"peak {peak / MiB:.1f} MiB while reading with a 1 MiB cap"

