"""convergerd's own errors, classified where they enter (cluster API, database, settings).

Retry decisions are made on these classes, never on message text (docs/design.md, "Errors
from a cluster"):

| class | from | handling |
|---|---|---|
| `ClusterUnreachable` | connect error, timeout | retry with backoff within the deadline |
| `TransientApiError` | 500, 502, 503, 504 | retry with backoff within the deadline |
| `Throttled` | 429 | retry after `Retry-After` |
| `ClusterLevelError` | 401, 403, 404 on the Policy API, a 3xx | stop that cluster for this round |
| `ObjectRejected` | 400, 409, 422 | that policy fails there; the rest go on |
| `Superseded` | 409 or 404 to a write carrying `metadata.resourceVersion` | a newer write won |
| `BadResponse` | not JSON, over the size cap, wrong shape | stop that cluster (it answered) |
| `NotJSON` | JSON past `decode.bounded_json`'s bounds | the edge's: row invalid, 400, ... |
| `BadFile` | a file past `files.read_bounded`'s bounds, bad YAML | the edge's error |
"""

from __future__ import annotations

from convergerd.core.shown import shown

# The reason of a cluster's work cut by its own deadline (a round's, a save's) before the
# cluster answered: says nothing about the cluster, so it is no evidence that it is down
# (a round cut at 10,000 clusters must not mark the thousands it never reached unreachable).
DEADLINE_REASON = "deadline"


class ConvergerdError(Exception):
    """Base of every error convergerd raises on purpose."""


class ConfigError(ConvergerdError):
    """A setting with a bad value; the message names the setting and the value."""

    def __init__(self, setting: str, value: object, problem: str) -> None:
        self.setting = setting
        self.value = value
        super().__init__(f"{setting}={shown(value)}: {problem}")


class ClusterError(ConvergerdError):
    """A failure talking to one cluster.

    `reason` is a short, stable slug (a metrics label value, e.g. `connect_error`);
    the message is the readable reason shown in status and logs. Neither ever holds a secret.
    """

    reason = "error"
    retryable = False

    def __init__(self, message: str, *, reason: str | None = None) -> None:
        super().__init__(message)
        if reason is not None:
            self.reason = reason

    @property
    def cluster_level(self) -> bool:
        """True when the whole cluster's work for this round must stop."""
        return not isinstance(self, ObjectRejected)

    @property
    def answered(self) -> bool:
        """Did the cluster answer? Any answer with an HTTP status (even 429 or 503), or an
        unusable one, means its API server was reached; no connection, a timeout or no
        credentials means it was not. The one rule behind `reached` in rounds and the
        prober's `convergerd_cluster_up`."""
        return isinstance(self, ClusterApiError | BadResponse)


class NoCredentials(ClusterError):
    """The cluster is in the database but the kubeconfig has no context for it."""

    reason = "no_context"


class ClusterUnreachable(ClusterError):
    """Connect error, TLS failure, reset, or timeout."""

    reason = "unreachable"
    retryable = True


class ClusterApiError(ClusterError):
    """The cluster answered with an error status."""

    def __init__(
        self,
        message: str,
        *,
        status: int,
        k8s_reason: str | None = None,
        retry_after_s: float | None = None,
        reason: str | None = None,
    ) -> None:
        super().__init__(message, reason=reason)
        self.status = status
        self.k8s_reason = k8s_reason
        self.retry_after_s = retry_after_s


class TransientApiError(ClusterApiError):
    reason = "server_error"
    retryable = True


class Throttled(ClusterApiError):
    reason = "throttled"
    retryable = True


class ClusterLevelError(ClusterApiError):
    """401, 403, or the Policy API missing (CRD not installed)."""

    reason = "cluster_rejected"


class ObjectRejected(ClusterApiError):
    """400, 409, 422: this object on this cluster; other policies go on."""

    reason = "rejected"


class Superseded(ObjectRejected):
    """A write made with a precondition (the resourceVersion the writer read) found the object
    changed or gone since: someone newer wrote or deleted it. Not a failure of the writer."""

    reason = "superseded"


class BadResponse(ClusterError):
    """The cluster answered, with something that cannot be used: not JSON, larger than the
    size cap, or not the shape the API promises (items not a list, an item not an object).
    The message names the field and a shortened value."""

    reason = "bad_response"


class TooLarge(BadResponse):
    """A successful answer larger than the response cap: `head` holds its first bytes (at most
    the few KiB the caller asked for), so a list can still name and step past the one object
    too large to read (`kube.listhead`)."""

    def __init__(self, message: str, *, head: bytes = b"") -> None:
        super().__init__(message)
        self.head = head


class NotJSON(ConvergerdError, ValueError):
    """Bytes or text that `decode.bounded_json` will not read: not JSON, or JSON past the
    decoder's bounds (nesting depth, integer digits, a non-finite number). The message says
    which, and quotes none of the input."""


class BadFile(ConvergerdError):
    """A file that `files.read_bounded` will not read (not a regular file, over its cap,
    unreadable) or whose content is not what it must be (not UTF-8, not one bounded YAML
    document). The one-line message names the problem, never the content; callers add the
    file and what it was for."""


class Fenced(ConvergerdError):
    """This replica may no longer write: it is not (or no longer surely) the leader."""


class DatabaseUnavailable(ConvergerdError):
    """The database cannot be reached or failed transiently; callers wait and retry."""


class DatabaseRejected(ConvergerdError):
    """The database refused this write or read for good (bad data, a constraint, a missing
    privilege, a trigger that raised): retrying the same statement fails the same way. The
    write is dropped and logged; the daemon goes on. `reason` is a short slug from the
    SQLSTATE class (a metrics label value, e.g. `data`)."""

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class SchemaNotMigrated(ConvergerdError):
    """The database schema is missing or older than this version needs."""


_STATUS_CLASSES: dict[int, tuple[type[ClusterApiError], str]] = {
    500: (TransientApiError, "server_error"),
    502: (TransientApiError, "server_error"),
    503: (TransientApiError, "server_error"),
    504: (TransientApiError, "server_error"),
    429: (Throttled, "throttled"),
    401: (ClusterLevelError, "unauthorized"),
    403: (ClusterLevelError, "forbidden"),
    404: (ClusterLevelError, "crd_missing"),
    400: (ObjectRejected, "bad_request"),
    409: (ObjectRejected, "conflict"),
    422: (ObjectRejected, "invalid"),
}


def classify_status(status: int) -> tuple[type[ClusterApiError], str]:
    """The error class and metrics reason for an HTTP error status from a cluster.

    A 404 is classified as the Policy API missing: convergerd only ever addresses the
    collection or applies (which creates), so a 404 means the type is not served. Unknown
    4xx are object-level, unknown 5xx transient. A redirect is never followed (it could point
    anywhere, in clear text, and would carry the token): the whole cluster's error.
    """
    if status in _STATUS_CLASSES:
        return _STATUS_CLASSES[status]
    if 300 <= status < 400:
        return ClusterLevelError, "redirect"
    if status >= 500:
        return TransientApiError, "server_error"
    return ObjectRejected, f"http_{status}"
