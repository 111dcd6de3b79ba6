"""The reachability prober with a fake cluster API: up/down into status, read by the metrics."""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field

import pytest

from convergerd.config import ProberTuning
from convergerd.core.errors import (
    BadResponse,
    ClusterLevelError,
    ClusterUnreachable,
    NoCredentials,
    Throttled,
    TransientApiError,
)
from convergerd.core.model import ClusterId
from convergerd.kube.api import Applied, KubeObject, ObjectList, PolicyApi
from convergerd.status.metrics import Metrics
from convergerd.status.probe import Answers, Prober
from convergerd.status.state import StatusState

SILENT_MAX_PASSES = ProberTuning().silent_max_passes


class FakeApi:
    def __init__(self, name: str, behaviour: str) -> None:
        self.name = name
        self.behaviour = behaviour

    @property
    def cluster(self) -> ClusterId:
        return ClusterId(self.name)

    async def list_policies(self, *, label_selector: str, timeout_s: float) -> ObjectList:
        raise NotImplementedError

    async def apply_policy(self, body: KubeObject, *, timeout_s: float) -> Applied:
        raise NotImplementedError

    async def delete_policy(self, name: str, *, timeout_s: float) -> bool:
        raise NotImplementedError

    async def server_version(self, *, timeout_s: float) -> str:
        if self.behaviour == "down":
            raise ClusterUnreachable("connect timeout")
        if self.behaviour == "401":
            raise ClusterLevelError("401 Unauthorized", status=401, reason="unauthorized")
        if self.behaviour == "429":
            raise Throttled("429 Too Many Requests", status=429, retry_after_s=1.0)
        if self.behaviour == "503":
            raise TransientApiError("503 Service Unavailable", status=503)
        if self.behaviour == "junk":
            raise BadResponse("200 answer is not JSON")
        if self.behaviour == "nocreds":
            raise NoCredentials("no context")
        if self.behaviour == "hang":
            await asyncio.sleep(3600)
        return "v1.31.0"


async def test_probe_sets_up_and_down() -> None:
    state = StatusState(identity="r", interval_s=300)
    metrics = Metrics(state=state, process_collectors=False)
    names = ("ok", "down", "401", "429", "503", "junk", "nocreds", "hang")
    apis: dict[str, PolicyApi] = {n: FakeApi(n, n) for n in names}
    prober = Prober(clusters=lambda: apis, state=state, timeout_s=0.05)
    result = await prober.probe_once()
    # Any answer (even 401, 429, 503 or junk) means the API server was reached.
    assert result == {"401": True, "429": True, "503": True, "junk": True,
                      "down": False, "nocreds": False, "hang": False, "ok": True}
    text = metrics.render().decode()
    assert 'convergerd_cluster_up{cluster="down"} 0.0' in text
    assert 'convergerd_cluster_up{cluster="ok"} 1.0' in text
    down = state.clusters[ClusterId("down")]
    assert (down.reachable, down.error) == (False, "connect timeout")
    assert state.clusters[ClusterId("hang")].error == "no answer within 0.05 s"
    assert state.clusters[ClusterId("ok")].server_version == "v1.31.0"


async def test_prober_forgets_clusters_it_no_longer_probes() -> None:
    state = StatusState(identity="r", interval_s=300)
    apis: dict[str, PolicyApi] = {n: FakeApi(n, "ok") for n in ("a", "b", "c")}
    prober = Prober(clusters=lambda: apis, state=state, timeout_s=0.05)
    await prober.probe_once()
    assert len(prober) == 3
    del apis["b"], apis["c"]
    assert await prober.probe_once() == {"a": True}
    assert len(prober) == 1


class CountingApi(FakeApi):
    def __init__(self, name: str, behaviour: str) -> None:
        super().__init__(name, behaviour)
        self.probes = 0

    async def server_version(self, *, timeout_s: float) -> str:
        self.probes += 1
        return await super().server_version(timeout_s=timeout_s)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Probing:
    """A prober behind `Answers` (as the daemon wires them) on a fake clock: a 10 s period."""

    apis: dict[str, CountingApi]
    clock: Clock = field(default_factory=Clock)
    metrics: Metrics = field(init=False)
    state: StatusState = field(init=False)
    answers: Answers = field(init=False)
    prober: Prober = field(init=False)

    def __post_init__(self) -> None:
        self.state = StatusState(identity="r", interval_s=300)
        self.metrics = Metrics(state=self.state, process_collectors=False)
        self.answers = Answers(self.metrics, monotonic=self.clock)
        self.prober = Prober(clusters=lambda: dict(self.apis), state=self.state,
                             period_s=10.0, timeout_s=0.05, answers=self.answers)


