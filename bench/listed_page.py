"""What reading one cluster's list answer costs a round, step by step (figures, not a test).

    .venv/bin/python bench/listed_page.py [--policies 100]
    # the same figures for another checkout's code:
    PYTHONPATH=$OTHER .venv/bin/python bench/listed_page.py

A simulated cluster (`convergerd sim`, one cluster) is given POLICIES Policies by server-side
apply, as a round creates them, and listed once: that answer's bytes are what every in-sync
round reads from every cluster. Then, each the least of 7 timings, in this process:

- `parse_json` of the page (the bounds checked, then orjson), and of one Policy (an apply's
  answer), beside `orjson.loads` alone;
- `ListedPolicy.from_object` per Policy (named `Observed` before issue 34);
- the round's work per cluster after the list: the readings packed (`converge._phases`) and
  the plan (`plan_cluster`), per Policy.
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import json
import ssl
import sys
import tempfile
import timeit
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import yaml

# Run as a script, bench/ (not the repository) is on sys.path: reuse bench/rounds.py's. Last,
# so that a PYTHONPATH naming another checkout gives its convergerd.
sys.path.append(str(Path(__file__).resolve().parents[1]))

from bench.rounds import Sim, build_fleet
from convergerd.core import plan
from convergerd.core.decode import parse_json
from convergerd.core.render import API_VERSION, render_policy
from convergerd.delivery import converge

REPEAT = 7


def _listed_page(policies: int) -> bytes:
    """The simulator's list answer after `policies` Policies were applied to its cluster."""
    with tempfile.TemporaryDirectory() as workdir:
        sim = Sim.start(1, Path(workdir))
        try:
            config = yaml.safe_load(sim.kubeconfig.read_text())
            context = config["contexts"][0]["context"]
            cluster = next(c["cluster"] for c in config["clusters"]
                           if c["name"] == context["cluster"])
            user = next(u["user"] for u in config["users"] if u["name"] == context["user"])
            tls = ssl.create_default_context(cadata=base64.b64decode(
                cluster["certificate-authority-data"]).decode())
            base = f"{cluster['server']}/apis/{API_VERSION}/policies"
            headers = {"Authorization": f"Bearer {user['token']}"}

            def call(url: str, method: str = "GET", body: bytes | None = None,
                     content_type: str | None = None) -> bytes:
                request = urllib.request.Request(url, data=body, method=method,  # noqa: S310
                                                 headers=headers)
                if content_type is not None:
                    request.add_header("Content-Type", content_type)
                with urllib.request.urlopen(request, context=tls) as answer:  # noqa: S310
                    return bytes(answer.read())

            for policy in _policies(policies):
                body = render_policy(policy)
                call(f"{base}/{body['metadata']['name']}?fieldManager=convergerd&force=true",
                     "PATCH", json.dumps(body).encode(), "application/apply-patch+yaml")
            return call(f"{base}?limit=500")
        finally:
            sim.stop()


def _policies(count: int) -> list[Any]:
    found = build_fleet(1, count).policies
    return list(found.values() if isinstance(found, dict) else found)[:count]


def _least_us(work: Callable[[], object], per: int, number: int) -> float:
    """The least of `REPEAT` timings of `work`, in microseconds per one of `per`."""
    return min(timeit.repeat(work, number=number, repeat=REPEAT)) / number / per * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--policies", type=int, default=100)
    args = parser.parse_args()
    page = _listed_page(args.policies)
    items: list[dict[str, Any]] = orjson.loads(page)["items"]
    one = orjson.dumps(items[0])
    listed_type = getattr(plan, "ListedPolicy", None) or getattr(plan, "Observed")  # noqa: B009
    observed = {o["metadata"]["name"]: listed_type.from_object(o) for o in items}
    desired = _policies(args.policies)
    # A round renders each policy once for all its clusters (`plan.Bodies`, since issue 34).
    bodies = getattr(plan, "Bodies", None)
    render = bodies() if bodies is not None else render_policy
    now = dt.datetime.now(dt.UTC)
    figures = {
        "page_bytes": len(page),
        "policies": len(items),
        "parse_page_us": _least_us(lambda: parse_json(page, "page"), 1, 200),
        "orjson_page_us": _least_us(lambda: orjson.loads(page), 1, 200),
        "parse_one_us": _least_us(lambda: parse_json(one, "one"), 1, 20_000),
        "orjson_one_us": _least_us(lambda: orjson.loads(one), 1, 20_000),
        "from_object_us": _least_us(lambda: [listed_type.from_object(o) for o in items],
                                    len(items), 200),
        "phases_us": _least_us(lambda: converge._phases("c0001", observed, now),  # type: ignore[arg-type]
                               len(items), 200),
        "plan_us": _least_us(
            lambda: plan.plan_cluster(desired, observed, *([render] if bodies else [])),
            len(items), 200),
    }
    print(json.dumps({k: round(v, 2) if isinstance(v, float) else v
                      for k, v in figures.items()}))


if __name__ == "__main__":
    main()
