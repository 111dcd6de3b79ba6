"""The API server processes behind one simulated cluster's URL, and what their `/metrics`
says about admission (pure but for the clock).

kube-apiserver counts every (failed validation, action) of its admission policies in
`apiserver_validating_admission_policy_check_total{policy, policy_binding, error_type,
enforcement_action}` (k8s.io/apiserver/pkg/admission/plugin/policy/validating/metrics/
metrics.go; what is counted is decided in `convergerd.admission.evaluate`), from zero at the
process's start, which `process_start_time_seconds` gives. A cluster may have several API
servers behind one Service, each with its own counters: here a request is admitted by the
processes in turn and a scrape is answered by them in turn (each turn independent), so a
reader meets alternating start times; the admin API restarts one or all of them (counters
back to zero, a new start time) and sets how many there are.

The exposition is Prometheus text format 0.0.4 as client_golang writes it: HELP and TYPE
lines, labels sorted by name, values as Go's `strconv.FormatFloat(v, 'g', -1, 64)`. The
latency histogram (`..._check_duration_seconds`) is not simulated.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from convergerd.admission.evaluate import Check

CHECK_TOTAL = "apiserver_validating_admission_policy_check_total"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
MAX_REPLICAS = 16
_MAX_SERIES = 100_000  # per process: beyond it new series are not counted (a bound of ours)
_CHECK_HELP = ("[BETA] Validation admission policy check total, labeled by policy and further "
               "identified by binding and enforcement action taken.")
_START_HELP = "[ALPHA] Start time of the process since unix epoch in seconds."
SeriesKey = tuple[str, str, str, str]  # policy, binding, error_type, enforcement_action


def go_float(value: float) -> str:
    """`strconv.FormatFloat(value, 'g', -1, 64)`: the shortest digits, exponent form when the
    decimal exponent is below -4 or at least 6 (`1e+06`, `1.71234567899e+09`)."""
    if value == 0:
        return "0"
    sign, digits, exp = Decimal(repr(float(value))).normalize().as_tuple()
    assert isinstance(exp, int)
    text = "".join(map(str, digits))
    point = len(text) + exp  # digits before the decimal point
    x = point - 1
    minus = "-" if sign else ""
    if x < -4 or x >= 6:
        mantissa = text[0] + ("." + text[1:] if len(text) > 1 else "")
        return f"{minus}{mantissa}e{'-' if x < 0 else '+'}{abs(x):02d}"
    if point <= 0:
        return f"{minus}0.{'0' * -point}{text}"
    if point >= len(text):
        return minus + text + "0" * (point - len(text))
    return f"{minus}{text[:point]}.{text[point:]}"


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@dataclass
class _Process:
    start_time: float
    counts: dict[SeriesKey, int] = field(default_factory=dict)

    def count(self, check: Check) -> None:
        key = (check.policy, check.binding, check.error_type, check.action)
        if key in self.counts or len(self.counts) < _MAX_SERIES:
            self.counts[key] = self.counts.get(key, 0) + 1

    def exposition(self) -> bytes:
        lines = [f"# HELP {CHECK_TOTAL} {_CHECK_HELP}", f"# TYPE {CHECK_TOTAL} counter"]
        for (policy, binding, error_type, action), n in sorted(self.counts.items()):
            labels = (f'enforcement_action="{_label(action)}",'
                      f'error_type="{_label(error_type)}",policy="{_label(policy)}",'
                      f'policy_binding="{_label(binding)}"')
            lines.append(f"{CHECK_TOTAL}{{{labels}}} {go_float(n)}")
        lines += [f"# HELP process_start_time_seconds {_START_HELP}",
                  "# TYPE process_start_time_seconds gauge",
                  f"process_start_time_seconds {go_float(self.start_time)}"]
        return ("\n".join(lines) + "\n").encode()


class ApiServers:
    """One cluster's API server processes: their counters, start times and turns."""

    def __init__(self, *, clock: Callable[[], float] = time.time, replicas: int = 1) -> None:
        self._clock = clock
        self._last_start = 0.0
        self._processes = [self._start() for _ in range(replicas)]
        self._admit_turn = 0
        self._scrape_turn = 0

    def _start(self) -> _Process:
        # A restart within the same millisecond still shows a new start time.
        start = max(round(self._clock(), 3), round(self._last_start + 0.001, 3))
        self._last_start = start
        return _Process(start)

    def record(self, checks: Iterable[Check]) -> None:
        """One request's counter increments, by the process whose turn it is to admit."""
        process = self._processes[self._admit_turn % len(self._processes)]
        self._admit_turn += 1
        for check in checks:
            process.count(check)

    def scrape(self) -> bytes:
        """The `/metrics` answer of the process whose turn it is to answer."""
        process = self._processes[self._scrape_turn % len(self._processes)]
        self._scrape_turn += 1
        return process.exposition()

    def restart(self, *, replica: int | None = None, replicas: int | None = None) -> None:
        """Restart process `replica` (None: every one, `replicas` of them from now on)."""
        if replica is not None:
            self._processes[replica] = self._start()
            return
        self._processes = [self._start() for _ in range(replicas or len(self._processes))]

    @property
    def replicas(self) -> int:
        return len(self._processes)

    def to_json(self) -> list[dict[str, Any]]:
        return [{"startTime": p.start_time, "checks": sum(p.counts.values())}
                for p in self._processes]