async def test_a_cluster_that_just_answered_a_round_is_not_probed() -> None:
    apis = {n: CountingApi(n, "ok") for n in ("listed", "refused", "idle", "unanswered")}
    p = Probing(apis)
    p.answers.request_done("listed", "list", 200, 0.5)
    p.answers.request_done("refused", "apply", 403, 0.1)  # any HTTP answer proves it reached
    p.answers.request_done("unanswered", "list", None, 5.0)  # no answer proves nothing
    assert await p.prober.probe_once() == dict.fromkeys(apis, True)
    assert {n: a.probes for n, a in apis.items()} == {
        "listed": 0, "refused": 0, "idle": 1, "unanswered": 1}
    assert p.state.clusters[ClusterId("listed")].reachable is True
    assert 'convergerd_cluster_up{cluster="listed"} 1.0' in p.metrics.render().decode()
    # The requests themselves still reach the metrics behind `answers`.
    assert 'cluster="listed",code="200"' in p.metrics.render().decode()


async def test_an_answer_older_than_the_period_does_not_spare_the_probe() -> None:
    api = CountingApi("c", "ok")
    p = Probing({"c": api})
    p.answers.request_done("c", "list", 200, 1.0)  # started 1 s ago
    p.clock.now += 9.5
    await p.prober.probe_once()
    assert api.probes == 1  # 10.5 s since the request started: a probe is due
    # It stopped answering after the round: the next pass finds out.
    api.behaviour = "down"
    p.clock.now += 10.0
    assert await p.prober.probe_once() == {"c": False}
    assert p.state.clusters[ClusterId("c")].reachable is False


async def test_the_probers_own_answers_do_not_spare_the_next_probe() -> None:
    api = CountingApi("c", "ok")
    p = Probing({"c": api})
    for _ in range(3):
        p.answers.request_done("c", "version", 200, 0.01)  # as the client reports a probe
        p.answers.request_done("c", "watch", 200, 0.01)  # a watch's end is no proof either
        await p.prober.probe_once()
        p.clock.now += 10.0
    assert api.probes == 3


async def test_answers_forget_clusters_no_longer_probed() -> None:
    state = StatusState(identity="r", interval_s=300)
    metrics = Metrics(state=state, process_collectors=False)
    answers = Answers(metrics, monotonic=Clock())
    apis: dict[str, PolicyApi] = {"a": FakeApi("a", "ok")}
    prober = Prober(clusters=lambda: apis, state=state, timeout_s=0.05,
                    answers=answers)
    answers.request_done("a", "list", 200, 0.1)
    answers.request_done("gone", "list", 200, 0.1)
    await prober.probe_once()
    assert len(answers) == 1


async def test_a_cluster_that_goes_down_right_after_answering_is_seen_within_1_5_periods() -> None:
    """It answered a round's list, then went down at once. A pass 9.9 s later used to spare it
    (an answer within the period), and the next one came 19.9 s after the answer: two periods.
    Sparing only answers within half a period, the worst case is a pass at 4.9 s that spares
    it and the next at 14.9 s: 1.5 periods."""
    api = CountingApi("c", "ok")
    p = Probing({"c": api})
    p.answers.request_done("c", "list", 200, 0.0)
    api.behaviour = "down"
    p.clock.now += 9.9
    assert await p.prober.probe_once() == {"c": False}
    assert 'convergerd_cluster_up{cluster="c"} 0.0' in p.metrics.render().decode()


async def test_an_answer_within_half_a_period_spares_the_probe() -> None:
    api = CountingApi("c", "ok")
    p = Probing({"c": api})
    p.answers.request_done("c", "list", 200, 0.0)
    p.clock.now += 4.9
    await p.prober.probe_once()
    assert api.probes == 0
    p.clock.now += 0.2  # 5.1 s: more than half a period
    await p.prober.probe_once()
    assert api.probes == 1


class TimedApi(FakeApi):
    """Notes, on the loop's clock, when its probe started and when it was answered."""

    def __init__(self, name: str, behaviour: str) -> None:
        super().__init__(name, behaviour)
        self.started: float | None = None

    async def server_version(self, *, timeout_s: float) -> str:
        self.started = asyncio.get_running_loop().time()
        return await super().server_version(timeout_s=timeout_s)


