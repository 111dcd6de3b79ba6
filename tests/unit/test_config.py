"""Settings from the environment and flags (docs/design.md, "Settings"): defaults, units, clear
errors, and secrets that never leak."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from convergerd.api.server import secrets_of
from convergerd.config import (
    MAX_SECRET_FILE_BYTES,
    dsn_secrets,
    load_operator_settings,
    load_settings,
    redact_dsn,
    secrets_in_flags,
)
from convergerd.core.errors import ConfigError

ALL_INTERFACES = "0.0.0.0"  # noqa: S104 - the documented default listen address
DSN = "postgresql://convergerd:s3cr3t-pw@db.example:5432/policies"


def test_defaults() -> None:
    s = load_settings({})
    assert s.rounds.interval_s == 300.0
    assert s.rounds.once is False
    assert 0 < s.rounds.deadline_s < s.rounds.interval_s
    assert s.election.enabled is True
    assert (s.election.lease_duration_s, s.election.renew_deadline_s,
            s.election.retry_period_s) == (15.0, 10.0, 2.0)
    assert (s.election.lease_name, s.election.lease_namespace) == ("convergerd",
                                                                    "stackship-system")
    assert s.election.home_context is None
    assert (s.http_host, s.http_port) == (ALL_INTERFACES, 8080)
    assert s.database_url is None
    assert s.api_token is None
    assert (s.probe_period_s, s.status_reads_per_s) == (10.0, 20.0)


def test_default_identity_is_unique_per_start() -> None:
    assert load_settings({}).election.identity != load_settings({}).election.identity


def test_identity_can_be_set() -> None:
    assert load_settings({"CONVERGERD_IDENTITY": "replica-1"}).election.identity == "replica-1"


@pytest.mark.parametrize("identity", ["r" * 129, "replica\x1b[31m", "a\u202eb"])
def test_an_identity_that_would_not_read_back_from_a_lease_is_refused(identity: str) -> None:
    """A holder identity read from a Lease is cleaned and cut to 128 characters: ours must
    read back as itself, or this replica would never recognise its own Lease."""
    with pytest.raises(ConfigError, match="CONVERGERD_IDENTITY") as refused:
        load_settings({"CONVERGERD_IDENTITY": identity})
    assert "128" in str(refused.value)
    assert len(str(refused.value)) < 400
    assert load_settings({"CONVERGERD_IDENTITY": "r" * 128}).election.identity == "r" * 128


@pytest.mark.parametrize(
    ("minutes", "seconds"), [("0.1", 6.0), ("1", 60.0), ("5", 300.0), ("2.5", 150.0)]
)
def test_interval_minutes_allow_decimals(minutes: str, seconds: float) -> None:
    s = load_settings({"Policies__ConvergeIntervalMinutes": minutes})
    assert s.rounds.interval_s == pytest.approx(seconds)
    assert s.rounds.deadline_s < s.rounds.interval_s


@pytest.mark.parametrize(("raw", "once"), [("true", True), ("True", True), ("false", False)])
def test_converge_once(raw: str, once: bool) -> None:
    assert load_settings({"Policies__ConvergeOnce": raw}).rounds.once is once


@pytest.mark.parametrize(
    ("addr", "host", "port"),
    [
        (":9090", ALL_INTERFACES, 9090),
        ("127.0.0.1:8081", "127.0.0.1", 8081),
        ("[::1]:80", "::1", 80),
    ],
)
def test_http_addr(addr: str, host: str, port: int) -> None:
    s = load_settings({"CONVERGERD_HTTP_ADDR": addr})
    assert (s.http_host, s.http_port) == (host, port)


def test_leader_election_can_be_turned_off() -> None:
    assert load_settings({"CONVERGERD_LEADER_ELECTION": "false"}).election.enabled is False


@pytest.mark.parametrize(
    ("env", "value"),
    [
        ("Policies__ConvergeIntervalMinutes", "abc"),
        ("Policies__ConvergeIntervalMinutes", "-1"),
        ("Policies__ConvergeIntervalMinutes", "0"),
        ("Policies__ConvergeIntervalMinutes", "nan"),
        ("Policies__ConvergeIntervalMinutes", "inf"),
        ("Policies__ConvergeIntervalMinutes", ""),
        ("Policies__ConvergeOnce", "sometimes"),
        ("CONVERGERD_HTTP_ADDR", "nope"),
        ("CONVERGERD_HTTP_ADDR", "host:"),
        ("CONVERGERD_HTTP_ADDR", "host:99999"),
        ("CONVERGERD_LEADER_ELECTION", "maybe"),
        ("CONVERGERD_CLUSTER_CONCURRENCY", "0"),
        ("CONVERGERD_CLUSTER_CONCURRENCY", "1.5"),
        ("CONVERGERD_REQUEST_TIMEOUT_SECONDS", "-3"),
        ("CONVERGERD_LEASE_DURATION_SECONDS", "fifteen"),
        ("CONVERGERD_ROUND_DEADLINE_FRACTION", "1"),
        ("CONVERGERD_ROUND_DEADLINE_FRACTION", "1.5"),
        ("CONVERGERD_LOG_LEVEL", "LOUD"),
        ("CONVERGERD_LOG_FORMAT", "xml"),
        ("CONVERGERD_LEASE_NAME", "   "),
        ("CONVERGERD_ALLOW_INSECURE_CLUSTERS", "sometimes"),
        ("CONVERGERD_PROBE_PERIOD_SECONDS", "0"),
        ("CONVERGERD_PROBE_PERIOD_SECONDS", "soon"),
        ("CONVERGERD_STATUS_READS_PER_SECOND", "-1"),
        ("CONVERGERD_STATUS_READS_PER_SECOND", "lots"),
    ],
)
def test_bad_value_is_an_error_naming_the_setting(env: str, value: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings({env: value})
    assert caught.value.setting == env
    assert str(caught.value).startswith(env)


def test_bad_value_is_shown_in_the_message_for_ordinary_settings() -> None:
    with pytest.raises(ConfigError, match=r"Policies__ConvergeIntervalMinutes='abc'"):
        load_settings({"Policies__ConvergeIntervalMinutes": "abc"})


@pytest.mark.parametrize(
    "dsn",
    [
        "mysql://convergerd:s3cr3t-pw@db.example/policies",
        "convergerd:s3cr3t-pw@db.example/policies",
        "s3cr3t-pw",
        "http://convergerd:s3cr3t-pw@db.example/policies",
    ],
)
def test_non_postgres_dsn_is_rejected_without_echoing_it(dsn: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings({"CONVERGERD_DATABASE_URL": dsn})
    assert caught.value.setting == "CONVERGERD_DATABASE_URL"
    assert "s3cr3t-pw" not in str(caught.value)
    assert "s3cr3t-pw" not in repr(caught.value.value)
    assert "postgresql://" in str(caught.value)  # says what is expected


@pytest.mark.parametrize(
    "dsn",
    [
        "postgresql://convergerd:s3cr3t-pw@db.example:notaport/policies",
        "postgresql://convergerd:s3cr3t-pw@db.example:99999/policies",
        "postgresql://convergerd:s3cr3t-pw@h1:5432,h2:x/policies",
        "postgresql://convergerd:s3cr3t-pw@[::1]:port/policies",
    ],
)
def test_dsn_with_a_bad_port_is_a_startup_error(dsn: str) -> None:
    """Not a database that is "unavailable" and retried forever (run), nor a traceback
    (migrate, import): a setting error naming the setting, without the password."""
    with pytest.raises(ConfigError) as caught:
        load_settings({"CONVERGERD_DATABASE_URL": dsn})
    assert caught.value.setting == "CONVERGERD_DATABASE_URL"
    assert "s3cr3t-pw" not in str(caught.value)
    assert "port" in str(caught.value)


def test_empty_api_token_is_rejected_without_echoing_it() -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings({"CONVERGERD_API_TOKEN": "  \t "})
    assert caught.value.setting == "CONVERGERD_API_TOKEN"
    assert "\\t" not in str(caught.value)


@pytest.mark.parametrize("dsn", [
    DSN, "postgres://u:s3cr3t-pw@h/db", "postgresql://u:p@h1:5432,h2:5433/db",
    "postgresql://u:p@[::1]:5432/db", "postgresql:///db?host=/run/postgresql",
    "postgresql://u:p:w@h@h:5432/db",
])
def test_postgres_dsn_is_accepted(dsn: str) -> None:
    assert load_settings({"CONVERGERD_DATABASE_URL": dsn}).database_url == dsn


@pytest.mark.parametrize(
    ("lease", "ok"),
    [("15", True), ("14.5", True), ("14", False), ("10", False), ("3", False)],
)
def test_lease_must_outlast_renew_deadline_retry_and_request_timeout(lease: str, ok: bool) -> None:
    env = {"CONVERGERD_LEASE_DURATION_SECONDS": lease}
    if ok:
        assert load_settings(env).election.lease_duration_s == float(lease)
        return
    with pytest.raises(ConfigError) as caught:
        load_settings(env)
    assert caught.value.setting == "CONVERGERD_LEASE_DURATION_SECONDS"
    assert "CONVERGERD_LEASE_DURATION_SECONDS" in str(caught.value)
    assert "14" in str(caught.value)  # the sum it must exceed: 10 + 2 + 2


@pytest.mark.parametrize(("lease", "ok"), [("2147483647", True), ("2147483647.5", False),
                                           ("1e12", False)])
def test_lease_duration_fits_the_leases_int32(lease: str, ok: bool) -> None:
    """Before: accepted, then every Lease write refused by the API server (leaseDurationSeconds
    above int32) and no replica ever led."""
    env = {"CONVERGERD_LEASE_DURATION_SECONDS": lease}
    if ok:
        assert load_settings(env).election.lease_duration_s == float(lease)
        return
    with pytest.raises(ConfigError, match=r"CONVERGERD_LEASE_DURATION_SECONDS.*int32"):
        load_settings(env)


def test_lease_rule_follows_the_other_timings() -> None:
    env = {
        "CONVERGERD_LEASE_DURATION_SECONDS": "30",
        "CONVERGERD_RENEW_DEADLINE_SECONDS": "20",
        "CONVERGERD_RETRY_PERIOD_SECONDS": "5",
        "CONVERGERD_LEASE_REQUEST_TIMEOUT_SECONDS": "5",
    }
    with pytest.raises(ConfigError, match="CONVERGERD_LEASE_DURATION_SECONDS"):
        load_settings(env)
    assert load_settings({**env, "CONVERGERD_LEASE_DURATION_SECONDS": "31"}).election.enabled


def test_lease_timings_are_not_checked_without_leader_election() -> None:
    s = load_settings(
        {"CONVERGERD_LEADER_ELECTION": "false", "CONVERGERD_LEASE_DURATION_SECONDS": "5"}
    )
    assert s.election.enabled is False


def test_flags_override_env() -> None:
    env = {
        "Policies__ConvergeIntervalMinutes": "5",
        "CONVERGERD_HTTP_ADDR": ":8080",
        "CONVERGERD_LEADER_ELECTION": "true",
    }
    s = load_settings(
        env, {"interval_minutes": "0.5", "http_addr": ":9999", "leader_election": "false"}
    )
    assert s.rounds.interval_s == pytest.approx(30.0)
    assert s.http_port == 9999
    assert s.election.enabled is False


def test_unset_flags_leave_env_in_place() -> None:
    s = load_settings({"CONVERGERD_HTTP_ADDR": ":8181"}, {"http_addr": None})
    assert s.http_port == 8181


def test_bad_flag_value_names_the_setting() -> None:
    with pytest.raises(ConfigError, match="Policies__ConvergeIntervalMinutes"):
        load_settings({}, {"interval_minutes": "soon"})


def test_secrets_never_appear_in_repr() -> None:
    s = load_settings({"CONVERGERD_DATABASE_URL": DSN, "CONVERGERD_API_TOKEN": "tok-123456"})
    shown = repr(s)
    assert "s3cr3t-pw" not in shown
    assert "tok-123456" not in shown
    assert s.api_token == "tok-123456"


def test_database_url_redacted_keeps_everything_but_the_password() -> None:
    s = load_settings({"CONVERGERD_DATABASE_URL": DSN})
    assert s.database_url_redacted == "postgresql://convergerd:***@db.example:5432/policies"
    assert load_settings({}).database_url_redacted is None


@pytest.mark.parametrize(
    ("dsn", "redacted"),
    [
        ("postgresql://u@h/db", "postgresql://u@h/db"),
        ("postgresql://h/db", "postgresql://h/db"),
        ("postgresql://u:p%40ss@h/db", "postgresql://u:***@h/db"),
        ("postgresql://u:p:w@h/db", "postgresql://u:***@h/db"),
        # libpq also takes the password as a query parameter
        ("postgresql://u@h/db?password=s3cr3t-pw&sslmode=require",
         "postgresql://u@h/db?password=***&sslmode=require"),
        # ... and the client key's password
        ("postgresql://u@h/db?sslmode=verify-full&sslpassword=k3y-pw",
         "postgresql://u@h/db?sslmode=verify-full&sslpassword=***"),
    ],
)
def test_redact_dsn(dsn: str, redacted: str) -> None:
    assert redact_dsn(dsn) == redacted


def test_dsn_secrets_lists_every_password_form() -> None:
    dsn = "postgresql://u:p%40ss@h/db?password=q-pw&sslpassword=k3y-pw"
    assert dsn_secrets(dsn) == sorted({"p%40ss", "p@ss", "q-pw", "k3y-pw"})
    assert dsn_secrets("postgresql://u@h/db?sslmode=require") == []


def test_insecure_clusters_are_refused_by_default() -> None:
    assert load_settings({}).clusters.allow_insecure is False
    assert load_settings({"CONVERGERD_ALLOW_INSECURE_CLUSTERS": "true"}).clusters.allow_insecure
    assert load_settings({}, {"allow_insecure_clusters": "true"}).clusters.allow_insecure


TOKEN = "tok-from-a-file-123"


@pytest.fixture
def secret_files(tmp_path: Path) -> tuple[Path, Path]:
    dsn_file, token_file = tmp_path / "dsn", tmp_path / "token"
    dsn_file.write_text(f"  {DSN}\n")  # as `kubectl create secret --from-file` often has it
    token_file.write_text(f"{TOKEN}\n\n")
    return dsn_file, token_file


def test_secrets_are_read_from_files_whitespace_stripped(
    secret_files: tuple[Path, Path]
) -> None:
    dsn_file, token_file = secret_files
    s = load_settings({"CONVERGERD_DATABASE_URL_FILE": str(dsn_file),
                       "CONVERGERD_API_TOKEN_FILE": str(token_file)})
    assert (s.database_url, s.api_token) == (DSN, TOKEN)
    flagged = load_settings({}, {"database_url_file": str(dsn_file),
                                 "api_token_file": str(token_file)})
    assert (flagged.database_url, flagged.api_token) == (DSN, TOKEN)


def test_secrets_from_files_are_scrubbed_like_any_other(secret_files: tuple[Path, Path]) -> None:
    dsn_file, token_file = secret_files
    s = load_settings({"CONVERGERD_DATABASE_URL_FILE": str(dsn_file),
                       "CONVERGERD_API_TOKEN_FILE": str(token_file)})
    assert {TOKEN, "s3cr3t-pw"} <= set(secrets_of(s))
    assert s.database_url_redacted == "postgresql://convergerd:***@db.example:5432/policies"
    assert TOKEN not in repr(s)
    assert "s3cr3t-pw" not in repr(s)


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (None, "cannot read: No such file or directory"),
        (b" \n\t\n", "the file is empty"),
        (b"s3cr3t-pw\xff", "not UTF-8 text"),
        (b"s3cr3t-pw" * (MAX_SECRET_FILE_BYTES // 9 + 1),
         f"more than {MAX_SECRET_FILE_BYTES} bytes"),
    ],
)
@pytest.mark.parametrize("setting", ["CONVERGERD_DATABASE_URL_FILE", "CONVERGERD_API_TOKEN_FILE"])
def test_an_unusable_secret_file_is_a_startup_error_naming_setting_and_path(
    tmp_path: Path, setting: str, content: bytes | None, problem: str
) -> None:
    path = tmp_path / "secret"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(ConfigError) as caught:
        load_settings({setting: str(path)})
    assert caught.value.setting == setting
    assert str(caught.value).startswith(f"{setting}={str(path)!r}: ")
    assert problem in str(caught.value)
    assert "s3cr3t-pw" not in str(caught.value)


def test_a_directory_as_secret_file_is_a_startup_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"CONVERGERD_API_TOKEN_FILE=.*not a regular file"):
        load_settings({"CONVERGERD_API_TOKEN_FILE": str(tmp_path)})


@pytest.mark.parametrize("special", ["fifo", "/dev/zero"])
def test_a_pipe_or_device_as_secret_file_is_refused_without_reading_it(
    tmp_path: Path, special: str
) -> None:
    """A named pipe with no writer would block startup in open(); /dev/zero never ends."""
    path = tmp_path / special
    if special == "fifo":
        os.mkfifo(path)
    with pytest.raises(ConfigError, match=r"CONVERGERD_DATABASE_URL_FILE=.*: not a regular "
                                          r"file \(a directory, pipe or device\)"):
        load_settings({"CONVERGERD_DATABASE_URL_FILE": str(path)})


def test_a_file_with_a_bad_dsn_names_the_file_setting_not_the_content(tmp_path: Path) -> None:
    path = tmp_path / "dsn"
    path.write_text("mysql://u:s3cr3t-pw@h/db")
    with pytest.raises(ConfigError) as caught:
        load_settings({"CONVERGERD_DATABASE_URL_FILE": str(path)})
    assert caught.value.setting == "CONVERGERD_DATABASE_URL_FILE"
    assert str(path) in str(caught.value)
    assert "s3cr3t-pw" not in str(caught.value)


@pytest.mark.parametrize(
    ("env", "flags"),
    [
        ({"CONVERGERD_API_TOKEN": "given-tok-42", "CONVERGERD_API_TOKEN_FILE": "{token}"}, {}),
        ({"CONVERGERD_API_TOKEN_FILE": "{token}"}, {"api_token": "given-tok-42"}),
        ({"CONVERGERD_API_TOKEN": "given-tok-42"}, {"api_token_file": "{token}"}),
    ],
)
def test_a_secret_given_both_ways_is_an_error_naming_both(
    secret_files: tuple[Path, Path], env: dict[str, str], flags: dict[str, str]
) -> None:
    token_file = str(secret_files[1])
    env = {k: v.format(token=token_file) for k, v in env.items()}
    flags = {k: v.format(token=token_file) for k, v in flags.items()}
    with pytest.raises(ConfigError) as caught:
        load_settings(env, flags)
    assert "CONVERGERD_API_TOKEN_FILE" in str(caught.value)
    assert "CONVERGERD_API_TOKEN " in str(caught.value)
    assert "given-tok-42" not in str(caught.value)
    assert TOKEN not in str(caught.value)


def test_both_ways_for_the_database_url_too(secret_files: tuple[Path, Path]) -> None:
    with pytest.raises(ConfigError, match="CONVERGERD_DATABASE_URL_FILE=.*CONVERGERD_DATABASE_URL "
                       r"\(--database-url\) is set too") as caught:
        load_settings({"CONVERGERD_DATABASE_URL": DSN,
                       "CONVERGERD_DATABASE_URL_FILE": str(secret_files[0])})
    assert "s3cr3t-pw" not in str(caught.value)


def test_secrets_given_as_flags_are_named() -> None:
    flags: dict[str, str | None] = {"api_token": "tok", "database_url": None,
                                    "api_token_file": "/run/token", "http_addr": ":1"}
    assert [s.flag for s in secrets_in_flags(flags)] == ["--api-token"]
    assert [s.flag for s in secrets_in_flags({"database_url": DSN})] == ["--database-url"]


def test_import_size_limit_defaults_to_4_mib_and_is_checked() -> None:
    assert load_settings({}).import_max_bytes == 4 * 1024 * 1024
    assert load_settings({"CONVERGERD_IMPORT_MAX_BYTES": "100"}).import_max_bytes == 100
    assert load_settings({}, {"import_max_bytes": "7"}).import_max_bytes == 7
    for bad in ("0", "-1", "4MiB", "1.5", ""):
        with pytest.raises(ConfigError) as caught:
            load_settings({"CONVERGERD_IMPORT_MAX_BYTES": bad})
        assert caught.value.setting == "CONVERGERD_IMPORT_MAX_BYTES"


def test_shards_default_to_one_lease() -> None:
    s = load_settings({})
    assert (s.election.shards, s.election.lease_name) == (1, "convergerd")
    assert load_settings({"CONVERGERD_SHARDS": "12"}).election.shards == 12


@pytest.mark.parametrize(("env", "match"), [
    ({"CONVERGERD_SHARDS": "0"}, "CONVERGERD_SHARDS"),
    ({"CONVERGERD_SHARDS": "257"}, "at most 256"),
    ({"CONVERGERD_SHARDS": "3", "CONVERGERD_LEADER_ELECTION": "false"}, "leader election on"),
])
def test_bad_shards(env: dict[str, str], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load_settings(env)


@pytest.mark.parametrize(("value", "ok"), [("262144", True), ("67108864", True),
                                           ("262143", False), ("0", False), ("64Mi", False)])
def test_the_operators_cache_budget_has_a_floor(value: str, ok: bool) -> None:
    env = {"CONVERGERD_OPERATOR_CACHE_MAX_BYTES": value}
    if ok:
        assert load_operator_settings(env).cache_max_bytes == int(value)
        return
    with pytest.raises(ConfigError, match="CONVERGERD_OPERATOR_CACHE_MAX_BYTES"):
        load_operator_settings(env)


def test_the_operators_cache_budget_defaults_to_64_mib() -> None:
    assert load_operator_settings({}).cache_max_bytes == 64 * 2**20


# Settings that go into a Lease, a request path or header, or a file name: checked at start,
# the error naming the setting and showing the value escaped and bounded.
@pytest.mark.parametrize(("env", "value"), [
    ("CONVERGERD_IDENTITY", "replica-a\nINFO forged line"),
    ("CONVERGERD_IDENTITY", "replica a"),
    ("CONVERGERD_IDENTITY", "r" * 129),
    ("CONVERGERD_IDENTITY", "rep\x1b[31m"),
    ("CONVERGERD_LEASE_NAME", "convergerd\nleader"),
    ("CONVERGERD_LEASE_NAME", "../leases/other"),
    ("CONVERGERD_LEASE_NAME", "Convergerd"),
    ("CONVERGERD_LEASE_NAMESPACE", "../kube-system"),
    ("CONVERGERD_LEASE_NAMESPACE", "stackship-system/leases"),
    ("CONVERGERD_LEASE_NAMESPACE", "a.b"),
    ("CONVERGERD_HOME_CONTEXT", "home\nctx"),
    ("CONVERGERD_KUBECONFIG", "/etc/kube\x00config"),
    ("CONVERGERD_API_TOKEN_FILE", "/run/token\n"),
])
def test_names_identities_and_paths_are_checked_at_start(env: str, value: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings({env: value})
    message = str(caught.value)
    assert message.startswith(f"{env}=")
    for raw in ("\n", "\x1b", "\x00"):
        assert raw not in message
    assert len(message) < 400
    if value.isprintable():
        assert value[:40] in message  # the value is shown (printable: as itself)


@pytest.mark.parametrize(("env", "value"), [
    ("CONVERGERD_OPERATOR_LEASE_NAME", "op\nerator"),
    ("CONVERGERD_OPERATOR_LEASE_NAMESPACE", "../x"),
    ("CONVERGERD_OPERATOR_CONTEXT", "ctx\r\nX: y"),
    ("CONVERGERD_IDENTITY", "op\nerator"),
])
def test_the_operators_names_are_checked_too(env: str, value: str) -> None:
    with pytest.raises(ConfigError, match=f"^{env}="):
        load_operator_settings({env: value, "CONVERGERD_KUBECONFIG": "/k"})


def test_a_token_that_cannot_go_in_a_header_is_refused_without_showing_it() -> None:
    for token in ("tok with space-123", "tok\r\nX-Forged: 1", "tök-123456"):
        with pytest.raises(ConfigError) as caught:
            load_settings({"CONVERGERD_API_TOKEN": token})
        message = str(caught.value)
        assert message.startswith("CONVERGERD_API_TOKEN='<redacted>': ")
        assert "tok" not in message


@pytest.mark.parametrize(("env", "value"), [
    ("CONVERGERD_IDENTITY", "convergerd-7f9c6d-abcde_1.example:0"),
    ("CONVERGERD_LEASE_NAME", "convergerd.team-a"),
    ("CONVERGERD_LEASE_NAMESPACE", "stackship-system"),
    ("CONVERGERD_HOME_CONTEXT", "arn:aws:eks:eu-west-1:123:cluster/home"),
    ("CONVERGERD_API_TOKEN", "b64+/token.~_-=="),
])
def test_usual_names_and_tokens_are_accepted(env: str, value: str) -> None:
    load_settings({env: value})


def test_the_default_identity_is_a_valid_identity() -> None:
    identity = load_settings({}).election.identity
    assert load_settings({"CONVERGERD_IDENTITY": identity}).election.identity == identity
