"""`convergerd sim`: run the fleet simulator until SIGINT/SIGTERM.

The top-level CLI calls `add_arguments(parser)` to declare the flags and `run(args)` to run;
`python -m convergerd.sim` does the same on its own.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import random
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING

from convergerd import eventloop

if TYPE_CHECKING:
    from convergerd.sim.fleet import FleetConfig

log = logging.getLogger(__name__)

DEFAULT_CLUSTERS = 3
DEFAULT_LISTEN = "127.0.0.1:8181"
DEFAULT_KUBECONFIG = "sim-kubeconfig.yaml"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--clusters",
        type=int,
        default=None,
        help=f"number of member clusters c0001..cNNNN (default: from --config, else "
        f"{DEFAULT_CLUSTERS}); a 'home' cluster is always added",
    )
    parser.add_argument(
        "--listen",
        default=DEFAULT_LISTEN,
        metavar="HOST:PORT",
        help=f"admin API address, plain http (default {DEFAULT_LISTEN}; port 0 picks one)",
    )
    parser.add_argument(
        "--kubeconfig-out",
        default=DEFAULT_KUBECONFIG,
        metavar="PATH",
        help=f"where to write the kubeconfig, one context per cluster (default "
        f"{DEFAULT_KUBECONFIG}); mode 0600",
    )
    parser.add_argument(
        "--config", metavar="FILE", help="YAML: clusters, caGroups, defaults, overrides"
    )
    parser.add_argument(
        "--ca-groups",
        type=int,
        default=None,
        help="listeners (each with its own CA) the member clusters are spread over (default 2)",
    )
    parser.add_argument(
        "--cluster-host",
        default="127.0.0.1",
        help="address the https cluster listeners bind (default 127.0.0.1)",
    )
    parser.add_argument(
        "--bookmark-interval",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="watch BOOKMARK period when allowWatchBookmarks=true (default 60)",
    )
    parser.add_argument("--seed", type=int, default=None, help="seed for injected error draws")


def _parse_listen(value: str) -> tuple[str, int]:
    from convergerd.sim.fleet import FleetConfigError

    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise FleetConfigError(f"--listen: expected HOST:PORT, got {value!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def build_config(args: argparse.Namespace) -> FleetConfig:
    """Flags over the config file over defaults; errors name the setting."""
    from convergerd.sim.fleet import FleetConfig, FleetConfigError

    admin_host, admin_port = _parse_listen(args.listen)
    settings = {
        "clusters": args.clusters,
        "ca_groups": args.ca_groups,
        "host": args.cluster_host,
        "admin_host": admin_host,
        "admin_port": admin_port,
        "bookmark_interval_s": args.bookmark_interval,
    }
    if args.config:
        try:
            text = Path(args.config).read_text(encoding="utf-8")
        except OSError as e:
            raise FleetConfigError(f"--config: cannot read {args.config}: {e.strerror}") from e
        return FleetConfig.from_yaml(text, **settings)
    return FleetConfig(**{k: v for k, v in settings.items() if v is not None})


async def serve(args: argparse.Namespace) -> None:
    from convergerd.sim.fleet import Fleet

    config = build_config(args)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    started = time.monotonic()
    rng = random.Random(args.seed) if args.seed is not None else None
    async with Fleet(config, kubeconfig_path=args.kubeconfig_out, rng=rng) as fleet:
        # The fleet built at start (every cluster's stores, discovery, certificates: most of
        # the heap before any client comes) lives as long as the process: frozen out of the
        # collector, a full collection no longer walks it (at 10,000 clusters one took most of
        # a second of the simulator's core in the middle of a save the bench was timing:
        # bench/RESULTS.md, "Figures once quoted in the code").
        gc.collect()
        gc.freeze()
        log.info(
            "sim ready in %.2fs: %d member clusters + home; admin %s; kubeconfig %s",
            time.monotonic() - started,
            config.clusters,
            fleet.admin_url,
            fleet.kubeconfig_path,
            extra={"clusters": config.clusters, "admin_url": fleet.admin_url},
        )
        await stop.wait()
        log.info("sim stopping")
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.remove_signal_handler(sig)


def run(args: argparse.Namespace) -> int:
    from convergerd.sim.fleet import FleetConfigError

    try:
        eventloop.run(serve(args))
    except FleetConfigError as e:
        log.error("sim: %s", e)  # noqa: TRY400 - a config error needs no traceback
        return 2
    return 0
