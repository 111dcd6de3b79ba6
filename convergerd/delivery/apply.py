"""One way to write a policy to a cluster, for rounds (`converge`) and saves (`fanout`) alike.

A `Writer` is one cluster written to under a fence and a deadline: every attempt is retried by
the daemon's retry policy up to the deadline, and first asks the fence how long this replica may
still write (`write_timeout_s`), so no write outlives the term that allowed it. What an apply did
is a `Delivery` (the record's vocabulary, `convergerd.core.report`), or None when a newer writer
got there first (superseded: its record stands). How a cluster's copy of a policy is read
(`cluster_revision`) is here too, so a round and a save cannot read it two ways.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from convergerd.config import Settings
from convergerd.core.decode import as_int
from convergerd.core.errors import DEADLINE_REASON, ClusterError, Fenced, Superseded
from convergerd.core.model import ClusterId, Policy
from convergerd.core.plan import ListedPolicy
from convergerd.core.report import ApplyResult, Delivery, utc_now
from convergerd.kube.api import Applied, PolicyApi
from convergerd.leader.lease import Fence
from convergerd.retry import RetryObserver, call_with_retries

log = logging.getLogger(__name__)

T = TypeVar("T")


class Retrier(Protocol):
    """Runs `fn` with the retry policy (docs/design.md, "Errors from a cluster") until it
    succeeds, fails for good, or the next attempt could not finish before `deadline` (loop
    time)."""

    async def __call__(
        self, fn: Callable[[], Awaitable[T]], *, cluster: str, deadline: float
    ) -> T: ...


class ClusterSource(Protocol):
    def get(self, cluster: ClusterId) -> PolicyApi:
        """The cluster's client; raises `NoCredentials` when the kubeconfig lacks it."""
        ...


@dataclass(frozen=True, slots=True)
class ClusterCalls:
    """How this daemon calls a cluster, in rounds and saves alike."""

    retrier: Retrier  # the retry policy, reporting each retry to the observer
    request_timeout_s: float
    clock: Callable[[], float]  # monotonic (loop time)
    wall: Callable[[], dt.datetime]  # UTC, for records


def cluster_calls(settings: Settings, observer: RetryObserver) -> ClusterCalls:
    """The one wiring of cluster calls, shared by `rounds.round_env` and `fanout.fanout_env`
    so that saves and rounds retry, time out and timestamp the same way."""
    return ClusterCalls(
        retrier=functools.partial(call_with_retries, observer=observer),
        request_timeout_s=settings.clusters.request_timeout_s,
        clock=asyncio.get_running_loop().time,
        wall=utc_now,
    )


class StopFence:
    """A fence also closed once the daemon is stopping: on SIGTERM the writes in flight finish,
    and no new write (nor retry) starts, so a standby can take over at once."""

    def __init__(self, fence: Fence, stopping: asyncio.Event) -> None:
        self._fence = fence
        self._stopping = stopping

    def remaining_s(self) -> float:
        if self._stopping.is_set():
            raise Fenced("shutting down: no new writes")
        return self._fence.remaining_s()


class Unfenced:
    """The fence of a replica that does not lead: its saves are made safe by the
    resourceVersion preconditions, not by the Lease; only shutdown stops them."""

    def remaining_s(self) -> float:
        return float("inf")


def write_timeout_s(request_timeout_s: float, fence: Fence) -> float:
    """The timeout of one write: never past the fence, so a deposed leader cannot land one
    late. Raises `Fenced` when this replica may not write at all."""
    return min(request_timeout_s, fence.remaining_s())


def cluster_revision(observed: ListedPolicy) -> int | None:
    """The revision a cluster's copy of a policy carries. The spec is the cluster's: anything
    but a bigint (a boolean, a string, a number out of range) is no revision."""
    return as_int(observed.spec.get("revision"))


@dataclass(frozen=True, slots=True)
class ClusterFailure:
    """Why one cluster's work (a round's, a save's) ended early."""

    reason: str  # its metrics slug
    error: str  # readable; never an unexpected exception's message (it may quote anything)
    reached: bool  # the cluster answered (`ClusterError.answered`)


def cluster_failure(
    exc: Exception, cluster: ClusterId, *, deadline_error: str, during: str
) -> ClusterFailure:
    """The one reading of what ended a cluster's work: the deadline, a classified
    `ClusterError`, or anything else (not ours: a client or library bug, an odd object in the
    cluster), which fails that cluster only and is logged with its traceback."""
    if isinstance(exc, TimeoutError):
        return ClusterFailure(DEADLINE_REASON, deadline_error, reached=False)
    if isinstance(exc, ClusterError):
        return ClusterFailure(exc.reason, str(exc), reached=exc.answered)
    log.error("cluster %s: unexpected error during %s", cluster, during,
              exc_info=exc, extra={"cluster": cluster})
    return ClusterFailure("internal_error",
                          f"unexpected error ({type(_first_leaf(exc)).__name__})",
                          reached=False)


def _first_leaf(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc


@dataclass(frozen=True, slots=True)
class Written:
    delivery: Delivery | None  # None: superseded, the newer writer's record stands
    applied: Applied | None = None  # the object as written (None: not written)


@dataclass(frozen=True, slots=True)
class Writer:
    """One cluster, written to under `fence` until `deadline` (loop time), called as `calls`
    says."""

    cluster: ClusterId
    api: PolicyApi
    calls: ClusterCalls
    fence: Fence
    deadline: float

    async def call(self, fn: Callable[[], Awaitable[T]]) -> T:
        """`fn` under the retry policy, up to the deadline (reads: no fence)."""
        return await self.calls.retrier(fn, cluster=self.cluster, deadline=self.deadline)

    async def apply(self, policy: Policy, body: dict[str, Any]) -> Written:
        """Server-side apply `body` (the rendered `policy`, perhaps with a resourceVersion
        precondition). An object-level refusal (400, 409, 422) is a failed delivery; a
        cluster-level error (401, 403, unreachable, deadline) and `Fenced` are raised."""
        attempts = 0

        async def attempt() -> Applied:
            nonlocal attempts
            attempts += 1
            timeout = write_timeout_s(self.calls.request_timeout_s, self.fence)
            return await self.api.apply_policy(body, timeout_s=timeout)

        try:
            applied = await self.call(attempt)
        except Superseded as exc:
            # Another writer (a save, a deletion) wrote the object after it was read: theirs
            # is newer.
            log.debug("cluster %s: policy %s superseded: %s", self.cluster, policy.id, exc)
            return Written(None)
        except ClusterError as exc:
            if exc.cluster_level:
                raise
            log.debug("cluster %s: policy %s rejected: %s", self.cluster, policy.id, exc)
            return Written(Delivery(
                self.cluster, policy.id, policy.revision, ApplyResult.FAILED, self.calls.wall(),
                error=str(exc), reason=exc.reason, attempts=attempts,
            ))
        result = ApplyResult.CREATED if applied.created else ApplyResult.UPDATED
        return Written(Delivery(self.cluster, policy.id, policy.revision, result, self.calls.wall(),
                                attempts=attempts), applied)

    async def remove(self, name: str) -> bool:
        """Delete the object `name`; False when it was already gone. Errors are raised."""
        return await self.call(lambda: self.api.delete_policy(
            name, timeout_s=write_timeout_s(self.calls.request_timeout_s, self.fence)))
