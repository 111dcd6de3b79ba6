"""`convergerd demo`: the whole product on the embedded default, in one command.

A simulated fleet of a dozen clusters (one down, one slow, one on Kubernetes 1.29, one
without the Policy CRD), a database (CONVERGERD_DATABASE_URL, or a private PostgreSQL started
here), the sample tenants imported, and the daemon converging them with its HTTP server up.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.resources
import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path

from convergerd.config import INTERVAL_ENV, Settings, load_settings
from convergerd.sim.faults import Faults

log = logging.getLogger(__name__)

# Which simulated clusters misbehave, so the demo shows what an admin would see.
DEMO_FAULTS = {
    "c0003": Faults(down=True),
    "c0006": Faults(latency_ms=1500),
    "c0007": Faults(version="v1.29.4"),
    "c0010": Faults(crd=False),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--workdir", type=Path, default=Path(".demo"),
        help="where the kubeconfig and the private database live (default: ./.demo)",
    )
    parser.add_argument(
        "--clusters", type=int, default=12, help="simulated member clusters (default: 12)"
    )
    parser.add_argument(
        "--tenants", type=Path, default=None,
        help="YAML of clusters, boundaries and policies to import (default: the sample tenants)",
    )


@contextlib.asynccontextmanager
async def _database(settings: Settings, workdir: Path) -> AsyncIterator[str]:
    if settings.database_url:
        yield settings.database_url
        return
    from convergerd.demo.pgserver import private_postgres

    log.info("no CONVERGERD_DATABASE_URL: starting a private PostgreSQL in %s", workdir / "pg")
    async with private_postgres(workdir / "pg") as dsn:
        yield dsn


def _tenants_file(args: argparse.Namespace, workdir: Path) -> Path:
    if args.tenants is not None:
        return Path(args.tenants)
    path = workdir / "tenants.yaml"
    path.write_text(
        importlib.resources.files("convergerd.demo").joinpath("tenants.yaml").read_text()
    )
    return path


def _prepare(workdir: Path) -> Path:
    workdir = workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    return workdir


async def run(args: argparse.Namespace, settings: Settings) -> int:
    from convergerd.runtime import Daemon
    from convergerd.sim.fleet import HOME, Fleet, FleetConfig
    from convergerd.store.importer import import_file
    from convergerd.store.schema import migrate

    workdir = _prepare(args.workdir)
    config = FleetConfig(clusters=args.clusters, overrides=DEMO_FAULTS)
    async with Fleet(config, kubeconfig_path=workdir / "kubeconfig") as fleet, \
            _database(settings, workdir) as dsn:
        await migrate(dsn)
        summary = await import_file(dsn, _tenants_file(args, workdir))
        log.info("imported sample tenants: %s", summary)
        token = settings.api_token or "demo-token"
        flags = {
            "database_url": dsn,
            "kubeconfig": str(fleet.kubeconfig_path),
            "home_context": HOME,
            "identity": "demo",
            "api_token": token,
            "http_addr": f"{settings.http_host}:{settings.http_port}",
            "interval_minutes": os.environ.get(INTERVAL_ENV, "0.5"),
        }
        daemon_settings = load_settings(os.environ, flags)
        http = f"http://127.0.0.1:{settings.http_port}"
        print(  # noqa: T201 - the demo's banner is for the person who started it
            f"""
convergerd demo is running ({args.clusters} simulated clusters; Ctrl-C to stop)
  status:        {http}/status      or: convergerd status --addr {http}
  metrics:       {http}/metrics
  a policy:      {http}/v1/policies/no-latest/status
  simulator:     {fleet.admin_url}/_sim/clusters   (inject faults: POST .../faults)
  kubectl:       kubectl --kubeconfig {fleet.kubeconfig_path} --context c0001 get policies
  faults:        c0003 down, c0006 slow (1.5 s), c0007 Kubernetes 1.29, c0010 no Policy CRD
""",
            flush=True,
        )
        return await Daemon(daemon_settings).main()
