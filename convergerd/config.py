"""Settings: typed, frozen, validated, built from a mapping (the environment plus CLI flags).

One table (`SETTINGS`) names every setting once: its environment variable, its CLI flag, its
default, its parser and its help. The CLI builds its flags from it; tests build `Settings`
from a plain dict and never touch `os.environ`.
"""

from __future__ import annotations

import math
import os
import re
import secrets
import socket
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from convergerd.core.decode import clean_text
from convergerd.core.errors import BadFile, ConfigError
from convergerd.core.model import is_namespace_name, is_object_name
from convergerd.files import read_bounded

INTERVAL_ENV = "Policies__ConvergeIntervalMinutes"
# A list page of 500 Policies is ~1 MiB; 16 MiB leaves room for large rules.
DEFAULT_MAX_RESPONSE_BYTES = 16 * 2**20
ONCE_ENV = "Policies__ConvergeOnce"
# The operator's workload cache: ~25,000 ordinary pods; its memory limit in deploy/operator
# follows from it (docs/operations.md).
DEFAULT_OPERATOR_CACHE_MAX_BYTES = 64 * 2**20
OPERATOR_CACHE_MIN_BYTES = 256 * 1024
IMPORT_MAX_BYTES_DEFAULT = 4 * 1024 * 1024
# Who connects: Prometheus, kubelet probes, module-policies saving, a few admins. 256 is far
# more than they need and a small share of a 1,024-descriptor limit.
HTTP_MAX_CONNECTIONS_DEFAULT = 256
# A /status listing every cluster costs ~0.5 KB per cluster (bench/RESULTS.md): up to this many
# it stays a body a terminal, jq or a dashboard reads whole; past it, a summary and pages.
STATUS_MAX_CLUSTERS_DEFAULT = 1000
# Revisions kept per policy at most: a policy's history is read a page at a time, but pruning
# ranks every revision kept.
REVISIONS_KEPT_MAX = 100_000


