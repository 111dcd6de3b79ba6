"""Request accounting: per-cluster counts by verb and a bounded log of recent requests.

Tests and benchmarks read these through the admin API to count API load and to see who wrote
what (the User-Agent names the convergerd replica). Both are plain in-memory structures: the
log is a ring buffer, so a long benchmark cannot grow it without bound.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

# Kubernetes verbs the simulator serves, in the order reports show them.
VERBS = ("get", "list", "watch", "create", "update", "patch", "delete")
# Requests that address no resource (discovery, /version, OpenAPI) are counted apart, so that
# "get" counts object reads only.
NON_RESOURCE = "nonResource"
DEFAULT_LOG_SIZE = 10_000


@dataclass(frozen=True, slots=True)
class RequestRecord:
    seq: int  # increases by one per request, across clusters; `?after=` pages with it
    time: float  # unix seconds when the request arrived
    cluster: str
    verb: str  # a kube verb, or NON_RESOURCE
    method: str
    path: str  # cluster-relative path with the query string
    status: int  # 0 when no answer was given (fault: down or hang)
    user_agent: str
    duration_ms: float
    # The cluster whose bearer token the request carried ("" a token of none, None no token).
    token_of: str | None = None
    # What admission put in the request's audit event (an `Audit` binding's failure).
    annotations: Mapping[str, str] | None = None

    def to_json(self) -> dict[str, Any]:
        out = {
            "seq": self.seq,
            "time": self.time,
            "cluster": self.cluster,
            "verb": self.verb,
            "method": self.method,
            "path": self.path,
            "status": self.status,
            "userAgent": self.user_agent,
            "durationMs": round(self.duration_ms, 3),
            "tokenOf": self.token_of,
        }
        if self.annotations:
            out["auditAnnotations"] = dict(self.annotations)
        return out


class Accounting:
    """Counts by cluster and verb, plus the recent-request ring buffer."""

    def __init__(self, log_size: int = DEFAULT_LOG_SIZE) -> None:
        self._counts: dict[str, dict[str, int]] = {}
        self._log: deque[RequestRecord] = deque(maxlen=log_size)
        self._seq = itertools.count(1)

    def record(
        self,
        *,
        time: float,
        cluster: str,
        verb: str,
        method: str,
        path: str,
        status: int,
        user_agent: str,
        duration_ms: float,
        token_of: str | None = None,
        annotations: Mapping[str, str] | None = None,
    ) -> None:
        counts = self._counts.get(cluster)
        if counts is None:
            counts = self._counts[cluster] = {}
        counts[verb] = counts.get(verb, 0) + 1
        self._log.append(
            RequestRecord(
                seq=next(self._seq),
                time=time,
                cluster=cluster,
                verb=verb,
                method=method,
                path=path,
                status=status,
                user_agent=user_agent,
                duration_ms=duration_ms,
                token_of=token_of,
                annotations=annotations or None,
            )
        )

    def counts(self, cluster: str) -> dict[str, int]:
        """Every verb (zero included) for one cluster, plus the non-resource count and total."""
        seen = self._counts.get(cluster, {})
        out = {verb: seen.get(verb, 0) for verb in (*VERBS, NON_RESOURCE)}
        out["total"] = sum(seen.values())
        return out

    def stats(self, clusters: Iterable[str]) -> dict[str, Any]:
        per_cluster = {cid: self.counts(cid) for cid in clusters}
        total = dict.fromkeys((*VERBS, NON_RESOURCE, "total"), 0)
        for counts in per_cluster.values():
            for key, n in counts.items():
                total[key] += n
        return {"clusters": per_cluster, "total": total}

    def reset(self) -> None:
        self._counts.clear()
        self._log.clear()

    def requests(
        self,
        *,
        cluster: str | None = None,
        verb: str | None = None,
        since: float | None = None,
        after: int | None = None,
        limit: int | None = None,
    ) -> list[RequestRecord]:
        """The logged requests matching every given filter, oldest first (the last `limit`)."""
        out = [
            r
            for r in self._log
            if (cluster is None or r.cluster == cluster)
            and (verb is None or r.verb == verb)
            and (since is None or r.time >= since)
            and (after is None or r.seq > after)
        ]
        return out[-limit:] if limit else out
