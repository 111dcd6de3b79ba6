"""The `convergerd` command. Logging is configured here and nowhere else."""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from convergerd import __version__, eventloop
from convergerd.config import (
    OPERATOR_SETTINGS,
    OPERATOR_SHARED_KEYS,
    SECRET_FILES,
    SETTINGS,
    SETTINGS_BY_KEY,
    Setting,
    load_operator_settings,
    load_settings,
    secrets_in_flags,
)
from convergerd.core.errors import ConfigError, ConvergerdError
from convergerd.core.shown import describe

log = logging.getLogger("convergerd")

EXIT_OK = 0
EXIT_USAGE = 2

_DESCRIPTION = """\
convergerd delivers tenants' admission policies from the policy database into every
Kubernetes cluster they cover, keeps them there, and reports which clusters are lagging,
unreached or not enforcing.

Every setting is an environment variable and a flag; the flag wins.
Start with `convergerd demo` to see it all on a simulated fleet."""


def _add_settings(parser: argparse.ArgumentParser, keys: Sequence[str] | None = None,
                  table: Sequence[Setting] = SETTINGS) -> None:
    group = parser.add_argument_group("settings (environment variable in brackets)")
    for setting in table:
        if keys is not None and setting.key not in keys:
            continue
        default = "" if setting.default is None else f"; default {setting.default}"
        group.add_argument(
            setting.flag, dest=f"setting_{setting.key}", metavar="VALUE",
            help=f"{setting.help} [{setting.env}{default}]",
        )


def _flags(args: argparse.Namespace, **forced: str) -> dict[str, str | None]:
    flags: dict[str, str | None] = {
        key.removeprefix("setting_"): value
        for key, value in vars(args).items()
        if key.startswith("setting_")
    }
    flags.update(forced)
    return flags


def _warn_secret_flags(flags: dict[str, str | None]) -> None:
    """Once, at startup: a secret given as a flag shows in `ps` and in shell history."""
    file_of = {key: SETTINGS_BY_KEY[file_key] for key, file_key in SECRET_FILES.items()}
    for setting in secrets_in_flags(flags):
        instead = file_of.get(setting.key)
        better = f"{instead.env} ({instead.flag}) or " if instead is not None else ""
        log.warning(
            "%s was given on the command line, where `ps` and shell history show it: "
            "use %s%s instead", setting.flag, better, setting.env,
            extra={"setting": setting.env},
        )


class _JsonFormatter(logging.Formatter):
    _STD = frozenset(vars(logging.makeLogRecord({})).keys()) | {"message", "asctime"}

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S%z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update({k: v for k, v in vars(record).items() if k not in self._STD})
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


# Libraries that log an expected outage with a traceback: asyncpg's pool logs one (21 lines) on
# every attempt to restore its connections while the database refuses logins.
ONE_LINE_LOGGERS = ("asyncpg.pool",)


def one_line_errors(record: logging.LogRecord) -> bool:
    """A logging filter: a record's exception becomes the end of its one line (`describe`:
    type, SQLSTATE, escaped and shortened message), not a traceback."""
    if record.exc_info and record.exc_info[1] is not None:
        record.msg = f"{record.getMessage()}: {describe(record.exc_info[1])}"
        record.args = None
        record.exc_info = None
        record.exc_text = None
    return True