@pytest.mark.looptime
async def test_a_hung_tenth_of_the_fleet_does_not_hold_back_the_other_probes() -> None:
    """1,000 clusters, every tenth hung since the last pass. In the pass that finds them hung,
    each holds one of the answering clusters' 64 slots only for the patience (1 s), then
    waits its timeout out aside (held for their timeouts, 100 of them made that pass take
    waves of 6 s; at 10,000 clusters ~80 s, and rounds met them meanwhile); from the next pass
    on they are probed beside the others: each probe starts at its even pace over the spread,
    none waits for a hung one, and the pass ends one timeout after the last start (with 32
    slots for all, 1,000 hung clusters made a pass take 156 s at 10,000 clusters, and the
    clusters behind them went unprobed that long)."""
    state = StatusState(identity="r", interval_s=300)
    apis = {f"c{k:04d}": TimedApi(f"c{k:04d}", "hang" if k % 10 == 9 else "ok")
            for k in range(1000)}
    prober = Prober(clusters=lambda: apis, state=state, period_s=10.0, timeout_s=5.0)
    loop = asyncio.get_running_loop()
    first = loop.time()
    assert sum((await prober.probe_once(spread_s=5.0)).values()) == 900
    # This fake ignores its timeout: the prober's own bound, 1 s more, ends each hung probe.
    # The last one starts by the end of the spread: no waves.
    assert loop.time() - first <= 5.0 + 6.0 + 0.1

    start = loop.time()
    result = await prober.probe_once(spread_s=5.0)
    took = loop.time() - start
    assert sum(result.values()) == 900
    starts = sorted((api.started or 0.0) - start for api in apis.values())
    assert starts[0] == pytest.approx(0.0, abs=0.01)
    assert starts[-1] <= 5.0  # the last one started within the spread...
    assert starts[len(starts) // 2] >= 2.0  # ...and not all at once
    assert 5.0 <= took <= 5.0 + 6.0 + 0.1  # the last ones' timeout, not waves of them


@pytest.mark.looptime
async def test_a_cluster_silent_pass_after_pass_is_probed_less_and_less_often() -> None:
    """A dead or hung cluster costs a new connection and a TLS handshake per probe on both
    sides: after two silent probes in a row it is probed every other pass, then every fourth,
    at most every `SILENT_MAX_PASSES`. An answer to any other request (a round tries it every
    round) marks it reached at the next pass, and once it answers a probe it is probed every
    pass again."""
    api = CountingApi("c", "down")
    p = Probing({"c": api})
    probed_at = []
    for n in range(30):
        p.clock.now += 10.0
        before = api.probes
        assert await p.prober.probe_once() == {"c": False}
        if api.probes > before:
            probed_at.append(n)
    gaps = [b - a for a, b in itertools.pairwise(probed_at)]
    assert gaps[:4] == [1, 2, 4, SILENT_MAX_PASSES]
    assert set(gaps[3:]) == {SILENT_MAX_PASSES}
    assert p.state.clusters[ClusterId("c")].reachable is False
    # It comes back: a round's answer tells at the next pass, resting or not.
    api.behaviour = "ok"
    p.answers.request_done("c", "list", 200, 0.0)
    p.clock.now += 1.0
    assert await p.prober.probe_once() == {"c": True}
    for _ in range(3):
        p.clock.now += 10.0
        before = api.probes
        assert await p.prober.probe_once() == {"c": True}
        assert api.probes == before + 1  # every pass again


async def test_a_cluster_is_spared_by_an_answer_that_came_during_the_pass() -> None:
    """Whether another answer spares a probe is judged when that cluster's turn comes."""
    clock = Clock()
    state = StatusState(identity="r", interval_s=300)
    answers = Answers(Metrics(state=state, process_collectors=False), monotonic=clock)
    apis = {n: CountingApi(n, "ok") for n in ("a", "z")}
    prober = Prober(clusters=lambda: dict(apis), state=state, period_s=10.0, timeout_s=1.0,
                    answers=answers)
    clock.now += 100.0
    pass_ = asyncio.create_task(prober.probe_once(spread_s=5.0))
    await asyncio.sleep(1.0)  # "a" probed at once, "z" is due at the end of the spread
    answers.request_done("z", "list", 200, 0.1)  # a round's list answers meanwhile
    await pass_
    assert (apis["a"].probes, apis["z"].probes) == (1, 0)


async def test_a_cluster_a_save_is_about_to_reach_is_left_to_the_save() -> None:
    """A save over 10,000 clusters and a pass of 10,000 probes at once cost half again the
    save's CPU, on both sides; the save's answer tells what the probe would."""
    apis = {n: CountingApi(n, "ok") for n in ("saved", "other")}
    p = Probing(apis)
    await p.prober.probe_once()  # both answered: up
    p.clock.now += 10.0
    with p.answers.expecting(["saved"]):
        apis["saved"].behaviour = "down"  # the save will find out; the status waits for it
        assert await p.prober.probe_once() == {"other": True, "saved": True}
        assert (apis["saved"].probes, apis["other"].probes) == (1, 2)
        assert p.state.clusters[ClusterId("saved")].reachable is True
        # A fan-out still running a period after it began excuses no more probes.
        p.clock.now += 10.0
        assert await p.prober.probe_once() == {"other": True, "saved": False}
    p.clock.now += 10.0
    apis["saved"].behaviour = "ok"
    assert await p.prober.probe_once() == {"other": True, "saved": True}
    assert apis["saved"].probes == 3  # the save is over: probed again


async def test_a_cluster_last_seen_down_is_probed_while_a_save_is_about_to_reach_it() -> None:
    api = CountingApi("c", "down")
    p = Probing({"c": api})
    assert await p.prober.probe_once() == {"c": False}
    api.behaviour = "ok"
    p.clock.now += 10.0
    with p.answers.expecting(["c"]), p.answers.expecting(["c"]):
        assert await p.prober.probe_once() == {"c": True}  # no answer is no proof
    assert api.probes == 2
    assert p.state.clusters[ClusterId("c")].reachable is True


async def test_overlapping_fan_outs_leave_a_cluster_expected_until_the_last_ends() -> None:
    p = Probing({})
    with p.answers.expecting(["c"]):
        with p.answers.expecting(["c", "d"]):
            assert p.answers.expected_within("d", 10.0)
        assert p.answers.expected_within("c", 10.0)
        assert not p.answers.expected_within("d", 10.0)
    assert not p.answers.expected_within("c", 10.0)