def _bool(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected true or false")


def _positive_float(value: str) -> float:
    number = float(value)
    if not math.isfinite(number) or number <= 0:
        raise ValueError("expected a number greater than 0")
    return number


def _positive_int(value: str) -> int:
    number = int(value)
    if number <= 0:
        raise ValueError("expected a whole number greater than 0")
    return number


def _cache_bytes(value: str) -> int:
    number = int(value)
    if number < OPERATOR_CACHE_MIN_BYTES:
        raise ValueError(f"expected a whole number of at least {OPERATOR_CACHE_MIN_BYTES}")
    return number


def _revisions_kept(value: str) -> int:
    number = int(value)
    if not 1 <= number <= REVISIONS_KEPT_MAX:
        raise ValueError(f"expected a whole number from 1 to {REVISIONS_KEPT_MAX}")
    return number


def _days(value: str) -> float:
    number = float(value)
    if not math.isfinite(number) or number < 0:
        raise ValueError("expected a number of days, 0 or more (0: no age limit)")
    return number


def _exception_days(value: str) -> float:
    number = float(value)
    if not math.isfinite(number) or not 1 <= number <= 366:
        raise ValueError("expected a number of days from 1 to 366")
    return number


def _share(value: str) -> float:
    number = float(value)
    if not math.isfinite(number) or not 0 <= number <= 1:
        raise ValueError("expected a share from 0 to 1")
    return number


def _host_port(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError("expected HOST:PORT, e.g. 0.0.0.0:8080 or :8080")
    return host.strip("[]") or "0.0.0.0", int(port)  # noqa: S104 - a server listens on all by default


def _text(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be empty")
    return value.strip()


# Settings that end up in a Lease, a request path or header, or a file name are checked at
# start as object names are: a newline in an identity or `../` in a namespace would otherwise
# surface as tracebacks, odd request paths or a false "another replica leads".
# An identity is a Lease's holderIdentity and part of every request's User-Agent header (a pod
# name, or host name plus suffix): letters, digits and `._:-`, no space, at most 128.
_IDENTITY = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._:-]{0,126}[A-Za-z0-9])?")
IDENTITY_MAX_LEN = 128
# A kubeconfig context name is looked up, logged and labelled: visible characters, at most 253.
_CONTEXT_MAX_LEN = 253
# A bearer token goes into an Authorization header: visible ASCII, no space (RFC 6750's
# b64token and more), at most 4 KiB.
_TOKEN = re.compile(r"[\x21-\x7e]{1,4096}")


def _object_name(value: str) -> str:
    name = value.strip()
    if not is_object_name(name):
        raise ValueError("expected a Kubernetes object name: lowercase letters, digits, '-' "
                         "and '.', starting and ending with a letter or digit, at most 253")
    return name


def _namespace(value: str) -> str:
    name = value.strip()
    if not is_namespace_name(name):
        raise ValueError("expected a namespace name: lowercase letters, digits and '-', "
                         "starting and ending with a letter or digit, at most 63")
    return name


def _identity(value: str) -> str:
    identity = value.strip()
    if not _IDENTITY.fullmatch(identity):
        raise ValueError(f"expected letters, digits, '.', '_', ':' and '-' (no space or control "
                         f"character), starting and ending with a letter or digit, at most "
                         f"{IDENTITY_MAX_LEN}")
    return identity


def _context(value: str) -> str:
    name = _text(value)
    if len(name) > _CONTEXT_MAX_LEN or not name.isprintable():
        raise ValueError(f"expected a kubeconfig context name: printable characters, at most "
                         f"{_CONTEXT_MAX_LEN}")
    return name


def _token(value: str) -> str:
    token = _text(value)
    if not _TOKEN.fullmatch(token):
        raise ValueError("expected visible ASCII characters without spaces, at most 4096 "
                         "(it is sent in an Authorization header)")
    return token


def _path(value: str) -> Path:
    if not value.strip() or not value.isprintable():
        raise ValueError("expected a file path: not empty, no control character")
    return Path(value)


def _dsn(value: str) -> str:
    parsed = urllib.parse.urlsplit(value.strip())
    if parsed.scheme not in ("postgres", "postgresql"):
        raise ValueError("expected postgresql://user[:password]@host[:port]/database")
    # host[:port] after the user info (which holds the password), comma-separated for several
    # hosts as libpq and asyncpg allow: a bad port is a setting error, not an outage.
    for host in parsed.netloc.rpartition("@")[2].split(","):
        port = host.rpartition("]")[2] if host.startswith("[") else host
        port = port.partition(":")[2]
        if port and not (port.isdigit() and 0 < int(port) <= 65535):
            raise ValueError(f"port {port!r} is not a number from 1 to 65535")
    return value.strip()


# libpq and asyncpg take passwords in the query too: the server's, and the client key's.
_QUERY_PASSWORD = re.compile(r"((?:^|&)(?:ssl)?password=)([^&]*)", re.IGNORECASE)


def dsn_secrets(dsn: str) -> list[str]:
    """The passwords a DSN carries (user info, `password=`, `sslpassword=`), as written and
    percent-decoded, for scrubbing text that might quote them."""
    parsed = urllib.parse.urlsplit(dsn)
    found = [parsed.password or ""] + [m.group(2) for m in _QUERY_PASSWORD.finditer(parsed.query)]
    return sorted({v for raw in found if raw for v in (raw, urllib.parse.unquote(raw))})


def redact_dsn(dsn: str) -> str:
    """The DSN with its passwords replaced, for logs and status: in the user info, and in
    `password=` / `sslpassword=` query parameters (libpq and asyncpg accept them)."""
    parsed = urllib.parse.urlsplit(dsn)
    netloc = parsed.netloc
    if parsed.password is not None:
        netloc = netloc.replace(f":{parsed.password}@", ":***@", 1)
    query = _QUERY_PASSWORD.sub(r"\1***", parsed.query)
    if (netloc, query) == (parsed.netloc, parsed.query):
        return dsn
    return urllib.parse.urlunsplit(parsed._replace(netloc=netloc, query=query))


@dataclass(frozen=True, slots=True)
class Setting:
    key: str  # field name in the flat mapping and in `Settings`
    env: str
    flag: str
    parse: Callable[[str], Any]
    default: str | None
    help: str
    secret: bool = False


SETTINGS: tuple[Setting, ...] = (
    Setting("database_url", "CONVERGERD_DATABASE_URL", "--database-url", _dsn, None,
            "PostgreSQL DSN of the policy database", secret=True),
    Setting("database_url_file", "CONVERGERD_DATABASE_URL_FILE", "--database-url-file", _path,
            None, "file holding the PostgreSQL DSN (instead of the DSN itself: kept out of `ps` "
            "and the environment)"),
    Setting("kubeconfig", "CONVERGERD_KUBECONFIG", "--kubeconfig", _path, None,
            "kubeconfig with one context per member cluster, named by cluster id"),
    Setting("allow_insecure_clusters", "CONVERGERD_ALLOW_INSECURE_CLUSTERS",
            "--allow-insecure-clusters", _bool, "false",
            "use clusters whose kubeconfig turns TLS verification off or names an http:// "
            "server (each logged once and exported as convergerd_cluster_insecure); "
            "false: they are reported as 'insecure' and not contacted"),
    Setting("home_context", "CONVERGERD_HOME_CONTEXT", "--home-context", _context, None,
            "kubeconfig context of the home cluster holding the Lease (unset: in-cluster config)"),
    Setting("leader_election", "CONVERGERD_LEADER_ELECTION", "--leader-election", _bool, "true",
            "take the Lease before converging; false only for a single replica"),
    Setting("http_addr", "CONVERGERD_HTTP_ADDR", "--http-addr", _host_port, "0.0.0.0:8080",
            "listen address of the HTTP server (health, metrics, status, API)"),
    Setting("probe_period_s", "CONVERGERD_PROBE_PERIOD_SECONDS", "--probe-period-seconds",
            _positive_float, "10",
            "seconds between reachability checks (GET /version to each cluster no other "
            "request reached within half the period): an unreached cluster shows within 1.5 "
            "times this plus the request timeout; a check costs ~0.35 ms of CPU, so at 10,000 "
            "clusters 20 keeps the prober near 17%% of a core with detection within 35 s"),
    Setting("status_reads_per_s", "CONVERGERD_STATUS_READS_PER_SECOND",
            "--status-reads-per-second", _positive_float, "20",
            "status views (/status, /v1/clusters/{id}, /v1/policies/{id}/status) served per "
            "second by this replica, in bursts of twice that; more are answered 429 with "
            "Retry-After at once, so readers cannot slow the round (health and metrics are "
            "never limited)"),
    Setting("token_reads_per_s", "CONVERGERD_TOKEN_READS_PER_SECOND",
            "--token-reads-per-second", _positive_float, "5",
            "reads served per second to one bearer token (a boundary's read token, or the "
            "admin token), in bursts of twice that; more are answered 429 with Retry-After, "
            "so one tenant cannot use up the status budget the others share"),
    Setting("fleet_reads_need_token", "CONVERGERD_FLEET_READS_NEED_TOKEN",
            "--fleet-reads-need-token", _bool, "false",
            "whether the fleet-wide views (/status, /v1/clusters/{id}, "
            "/v1/policies/{id}/status, /metrics) need the admin token; by default they are "
            "open to anyone who reaches the port (a boundary's read token is refused there "
            "either way)"),
    Setting("status_max_clusters", "CONVERGERD_STATUS_MAX_CLUSTERS",
            "--status-max-clusters", _positive_int, str(STATUS_MAX_CLUSTERS_DEFAULT),
            "GET /status lists every cluster of a fleet up to this many; past it, counts and "
            "the worst 100 clusters (a body that does not grow with the fleet), and every "
            "cluster in pages of at most this many (?limit=&after=)"),
    Setting("http_max_connections", "CONVERGERD_HTTP_MAX_CONNECTIONS",
            "--http-max-connections", _positive_int, str(HTTP_MAX_CONNECTIONS_DEFAULT),
            "HTTP connections open at once; at the cap a new connection closes the one idle "
            "the longest (or, when every one is serving or sending a request, its request is "
            "answered 503 with Retry-After), so clients that never send a request cannot take "
            "the descriptors the database pool and the clusters need"),
    Setting("http_header_timeout_s", "CONVERGERD_HTTP_HEADER_TIMEOUT_SECONDS",
            "--http-header-timeout-seconds", _positive_float, "10",
            "seconds a request's line and headers may take to arrive, from the connection's "
            "opening (or the first byte of a later request); a slower one is closed"),
    Setting("http_body_timeout_s", "CONVERGERD_HTTP_BODY_TIMEOUT_SECONDS",
            "--http-body-timeout-seconds", _positive_float, "10",
            "seconds a request body may take to arrive (408 past it), and the longest a "
            "client may leave an answer unread before its connection is cut"),
    Setting("http_idle_timeout_s", "CONVERGERD_HTTP_IDLE_TIMEOUT_SECONDS",
            "--http-idle-timeout-seconds", _positive_float, "30",
            "seconds a kept-alive HTTP connection may wait for its next request"),
    Setting("api_token", "CONVERGERD_API_TOKEN", "--api-token", _token, None,
            "bearer token required by the mutating endpoints", secret=True),
    Setting("api_token_file", "CONVERGERD_API_TOKEN_FILE", "--api-token-file", _path, None,
            "file holding the API token (instead of the token itself: kept out of `ps` and the "
            "environment)"),
    Setting("identity", "CONVERGERD_IDENTITY", "--identity", _identity, None,
            "this replica's identity in the Lease (default: host name + random suffix)"),
    Setting("interval_minutes", INTERVAL_ENV, "--interval-minutes", _positive_float, "5",
            "minutes between converge rounds (decimals allowed: 0.1 = 6 s)"),
    Setting("once", ONCE_ENV, "--once", _bool, "false",
            "run one round and stop (exit 0 only if every cluster converged)"),
    Setting("round_deadline_fraction", "CONVERGERD_ROUND_DEADLINE_FRACTION",
            "--round-deadline-fraction", _positive_float, "0.8",
            "a round's deadline as a fraction of the interval (must be below 1)"),
    Setting("cluster_concurrency", "CONVERGERD_CLUSTER_CONCURRENCY", "--cluster-concurrency",
            _positive_int, "64", "clusters worked on at once in a round"),
    Setting("apply_concurrency", "CONVERGERD_APPLY_CONCURRENCY", "--apply-concurrency",
            _positive_int, "4", "applies in flight at once to one cluster"),
    Setting("request_timeout_s", "CONVERGERD_REQUEST_TIMEOUT_SECONDS", "--request-timeout-seconds",
            _positive_float, "5", "timeout of one request to a cluster"),
    Setting("connect_timeout_s", "CONVERGERD_CONNECT_TIMEOUT_SECONDS", "--connect-timeout-seconds",
            _positive_float, "3", "timeout of connecting to a cluster"),
    Setting("cluster_qps", "CONVERGERD_CLUSTER_QPS", "--cluster-qps", _positive_float, "50",
            "requests per second to one cluster (token bucket rate)"),
    Setting("cluster_burst", "CONVERGERD_CLUSTER_BURST", "--cluster-burst", _positive_int, "100",
            "requests allowed in a burst to one cluster"),
    Setting("max_response_bytes", "CONVERGERD_MAX_RESPONSE_BYTES", "--max-response-bytes",
            _positive_int, str(DEFAULT_MAX_RESPONSE_BYTES),
            "largest answer read from a cluster (a list page); a larger one fails that cluster "
            "with reason bad_response"),
    Setting("lease_name", "CONVERGERD_LEASE_NAME", "--lease-name", _object_name, "convergerd",
            "name of the leader-election Lease"),
    Setting("shards", "CONVERGERD_SHARDS", "--shards", _positive_int, "1",
            "split the clusters into this many shards, one Lease each (convergerd-shard-<k>), "
            "held by the replicas in fair shares; 1: one Lease (CONVERGERD_LEASE_NAME) for all"),
    Setting("lease_namespace", "CONVERGERD_LEASE_NAMESPACE", "--lease-namespace", _namespace,
            "stackship-system", "namespace of the leader-election Lease"),
    Setting("lease_duration_s", "CONVERGERD_LEASE_DURATION_SECONDS", "--lease-duration-seconds",
            _positive_float, "15", "how long a Lease holds without renewal"),
    Setting("renew_deadline_s", "CONVERGERD_RENEW_DEADLINE_SECONDS", "--renew-deadline-seconds",
            _positive_float, "10", "a leader that has not renewed for this long stops writing"),
    Setting("retry_period_s", "CONVERGERD_RETRY_PERIOD_SECONDS", "--retry-period-seconds",
            _positive_float, "2", "time between attempts to acquire or renew the Lease"),
    Setting("lease_request_timeout_s", "CONVERGERD_LEASE_REQUEST_TIMEOUT_SECONDS",
            "--lease-request-timeout-seconds", _positive_float, "2",
            "timeout of one Lease request (must be shorter than the renew deadline)"),
    Setting("grace_period_s", "CONVERGERD_GRACE_PERIOD_SECONDS", "--grace-period-seconds",
            _positive_float, "20", "on SIGTERM, how long current writes may take before exit"),
    Setting("log_level", "CONVERGERD_LOG_LEVEL", "--log-level", lambda v: v.strip().upper(),
            "INFO", "DEBUG, INFO, WARNING or ERROR"),
    Setting("log_format", "CONVERGERD_LOG_FORMAT", "--log-format", _text, "text",
            "text or json"),
    Setting("save_deadline_s", "CONVERGERD_SAVE_DEADLINE_SECONDS", "--save-deadline-seconds",
            _positive_float, "10",
            "overall deadline of a save or delete fan-out to the clusters (a person waits)"),
    Setting("removal_guard_share", "CONVERGERD_REMOVAL_GUARD_SHARE", "--removal-guard-share",
            _share, "0.5",
            "a save whose scope read came back empty removes nothing when that would remove "
            "the policy from more than this share of the clusters holding it (0 to 1)"),
    Setting("revision_retention", "CONVERGERD_REVISION_RETENTION", "--revision-retention",
            _revisions_kept, "100",
            "revisions kept per policy: the leader deletes older ones (logged and counted in "
            "convergerd_policy_revisions_pruned_total); 1 to 100000"),
    Setting("revision_retention_days", "CONVERGERD_REVISION_RETENTION_DAYS",
            "--revision-retention-days", _days, "0",
            "also delete revisions saved more than this many days ago, except what each "
            "policy holds now (a deleted policy's history goes whole); 0: no age limit"),
    Setting("exception_max_days", "CONVERGERD_EXCEPTION_MAX_DAYS", "--exception-max-days",
            _exception_days, "90",
            "the furthest an exception to a policy may expire, in days from its grant (API and "
            "import refuse a later expiresAt; 1 to 366)"),
    Setting("rollout_gate_s", "CONVERGERD_ROLLOUT_GATE_SECONDS", "--rollout-gate-seconds",
            _positive_float, "10",
            "seconds between two looks of the gate job (on the leader) at every rollout in "
            "progress: a failed gate halts (and reverts) within this much of the round that "
            "read it back"),
    Setting("rollout_approval_alert_minutes", "CONVERGERD_ROLLOUT_APPROVAL_ALERT_MINUTES",
            "--rollout-approval-alert-minutes", _positive_float, "60",
            "a rollout waiting for `convergerd rollout approve` longer than this many minutes "
            "is overdue (convergerd_rollout_approval_overdue 1, the alert "
            "ConvergerdRolloutWaitingForApproval)"),
    Setting("import_max_bytes", "CONVERGERD_IMPORT_MAX_BYTES", "--import-max-bytes",
            _positive_int, str(IMPORT_MAX_BYTES_DEFAULT),
            "largest file `convergerd import` reads, in bytes (checked before parsing)"),
    # Read by both: the operator probes at this period, the daemon cannot ask the operators
    # for theirs and shows a Verified condition probed more than two of them ago as stale.
    Setting("operator_probe_minutes", "CONVERGERD_OPERATOR_PROBE_MINUTES",
            "--operator-probe-minutes", _positive_float, "10",
            "minutes between enforcement probes (a dry-run create of a violating pod) per "
            "Enforcing policy; also how often the operator reconciles every policy again. The "
            "daemon shows a Verified condition whose last probe is more than twice this old as "
            "stale (set it as the member clusters' operators have it)"),
)
# `convergerd operator` only; it also reads the shared settings in OPERATOR_SHARED_KEYS.
OPERATOR_SETTINGS: tuple[Setting, ...] = (
    Setting("operator_context", "CONVERGERD_OPERATOR_CONTEXT", "--context", _context, None,
            "kubeconfig context (in CONVERGERD_KUBECONFIG) of the cluster to operate; unset: "
            "in-cluster config, as the pod's service account"),
    Setting("operator_http_addr", "CONVERGERD_OPERATOR_HTTP_ADDR", "--operator-http-addr",
            _host_port, "0.0.0.0:8081",
            "listen address of the operator's /healthz, /readyz and /metrics"),
    Setting("operator_lease_name", "CONVERGERD_OPERATOR_LEASE_NAME", "--operator-lease-name",
            _object_name, "convergerd-operator",
            "name of the operator's leader-election Lease (only the holder writes)"),
    Setting("operator_lease_namespace", "CONVERGERD_OPERATOR_LEASE_NAMESPACE",
            "--operator-lease-namespace", _namespace, "stackship-system",
            "namespace of the operator's Lease (its own namespace)"),
    Setting("operator_recheck_s", "CONVERGERD_OPERATOR_RECHECK_SECONDS",
            "--operator-recheck-seconds", _positive_float, "3600",
            "how often discovery is asked again whether the cluster serves "
            "ValidatingAdmissionPolicy (Unsupported policies switch by themselves after an "
            "upgrade)"),
    Setting("operator_probe_delay_s", "CONVERGERD_OPERATOR_PROBE_DELAY_SECONDS",
            "--operator-probe-delay-seconds", _positive_float, "10",
            "seconds from a policy becoming Enforcing to its first probe (under a minute)"),
    Setting("operator_admission_read_s", "CONVERGERD_OPERATOR_ADMISSION_READ_SECONDS",
            "--operator-admission-read-seconds", _positive_float, "30",
            "seconds between reads of the API server's /metrics for the admission counts of "
            "each Policy (status.admission: denials, warnings and audits counted by "
            "apiserver_validating_admission_policy_check_total); the status is written only "
            "when a figure changed"),
    Setting("operator_cache_max_bytes", "CONVERGERD_OPERATOR_CACHE_MAX_BYTES",
            "--operator-cache-max-bytes", _cache_bytes, str(DEFAULT_OPERATOR_CACHE_MAX_BYTES),
            "bytes the audit's workload cache may hold (at least 262144); past it objects are "
            "not cached and the audits of their boundaries say incomplete, naming the "
            "namespaces holding the most. The operator's memory limit follows from it "
            "(docs/operations.md)"),
)
OPERATOR_SHARED_KEYS = (
    "kubeconfig", "allow_insecure_clusters", "leader_election", "identity",
    "request_timeout_s", "connect_timeout_s", "cluster_qps", "cluster_burst",
    "max_response_bytes", "lease_duration_s", "renew_deadline_s", "retry_period_s",
    "lease_request_timeout_s", "grace_period_s", "log_level", "log_format",
    "operator_probe_minutes",
    "http_max_connections", "http_header_timeout_s", "http_body_timeout_s",
    "http_idle_timeout_s",
)
SETTINGS_BY_KEY = {s.key: s for s in (*SETTINGS, *OPERATOR_SETTINGS)}


def default_of(key: str) -> Any:
    """The setting's default, parsed: the typed groups' defaults are read from the table, so
    each is written once (in its row)."""
    setting = SETTINGS_BY_KEY[key]
    assert setting.default is not None, key
    return setting.parse(setting.default)


# Secrets that can also be read from a file (a mounted Secret): value key -> file key.
SECRET_FILES = {"database_url": "database_url_file", "api_token": "api_token_file"}
# A DSN or a token is well under 1 KiB; a bigger "secret file" is the wrong file.
MAX_SECRET_FILE_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class ClusterAccess:
    kubeconfig: Path | None
    request_timeout_s: float
    connect_timeout_s: float
    qps: float
    burst: int
    apply_concurrency: int
    allow_insecure: bool = False  # see CONVERGERD_ALLOW_INSECURE_CLUSTERS
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES


@dataclass(frozen=True, slots=True)
class Rounds:
    interval_s: float
    deadline_s: float
    once: bool
    cluster_concurrency: int


@dataclass(frozen=True, slots=True)
class Election:
    enabled: bool
    home_context: str | None
    lease_name: str
    lease_namespace: str
    identity: str
    lease_duration_s: float
    renew_deadline_s: float
    retry_period_s: float
    request_timeout_s: float
    # More than one: shard k is the Lease `convergerd-shard-<k>` (`convergerd.core.shards`).
    shards: int = 1


@dataclass(frozen=True, slots=True)
class SaveSettings:
    """Save and delete through the API or on a database notification
    (`convergerd.delivery.fanout`)."""

    deadline_s: float = default_of("save_deadline_s")
    removal_guard_share: float = default_of("removal_guard_share")


@dataclass(frozen=True, slots=True)
class RevisionRetention:
    """How much of the policies' history is kept (`convergerd.store.revisions.Pruner`)."""

    keep_last: int = default_of("revision_retention")  # revisions per policy
    max_age_days: float = default_of("revision_retention_days")  # 0: no age limit


@dataclass(frozen=True, slots=True)
class RolloutSettings:
    """The rollouts' gate job and their alert (`convergerd.delivery.rollouts`,
    `convergerd.status.metrics`)."""

    gate_period_s: float = default_of("rollout_gate_s")
    approval_alert_s: float = default_of("rollout_approval_alert_minutes") * 60.0


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """What one HTTP client may hold of the server (convergerd.api.server.serve)."""

    max_connections: int = HTTP_MAX_CONNECTIONS_DEFAULT
    header_timeout_s: float = default_of("http_header_timeout_s")  # request line and headers
    body_timeout_s: float = default_of("http_body_timeout_s")  # a request body; an answer unread
    idle_timeout_s: float = default_of("http_idle_timeout_s")  # kept alive between requests


def _http_limits(v: Mapping[str, Any]) -> HttpLimits:
    return HttpLimits(max_connections=v["http_max_connections"],
                      header_timeout_s=v["http_header_timeout_s"],
                      body_timeout_s=v["http_body_timeout_s"],
                      idle_timeout_s=v["http_idle_timeout_s"])


@dataclass(frozen=True, slots=True)
class Settings:
    database_url: str | None = field(repr=False)
    clusters: ClusterAccess
    rounds: Rounds
    election: Election
    http_host: str
    http_port: int
    api_token: str | None = field(repr=False)
    grace_period_s: float
    log_level: str
    log_format: str
    import_max_bytes: int
    saves: SaveSettings = field(default_factory=SaveSettings)
    exception_max_days: float = default_of("exception_max_days")
    status_reads_per_s: float = default_of("status_reads_per_s")
    status_max_clusters: int = STATUS_MAX_CLUSTERS_DEFAULT
    token_reads_per_s: float = default_of("token_reads_per_s")
    fleet_reads_need_token: bool = default_of("fleet_reads_need_token")
    probe_period_s: float = default_of("probe_period_s")
    # The operators' enforcement probe period.
    operator_probe_period_s: float = default_of("operator_probe_minutes") * 60.0
    http: HttpLimits = field(default_factory=HttpLimits)
    revisions: RevisionRetention = field(default_factory=RevisionRetention)
    rollouts: RolloutSettings = field(default_factory=RolloutSettings)
    # What shapes the scheduling at scale; defined at the end of the file, so looked up late.
    tuning: Tuning = field(default_factory=lambda: Tuning())  # noqa: PLW0108

    @property
    def database_url_redacted(self) -> str | None:
        return redact_dsn(self.database_url) if self.database_url else None


def default_identity() -> str:
    """Pod name (the host name in Kubernetes) plus a random suffix, so a restarted pod with the
    same name is a new holder. A host name is cut to what an identity may hold."""
    host = re.sub(r"[^A-Za-z0-9._:-]+", "-", socket.gethostname()).strip("._:-")[:100]
    return f"{host or 'convergerd'}-{secrets.token_hex(3)}"


def _read(values: Mapping[str, str | None], setting: Setting) -> Any:
    raw = values.get(setting.env)
    if raw is None:
        raw = setting.default
    if raw is None:
        return None
    try:
        return setting.parse(raw)
    except (ValueError, TypeError) as exc:
        shown = "<redacted>" if setting.secret else raw
        raise ConfigError(setting.env, shown, str(exc)) from None


def read_secret_file(setting: str, path: Path) -> str:
    """The secret in `path`, whitespace stripped. A missing, unreadable, oversized, non-UTF-8
    or empty file, or one that is not a regular file (a pipe would block, a device never
    end), is a `ConfigError` naming the setting and the path, never the content."""
    try:
        data = read_bounded(path, MAX_SECRET_FILE_BYTES)
    except BadFile as exc:
        raise ConfigError(setting, str(path), str(exc)) from None
    try:
        text = data.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise ConfigError(setting, str(path), "not UTF-8 text") from None
    if not text:
        raise ConfigError(setting, str(path), "the file is empty")
    return text


def _secret_from_file(values: dict[str, str | None], key: str, file_key: str) -> None:
    setting, file_setting = SETTINGS_BY_KEY[key], SETTINGS_BY_KEY[file_key]
    raw_path = values.get(file_setting.env)
    if raw_path is None:
        return
    if values.get(setting.env) is not None:
        raise ConfigError(
            file_setting.env, raw_path,
            f"{setting.env} ({setting.flag}) is set too: give the secret one way, "
            f"either {setting.env} or {file_setting.env}",
        )
    secret = read_secret_file(file_setting.env, Path(raw_path))
    try:
        setting.parse(secret)
    except (ValueError, TypeError) as exc:
        raise ConfigError(file_setting.env, raw_path, f"the file's content: {exc}") from None
    values[setting.env] = secret


def secrets_in_flags(flags: Mapping[str, str | None]) -> list[Setting]:
    """The secret settings given as command-line flags (visible in `ps` and shell history)."""
    return [SETTINGS_BY_KEY[key] for key, value in flags.items()
            if value is not None and SETTINGS_BY_KEY[key].secret]


def load_settings(
    env: Mapping[str, str], flags: Mapping[str, str | None] | None = None
) -> Settings:
    """Settings from environment variables, overridden by CLI flags (keyed by setting key).
    Secrets named by a `*_FILE` setting are read here, once."""
    values: dict[str, str | None] = {s.env: env.get(s.env) for s in SETTINGS}
    for key, value in (flags or {}).items():
        if value is not None:
            values[SETTINGS_BY_KEY[key].env] = value
    for key, file_key in SECRET_FILES.items():
        _secret_from_file(values, key, file_key)
    v = {s.key: _read(values, s) for s in SETTINGS}
    settings = Settings(
        database_url=v["database_url"],
        clusters=ClusterAccess(
            kubeconfig=v["kubeconfig"],
            request_timeout_s=v["request_timeout_s"],
            connect_timeout_s=v["connect_timeout_s"],
            qps=v["cluster_qps"],
            burst=v["cluster_burst"],
            apply_concurrency=v["apply_concurrency"],
            allow_insecure=v["allow_insecure_clusters"],
            max_response_bytes=v["max_response_bytes"],
        ),
        rounds=Rounds(
            interval_s=v["interval_minutes"] * 60.0,
            deadline_s=v["interval_minutes"] * 60.0 * v["round_deadline_fraction"],
            once=v["once"],
            cluster_concurrency=v["cluster_concurrency"],
        ),
        election=Election(
            enabled=v["leader_election"],
            home_context=v["home_context"],
            lease_name=v["lease_name"],
            lease_namespace=v["lease_namespace"],
            identity=v["identity"] or default_identity(),
            lease_duration_s=v["lease_duration_s"],
            renew_deadline_s=v["renew_deadline_s"],
            retry_period_s=v["retry_period_s"],
            request_timeout_s=v["lease_request_timeout_s"],
            shards=v["shards"],
        ),
        http_host=v["http_addr"][0],
        http_port=v["http_addr"][1],
        api_token=v["api_token"],
        grace_period_s=v["grace_period_s"],
        log_level=v["log_level"],
        log_format=v["log_format"],
        saves=SaveSettings(deadline_s=v["save_deadline_s"],
                    removal_guard_share=v["removal_guard_share"]),
        import_max_bytes=v["import_max_bytes"],
        exception_max_days=v["exception_max_days"],
        status_reads_per_s=v["status_reads_per_s"],
        status_max_clusters=v["status_max_clusters"],
        token_reads_per_s=v["token_reads_per_s"],
        fleet_reads_need_token=v["fleet_reads_need_token"],
        probe_period_s=v["probe_period_s"],
        operator_probe_period_s=v["operator_probe_minutes"] * 60.0,
        http=_http_limits(v),
        revisions=RevisionRetention(keep_last=v["revision_retention"],
                                    max_age_days=v["revision_retention_days"]),
        rollouts=RolloutSettings(gate_period_s=v["rollout_gate_s"],
                                 approval_alert_s=v["rollout_approval_alert_minutes"] * 60.0),
    )
    check_settings(settings)
    return settings


def check_settings(s: Settings) -> None:
    """Cross-field rules; each failure names the setting to change."""
    fraction_env = SETTINGS_BY_KEY["round_deadline_fraction"].env
    if s.rounds.deadline_s >= s.rounds.interval_s:
        raise ConfigError(fraction_env, s.rounds.deadline_s / s.rounds.interval_s,
                          "a round's deadline must be shorter than the interval (use < 1)")
    _check_election(s.election)
    _check_logging(s.log_level, s.log_format)


# The Lease's leaseDurationSeconds is an int32: a longer duration is refused on every write,
# and no replica could ever lead.
MAX_LEASE_DURATION_S = 2**31 - 1
MAX_SHARDS = 256
# A holder identity read from a Lease is cleaned and cut to this many characters (every
# replica's status, logs and metric labels name holders): ours must read back unchanged.
MAX_IDENTITY_CHARS = 128


def _check_election(e: Election) -> None:
    if clean_text(e.identity, MAX_IDENTITY_CHARS) != e.identity:
        raise ConfigError(SETTINGS_BY_KEY["identity"].env, e.identity,
                          f"at most {MAX_IDENTITY_CHARS} characters, none of them a control "
                          f"character (a holder identity read from a Lease is cut and cleaned "
                          f"so; this one would not read back as itself)")
    if e.enabled and e.lease_duration_s > MAX_LEASE_DURATION_S:
        raise ConfigError(SETTINGS_BY_KEY["lease_duration_s"].env, e.lease_duration_s,
                          f"at most {MAX_LEASE_DURATION_S} (the Lease holds it as an int32)")
    needed = e.renew_deadline_s + e.retry_period_s + e.request_timeout_s
    if e.enabled and e.lease_duration_s <= needed:
        raise ConfigError(
            SETTINGS_BY_KEY["lease_duration_s"].env, e.lease_duration_s,
            f"must be longer than renew deadline + retry period + request timeout "
            f"({e.renew_deadline_s:g} + {e.retry_period_s:g} + {e.request_timeout_s:g}"
            f" = {needed:g} s), or a deposed leader could still be writing when another takes over",
        )
    if e.shards > MAX_SHARDS:
        raise ConfigError(SETTINGS_BY_KEY["shards"].env, e.shards,
                          f"at most {MAX_SHARDS} (every replica reads every shard's Lease "
                          f"each retry period)")
    if e.shards > 1 and not e.enabled:
        raise ConfigError(SETTINGS_BY_KEY["shards"].env, e.shards,
                          "shards are Leases: more than one needs leader election on")
    if e.enabled and e.retry_period_s >= e.renew_deadline_s:
        raise ConfigError(SETTINGS_BY_KEY["retry_period_s"].env, e.retry_period_s,
                          "must be shorter than the renew deadline")


def _check_logging(level: str, fmt: str) -> None:
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise ConfigError(SETTINGS_BY_KEY["log_level"].env, level,
                          "expected DEBUG, INFO, WARNING or ERROR")
    if fmt not in ("text", "json"):
        raise ConfigError(SETTINGS_BY_KEY["log_format"].env, fmt, "expected text or json")


@dataclass(frozen=True, slots=True)
class OperatorSettings:
    """`convergerd operator`: the cluster it runs in, its Lease, its HTTP port, its periods."""

    context: str | None  # None: in-cluster config
    clusters: ClusterAccess
    election: Election  # home_context is `context`: the Lease lives in the operated cluster
    http_host: str
    http_port: int
    recheck_s: float
    probe_interval_s: float
    probe_delay_s: float
    grace_period_s: float
    log_level: str
    admission_read_s: float
    log_format: str
    http: HttpLimits = field(default_factory=HttpLimits)
    cache_max_bytes: int = DEFAULT_OPERATOR_CACHE_MAX_BYTES


def load_operator_settings(
    env: Mapping[str, str], flags: Mapping[str, str | None] | None = None
) -> OperatorSettings:
    """The operator's settings from the environment, overridden by flags (by setting key)."""
    table = (*OPERATOR_SETTINGS, *(SETTINGS_BY_KEY[k] for k in OPERATOR_SHARED_KEYS))
    values: dict[str, str | None] = {s.env: env.get(s.env) for s in table}
    for key, value in (flags or {}).items():
        if value is not None:
            values[SETTINGS_BY_KEY[key].env] = value
    v = {s.key: _read(values, s) for s in table}
    context = v["operator_context"]
    if context is not None and v["kubeconfig"] is None:
        raise ConfigError(SETTINGS_BY_KEY["kubeconfig"].env, None,
                          f"required with --context {context!r}: the kubeconfig holding it "
                          "(or leave --context unset for in-cluster config)")
    settings = OperatorSettings(
        context=context,
        clusters=ClusterAccess(
            kubeconfig=v["kubeconfig"], request_timeout_s=v["request_timeout_s"],
            connect_timeout_s=v["connect_timeout_s"], qps=v["cluster_qps"],
            burst=v["cluster_burst"], apply_concurrency=4,
            allow_insecure=v["allow_insecure_clusters"],
            max_response_bytes=v["max_response_bytes"],
        ),
        election=Election(
            enabled=v["leader_election"], home_context=context,
            lease_name=v["operator_lease_name"], lease_namespace=v["operator_lease_namespace"],
            identity=v["identity"] or default_identity(),
            lease_duration_s=v["lease_duration_s"], renew_deadline_s=v["renew_deadline_s"],
            retry_period_s=v["retry_period_s"], request_timeout_s=v["lease_request_timeout_s"],
        ),
        http_host=v["operator_http_addr"][0],
        http_port=v["operator_http_addr"][1],
        recheck_s=v["operator_recheck_s"],
        probe_interval_s=v["operator_probe_minutes"] * 60.0,
        probe_delay_s=v["operator_probe_delay_s"],
        admission_read_s=v["operator_admission_read_s"],
        grace_period_s=v["grace_period_s"],
        log_level=v["log_level"],
        log_format=v["log_format"],
        http=_http_limits(v),
        cache_max_bytes=v["operator_cache_max_bytes"],
    )
    _check_election(settings.election)
    _check_logging(settings.log_level, settings.log_format)
    return settings


def in_cluster() -> bool:
    """True inside a Kubernetes pod (the service account's environment is present)."""
    return "KUBERNETES_SERVICE_HOST" in os.environ


# ---------------------------------------------------------------------------------------------
# Tuning: what shapes the scheduling of 10,000 clusters (how hung clusters are handled, how
# often the prober asks, how much status reading costs, how a save is spread). Not environment
# variables: each value was measured at 10,000 clusters (bench/RESULTS.md) and is changed by
# changing it here, in the one place its default is written. The daemon's wiring
# (`convergerd.runtime`) hands each component its group; a component built without one (a
# test) gets these defaults.


@dataclass(frozen=True, slots=True)
class SlotTuning:
    """The slots of one fan-out over clusters, a round's or a save's (`convergerd.slots`)."""

    # A holder waits for its first answer at least this long, however fast the answers seen
    # so far...
    patience_floor_s: float = 1.0
    # ...and at least this many times the moving average of the answers seen...
    patience_factor: float = 4.0
    # ...each new answer weighing this much in it.
    patience_weight: float = 0.05
    # One slot in this many goes to the suspects' lane: a tenth of the fleet hung at 10,000
    # clusters then costs those clusters' timeouts in their lane, not the healthy clusters' wait.
    suspect_slot_share: int = 8
    # Holders that may wait aside at once, per slot: beyond them, holders that hear nothing keep
    # their slots (so hung clusters never multiply the work in flight without bound).
    aside_per_slot: int = 4


@dataclass(frozen=True, slots=True)
class ProberTuning:
    """The reachability prober's pace (`convergerd.status.probe`); its period is
    `Settings.probe_period_s`."""

    # Another request's answer excuses a probe when it came within this share of the period.
    skip_within_periods: float = 0.5
    # A save's fan-out about to reach a cluster excuses its probe for at most this share of the
    # period from the fan-out's start (its own answer then excuses the next): a save over 10,000
    # clusters and a pass of 10,000 probes at once cost the daemon and the clusters much more
    # CPU than the save alone, and the save's answer says what the probe would have.
    expected_within_periods: float = 1.0
    # A pass starts its probes over this share of the period, so the last started has its
    # timeout left before the next pass (5 s + 5 s with the defaults).
    spread_periods: float = 0.5
    # Probes are started in batches this far apart: a timer per batch, not per probe.
    batch_s: float = 0.05
    # Probes in flight at once to clusters that answered the last pass (or are new): answers
    # come in milliseconds, so this bounds the pace only when the clusters or this process are
    # slow to answer, and then it slows the pass down rather than piling up requests (three
    # replicas probing 10,000 clusters of one simulator each at 1,000 a second, unbounded,
    # drowned it: no Lease could be taken).
    concurrency: int = 64
    # Probes in flight at once to clusters the last pass found unreachable: they mostly wait
    # out their timeout, costing a connection and no CPU, so a tenth of 10,000 clusters hung
    # (~1,000 waiting at once) does not hold the answering ones back.
    max_silent_in_flight: int = 4096
    # A cluster silent on consecutive probes is probed every other pass, then every fourth...
    # (doubling), at most every this many passes: a dead or hung cluster costs a connection
    # and a TLS handshake per probe on both sides (a hung one is never kept warm), 100 a second
    # for 1,000 of them at the default period, while each round tries it anyway and any answer
    # it gets there marks it reached at the next pass.
    silent_max_passes: int = 6


@dataclass(frozen=True, slots=True)
class StatusReadTuning:
    """What reading the status costs the daemon (`convergerd.api.server.Views`); the read
    budget's rate is `Settings.status_reads_per_s`."""

    # The per-cluster and per-policy views (and /readyz) read the database through one gate: at
    # most this many queries in flight (the pool has 5 connections, the round needs them)...
    db_concurrency: int = 2
    # ...each request waiting at most this long for the gate and its query together.
    db_timeout_s: float = 2.0
    # /status is built once for many requests: a body is served while the state has not changed
    # since and it is at most this old (100 clients polling cost one build a second)...
    reuse_s: float = 1.0
    # ...and changed or not while it is younger than this many times the event loop time its
    # build took (the reachability prober changes the state many times a second). Builds then
    # take at most ~1/reuse_builds of the loop, which the rounds share, whatever the fleet
    # size, and an answer is at most max(reuse_s, reuse_builds x build) old.
    reuse_builds: float = 10.0
    # The exposition is reused by the same rule, but never once older than this: a cluster seen
    # down must read `convergerd_cluster_up 0` within seconds of the status showing it, even
    # when a busy loop made the last render slow (at 10,000 x 100 a slow render once kept a
    # down cluster at 1 for tens of seconds after the status showed it: bench/RESULTS.md,
    # "Figures once quoted in the code").
    metrics_reuse_max_s: float = 5.0
    # A build yields to the loop after every this many clusters (a few milliseconds of work).
    slice_clusters: int = 500
    # The status views share one token bucket, bursts of this many times the rate: past it a
    # read is answered 429 at once, which costs the loop far less than serving it.
    burst_factor: float = 2.0
    # A view costs one token, plus one per this many rows it built (a policy's view over many
    # clusters costs far more than a cluster's of a few policies: bench/RESULTS.md, "Figures
    # once quoted in the code"): the budget bounds work, not requests.
    rows_per_token: int = 100


@dataclass(frozen=True, slots=True)
class SpreadTuning:
    """A save spread over the shards' holders (`convergerd.delivery.spread.Peers`)."""

    # Of a save's deadline, how long the requester waits for its peers' parts; the rest is for
    # writing what they left over (a dead holder's clusters: 1/R of the fleet with R replicas).
    peer_share: float = 0.5
    # How often the requester checks its parts, and a holder looks for parts, without a
    # notification (one was lost, or the listening connection is being re-established).
    poll_s: float = 0.5
    # Parts claimed per pass...
    max_claimed: int = 64
    # ...and items read per part (a fleet is 10,000 clusters).
    max_part_items: int = 200_000


@dataclass(frozen=True, slots=True)
class RoundTuning:
    """The round loop (`convergerd.delivery.rounds.RoundLoop`) and the status sync beside it."""

    # Waiting for the database: from this long up to `db_backoff_cap_s` between attempts (full
    # jitter, `retry.backoff_s`), at startup and within a round alike.
    db_backoff_base_s: float = 1.0
    db_backoff_cap_s: float = 30.0
    # Rounds the database missed while it was down, kept to record later: the newest matter most.
    unrecorded_backlog: int = 10
    # ...and at most this many deliveries and phase readings across them (the newest round is
    # always kept): a round at 10,000 clusters x 100 policies holds 2,000,000, hundreds of MB
    # (bench/RESULTS.md, "Figures once quoted in the code"), so ten of them would be
    # gigabytes; at that size only the newest waits, at 2,000 x 50 all ten do.
    unrecorded_details: int = 2_000_000
    # The loop is stuck (`/healthz` fails) after this many intervals without a round starting
    # or ending while it leads: a round ends within its deadline (a fraction of the interval)
    # and the next one starts one interval after the last one did. Time spent waiting on the
    # database does not count: each call is bounded by the store's own timeouts, and a database
    # that is down or locked is not fixed by a restart (`/readyz` reports it).
    stuck_after_intervals: float = 2.0
    # The database sync of the live status (every replica): at most this long between passes
    # (and at most a converge interval).
    status_sync_period_s: float = 30.0


@dataclass(frozen=True, slots=True)
class Tuning:
    """Every group above, as the daemon passes them on (`Settings.tuning`)."""

    slots: SlotTuning = field(default_factory=SlotTuning)
    prober: ProberTuning = field(default_factory=ProberTuning)
    status_reads: StatusReadTuning = field(default_factory=StatusReadTuning)
    spread: SpreadTuning = field(default_factory=SpreadTuning)
    rounds: RoundTuning = field(default_factory=RoundTuning)