def configure_logging(level: str = "INFO", fmt: str = "text") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s")
        )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # The libraries' INFO lines are per request: too noisy for an operator's log.
    for noisy in ("aiohttp.access", "kubernetes_asyncio"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    for name in ONE_LINE_LOGGERS:
        library = logging.getLogger(name)
        if one_line_errors not in library.filters:
            library.addFilter(one_line_errors)


_OPERATOR_DESCRIPTION = """\
The in-cluster operator. It watches the Policy objects convergerd delivers
(policies.platform.stackship.se) and turns each into a ValidatingAdmissionPolicy
`stackship-<policy id>` plus, while the policy is enabled, a binding of the same name that
selects the boundary's namespaces. It reports status.phase (Enforcing, Inert, Unsupported,
Error), the Ready condition, and the Verified condition: whether a dry-run create of a
violating pod in a boundary namespace was really denied.

Runs in the cluster it operates (in-cluster config) or, with --context, against a kubeconfig
context (CONVERGERD_KUBECONFIG). Replicas elect a leader on the Lease convergerd-operator;
only the leader writes. Health and metrics: /healthz, /readyz, /metrics on :8081."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="convergerd", description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"convergerd {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="the daemon: converge rounds under the Lease, HTTP server")
    _add_settings(run)
    once = sub.add_parser(
        "once", help="one converge round, then exit (0 only if every cluster converged)"
    )
    _add_settings(once)

    db_keys = ("database_url", "database_url_file", "log_level", "log_format")
    migrate = sub.add_parser("migrate", help="create or upgrade the database schema")
    _add_settings(migrate, db_keys)
    imp = sub.add_parser("import", help="upsert clusters, boundaries and policies from YAML")
    imp.add_argument("file", type=Path, help="YAML with clusters, boundaries and policies")
    _add_settings(imp, (*db_keys, "import_max_bytes", "exception_max_days"))

    from convergerd.cli import status as statuscli

    status = sub.add_parser("status", help="a running daemon's status as a table")
    statuscli.add_arguments(status)

    from convergerd.cli import exceptions as exceptionscli
    from convergerd.cli import policy as policycli
    from convergerd.cli import policyeval
    from convergerd.cli import revisions as revisionscli

    policy = sub.add_parser(
        "policy", help="one policy: apply or delete it now through a running daemon, grant and "
        "list its exceptions, list its revisions or roll it back, or eval it on objects, a live "
        "cluster or a recorded session", description=policycli.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    policy_sub = policy.add_subparsers(dest="policy_command", required=True, metavar="COMMAND")
    policycli.add_arguments(policy_sub)
    revisionscli.add_arguments(policy_sub)
    exceptionscli.add_arguments(policy_sub)
    policyeval.add_arguments(policy_sub.add_parser(
        "eval", help="evaluate a policy as the operator renders it: on objects (--object), a "
        "live cluster (--context, --record) or a recorded session (--replay)",
        description=policyeval.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter))

    from convergerd.cli import token as tokencli

    token = sub.add_parser(
        "token", help="a boundary's read tokens: create, list, revoke (through a running "
        "daemon, the admin token)", description=tokencli.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    tokencli.add_arguments(token.add_subparsers(dest="token_command", required=True,
                                                metavar="COMMAND"))

    from convergerd.cli import rollout as rolloutcli

    rollout = sub.add_parser(
        "rollout", help="rollouts in waves: status, pause, resume, approve, abort (through a "
        "running daemon)", description=rolloutcli.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    rolloutcli.add_arguments(rollout.add_subparsers(dest="rollout_command", required=True,
                                                    metavar="COMMAND"))

    operator = sub.add_parser(
        "operator", help="the in-cluster operator (Policy -> ValidatingAdmissionPolicy)",
        description=_OPERATOR_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_settings(operator, table=(*OPERATOR_SETTINGS,
                                   *(SETTINGS_BY_KEY[k] for k in OPERATOR_SHARED_KEYS)))

    from convergerd.sim import main as sim_main

    sim = sub.add_parser(
        "sim", help="the fleet simulator: many simulated Kubernetes API servers on loopback"
    )
    sim_main.add_arguments(sim)

    from convergerd import demo

    demo_parser = sub.add_parser(
        "demo", help="simulated fleet + database + daemon on the embedded default, one command"
    )
    demo.add_arguments(demo_parser)
    _add_settings(demo_parser, ("database_url", "http_addr", "interval_minutes", "log_level",
                                "log_format", "api_token", "database_url_file",
                                "api_token_file"))
    return parser


def missing_sim_extra(command: str) -> str | None:
    """The one-line message for `sim`, `demo` and `policy eval` when the `sim` extra is not
    installed (the daemon itself never needs it), else None."""
    if command not in ("sim", "demo", "policy eval"):
        return None
    try:
        import cel_expr_python  # noqa: F401
        import cryptography  # noqa: F401
    except ImportError:
        return (f"convergerd {command} needs the simulator extra, which is not installed: "
                "pip install 'convergerd[sim]'")
    return None


def _command_name(args: argparse.Namespace) -> str:
    """The command as typed: `sim`, or `policy eval` for a command group."""
    command: str = args.command
    if command == "policy":
        return f"{command} {args.policy_command}"
    if command == "rollout":
        return f"{command} {args.rollout_command}"
    return f"{command} {args.token_command}" if command == "token" else command


# Commands that call a running daemon or work offline: their own output, no daemon settings.
_TOOLS = {"status": "cli.status", "policy eval": "cli.policyeval",
          "policy apply": "cli.policy", "policy delete": "cli.policy",
          "policy history": "cli.revisions", "policy rollback": "cli.revisions",
          "policy except": "cli.exceptions", "policy exceptions": "cli.exceptions",
          "token create": "cli.token", "token list": "cli.token", "token revoke": "cli.token",
          **{f"rollout {c}": "cli.rollout"
             for c in ("status", "pause", "resume", "approve", "abort")}}


def _run(args: argparse.Namespace) -> int:  # noqa: PLR0911 - one branch per command
    command = _command_name(args)
    missing = missing_sim_extra(command)
    if missing is not None:
        print(missing, file=sys.stderr)
        return EXIT_USAGE
    tool = _TOOLS.get(command)
    if tool is not None:
        return int(importlib.import_module(f"convergerd.{tool}").run(args))
    if command == "sim":
        configure_logging()
        from convergerd.sim import main as sim_main

        return sim_main.run(args)
    if command == "operator":
        operator_settings = load_operator_settings(os.environ, _flags(args))
        configure_logging(operator_settings.log_level, operator_settings.log_format)
        from convergerd.operator.main import run_operator

        return eventloop.run(run_operator(operator_settings))

    forced = {"once": "true"} if command == "once" else {}
    flags = _flags(args, **forced)
    if command == "demo":
        from convergerd import demo

        demo.default_flags(flags, os.environ)
    settings = load_settings(os.environ, flags)
    configure_logging(settings.log_level, settings.log_format)
    _warn_secret_flags(_flags(args))
    if command in ("run", "once"):
        from convergerd import runtime

        return eventloop.run(runtime.run_daemon(settings))
    if command == "demo":
        from convergerd import demo

        return eventloop.run(demo.run(args, settings))
    if settings.database_url is None:
        raise ConfigError(SETTINGS_BY_KEY["database_url"].env, None, "required for " + command)
    if command == "migrate":
        from convergerd.store.schema import migrate

        applied = eventloop.run(migrate(settings.database_url))
        log.info("schema %s", f"upgraded: {', '.join(applied)}" if applied else "up to date")
        return EXIT_OK
    if command == "import":
        from convergerd.store.importer import import_file

        summary = eventloop.run(
            import_file(settings.database_url, args.file, max_bytes=settings.import_max_bytes,
                        exception_max_days=settings.exception_max_days)
        )
        print(summary)
        return EXIT_OK
    raise AssertionError(command)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _run(args)
    except ConfigError as exc:
        print(f"convergerd: setting error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ConvergerdError as exc:
        print(f"convergerd: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
