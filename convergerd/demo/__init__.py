"""`convergerd demo`: the whole product on the embedded default, in one command.

A simulated fleet of a dozen clusters (one down, one slow, one on Kubernetes 1.29, one
without the Policy CRD), a database (CONVERGERD_DATABASE_URL, or a private PostgreSQL started
here), the sample tenants imported, the in-cluster operator of every member cluster
(`convergerd.demo.operators`: tasks of this process, each leading on its own cluster's Lease)
with a namespace per tenant boundary to probe in, and the daemon converging them with its HTTP
server up: `/status` shows the phases the operators report (Enforcing, Inert, Unsupported on
the 1.29 cluster) and whether their enforcement probes verified the policies. Some workloads
are created before the policies are delivered (`convergerd.demo.operators.LEGACY_WORKLOADS`):
the operators' audit counts those the policies would deny, and `convergerd status` shows them
(VIOLATIONS). Once the fleet converged, the demo tells a rollout story
(`convergerd.demo.rollout`): a policy saved with a three-wave strategy halts at its canary and
is sent back, then a fixed revision rolls through. The sample tenants get one exception at
import, expiring 30 days later (`sample_exception`): `convergerd status` shows it with its
expiry. The banner prints a record/replay pair of
`convergerd policy eval` commands against one of the simulated clusters (a policy file for
them is written to the workdir).

The demo listens on 127.0.0.1 (unless CONVERGERD_HTTP_ADDR / --http-addr says otherwise) and,
unless an API token is given, makes a random one and prints it once, with how to use it. It
also makes a read token for one boundary (`TENANT_BOUNDARY`, or the first one imported) and
prints it with the web page's address: signed in with it, `/ui/` shows exactly what that
tenant may see.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import importlib.resources
import logging
import os
import secrets
from collections.abc import AsyncIterator, Mapping, MutableMapping, Sequence
from pathlib import Path

from convergerd.config import (
    INTERVAL_ENV,
    SECRET_FILES,
    SETTINGS_BY_KEY,
    Settings,
    load_settings,
)
from convergerd.sim.faults import Faults

# The public face (docs/design.md, "Modules"): `convergerd demo` is this package's own functions;
# no other part of convergerd imports its modules.
__all__ = ["add_arguments", "default_flags", "run"]

log = logging.getLogger(__name__)

# Which simulated clusters misbehave, so the demo shows what an admin would see.
DEMO_FAULTS = {
    "c0003": Faults(down=True),
    "c0006": Faults(latency_ms=1500),
    "c0007": Faults(version="v1.29.4"),
    "c0010": Faults(crd=False),
}


# The boundary whose read token the banner prints (when the tenants file has it).
TENANT_BOUNDARY = "team-a"


# Loopback only: the demo's API token is printed on the terminal, and its fleet is fake.
HTTP_ADDR = "127.0.0.1:8080"
DEMO_OPERATOR_PROBE_MINUTES = "1"  # the demo's operators' probe period, and so the daemon's


def default_flags(flags: MutableMapping[str, str | None], env: Mapping[str, str]) -> None:
    """The demo's own defaults, where neither a flag nor the environment sets the value."""
    if flags.get("http_addr") is None and SETTINGS_BY_KEY["http_addr"].env not in env:
        flags["http_addr"] = HTTP_ADDR
    probe = SETTINGS_BY_KEY["operator_probe_minutes"].env
    if flags.get("operator_probe_minutes") is None and probe not in env:
        # The demo's operators probe every minute: the daemon ages their Verified by that.
        flags["operator_probe_minutes"] = DEMO_OPERATOR_PROBE_MINUTES


# The policy the banner's `policy eval` record/replay commands evaluate (one of the sample
# tenants'), written to the workdir as a policy entry.
EVAL_POLICY = "id: no-latest\nboundary: platform\nrule: {type: ForbidLatestTag}\n"
EVAL_POLICY_FILE = "no-latest.policy.yaml"
EVAL_SESSION_FILE = "no-latest.session"
EVAL_CONTEXT = "c0002"
# A pod the sample tenants' Warn policy (team-b-pinned-images) fails and every other team-b
# policy admits: the banner's `kubectl create --dry-run=server` shows the warning.
WARN_POLICY = "team-b-pinned-images"
WARN_CONTEXT = "c0005"
WARN_POD = """apiVersion: v1
kind: Pod
metadata: {name: unpinned, namespace: team-b}
spec:
  containers: [{name: app, image: registry.team-b.example.com/app}]
"""
WARN_POD_FILE = "unpinned-pod.yaml"
# The sample tenants' exception (added at import, `sample_exception`): team-b-registries admits
# the pod `vendor-agent` in namespace team-b until it expires. It covers none of the workloads
# the audit counts, nor the probe's pod.
EXCEPTED_POLICY = "team-b-registries"
EXCEPTION_ID = "vendor-agent"
EXCEPTION_DAYS = 30


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


def sample_exception(now: dt.datetime) -> str:
    """The sample tenants' exception, as an import file's `exceptions:` section: it expires
    `EXCEPTION_DAYS` after `now` (an expiry written in the file would pass, and then be
    refused)."""
    expires = (now + dt.timedelta(days=EXCEPTION_DAYS)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return (f"exceptions:\n  - {{policy: {EXCEPTED_POLICY}, id: {EXCEPTION_ID}, "
            f"namespace: team-b, name: vendor-agent, reason: 'the vendor ships it from Docker "
            f"Hub only, TICKET-42', requestedBy: dev@team-b, approvedBy: admin@platform, "
            f"expiresAt: '{expires}'}}\n")


def _tenants_file(args: argparse.Namespace, workdir: Path) -> Path:
    if args.tenants is not None:
        return Path(args.tenants)
    path = workdir / "tenants.yaml"
    sample = importlib.resources.files("convergerd.demo").joinpath("tenants.yaml").read_text()
    path.write_text(sample + sample_exception(dt.datetime.now(dt.UTC)))
    return path


def _prepare(workdir: Path) -> Path:
    workdir = workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    return workdir


async def run(args: argparse.Namespace, settings: Settings) -> int:
    from convergerd.demo import rollout
    from convergerd.demo.operators import (
        create_boundary_namespaces,
        create_legacy_workloads,
        operated,
        running_operators,
    )
    from convergerd.runtime import Daemon
    from convergerd.sim.fleet import HOME, Fleet, FleetConfig
    from convergerd.store.importer import import_file, load_file
    from convergerd.store.schema import migrate

    workdir = _prepare(args.workdir)
    config = FleetConfig(clusters=args.clusters, overrides=DEMO_FAULTS)
    async with Fleet(config, kubeconfig_path=workdir / "kubeconfig") as fleet, \
            _database(settings, workdir) as dsn:
        await migrate(dsn)
        tenants = _tenants_file(args, workdir)
        summary = await import_file(dsn, tenants)
        log.info("imported sample tenants: %s", summary)
        plan = load_file(tenants)
        made = create_boundary_namespaces(fleet, plan)
        log.info("created %d namespaces labelled with the tenants' boundaries", made)
        legacy = create_legacy_workloads(fleet)
        log.info("created %d workloads that predate the policies (the operators audit them)",
                 legacy)
        eval_policy = workdir / EVAL_POLICY_FILE
        eval_policy.write_text(EVAL_POLICY)
        (workdir / WARN_POD_FILE).write_text(WARN_POD)
        operators = operated(fleet.member_ids, DEMO_FAULTS)
        token = settings.api_token or secrets.token_urlsafe(24)
        boundaries = [b.id for b in plan.boundaries]
        tenant = await _tenant_token(
            dsn, TENANT_BOUNDARY if TENANT_BOUNDARY in boundaries else boundaries[0]
        ) if boundaries else None
        flags = {
            "database_url": dsn,
            "kubeconfig": str(fleet.kubeconfig_path),
            "home_context": HOME,
            "identity": "demo",
            "api_token": token,
            "http_addr": f"{settings.http_host}:{settings.http_port}",
            "interval_minutes": os.environ.get(INTERVAL_ENV, "0.5"),
        }
        # The secrets were read already (from a *_FILE too): the daemon gets them as values.
        file_envs = {SETTINGS_BY_KEY[key].env for key in SECRET_FILES.values()}
        env = {k: v for k, v in os.environ.items() if k not in file_envs}
        daemon_settings = load_settings(env, flags)
        print(  # noqa: T201 - the demo's banner is for the person who started it
            banner(settings, clusters=args.clusters, admin_url=fleet.admin_url,
                   kubeconfig=fleet.kubeconfig_path, token=token, operators=operators,
                   eval_policy=eval_policy, tenant=tenant),
            flush=True,
        )
        async with running_operators(operators, kubeconfig=fleet.kubeconfig_path, env=env):
            story = (asyncio.create_task(rollout.tell(dsn), name="rollout story")
                     if rollout.POLICY in {p.id for p in plan.policies} else None)
            try:
                return await Daemon(daemon_settings).main()
            finally:
                if story is not None:
                    story.cancel()
                    await asyncio.gather(story, return_exceptions=True)


async def _tenant_token(dsn: str, boundary: str) -> tuple[str, str] | None:
    """A new read token of `boundary` (named for this run), and the boundary; None (logged)
    when the database refuses it."""
    from convergerd.core.tokens import new_token, token_digest
    from convergerd.store.store import Store
    from convergerd.store.tenants import Refused

    token = new_token()
    digest = token_digest(token)
    assert digest is not None  # one of ours
    store = await Store.connect(dsn)
    try:
        made = await store.create_token(
            name=f"demo-{boundary}-{secrets.token_hex(3)}"[:63], boundary=boundary,
            digest=digest, by="convergerd demo", expires_at=None)
    finally:
        await store.close()
    if isinstance(made, Refused):
        log.warning("no read token for the web page's tenant %s: %s", boundary, made.value)
        return None
    return token, boundary


def banner(
    settings: Settings, *, clusters: int, admin_url: str, kubeconfig: Path, token: str,
    operators: Sequence[str] = (), eval_policy: Path = Path(EVAL_POLICY_FILE),
    tenant: tuple[str, str] | None = None,
) -> str:
    """What the person who started the demo reads: where to look, and the API token (shown
    here once when it was made for this run; never when they chose it)."""
    host = settings.http_host
    if host in ("0.0.0.0", "::", ""):  # noqa: S104 - listening on all: loopback reaches it
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    http = f"http://{host}:{settings.http_port}"
    token_line = (
        f"TOKEN={token}   (random, for this run only; CONVERGERD_API_TOKEN sets one)"
        if settings.api_token is None else
        "TOKEN=the API token you set"
    )
    operated_line = (
        f"one per member cluster in this process ({len(operators)}: not on a cluster that is "
        "down or has no Policy CRD), each leading on its own cluster's Lease"
        if operators else "none")
    session = eval_policy.with_name(EVAL_SESSION_FILE)
    page = ""
    if tenant is not None:
        tenant_token, boundary = tenant
        page = f"""  web page:      {http}/ui/   sign in with {boundary}'s read token to see exactly
                 what that tenant may see (its policies by its clusters, a page per policy):
                 {tenant_token}
                 (the API token below shows the whole fleet there)
"""
    warn_pod = eval_policy.with_name(WARN_POD_FILE)
    return f"""
convergerd demo is running ({clusters} simulated clusters; Ctrl-C to stop)
{page}  status:        {http}/status      or: convergerd status --addr {http}
  metrics:       {http}/metrics
  a policy:      {http}/v1/policies/no-latest/status
  simulator:     {admin_url}/_sim/clusters   (inject faults: POST .../faults)
  kubectl:       kubectl --kubeconfig {kubeconfig} --context c0001 get policies
  faults:        c0003 down, c0006 slow (1.5 s), c0007 Kubernetes 1.29, c0010 no Policy CRD
  operators:     {operated_line}
  look at:       the PHASES and VERIFIED columns of convergerd status: Enforcing, Inert
                 (team-b-owner is disabled), Unsupported on c0007 (Kubernetes 1.29); VERIFIED
                 counts the policies whose probe (a dry-run pod violating the policy, in the
                 namespace named after its boundary) was denied; "verified" per cluster in
                 {http}/v1/policies/no-latest/status
  audit:         the VIOLATIONS column of convergerd status: workloads that ran before the
                 policies were delivered (pods and deployments in the boundaries' namespaces
                 on c0001, c0002, c0004, c0005) that a policy would deny; per cluster and in
                 total (with samples): {http}/v1/policies/no-latest/status ("audit")
  record/replay: convergerd policy eval --policy {eval_policy} --context {EVAL_CONTEXT} \\
                   --kubeconfig {kubeconfig} --record {session}
                 convergerd policy eval --policy {eval_policy} --replay {session}
                 (the same verdicts from the recorded session, with no cluster: for CI)
  warn mode:     kubectl --kubeconfig {kubeconfig} --context {WARN_CONTEXT} \\
                   create --dry-run=server -f {warn_pod}
                 ({WARN_POLICY} is in mode Warn: the pod without an image tag is admitted
                 and kubectl prints the policy's warning; `convergerd policy apply
                 {WARN_POLICY} --enforcement Deny` with the token makes the next one denied);
                 the MODES column of convergerd status shows it in force as Warn, and
                 convergerd status --addr {http} --policy {WARN_POLICY} its mode and the
                 warnings counted per cluster (ADMISSIONS)
  exceptions:    {EXCEPTED_POLICY} admits the pod vendor-agent in namespace team-b for
                 {EXCEPTION_DAYS} days (id {EXCEPTION_ID}): convergerd status shows when it
                 expires, `convergerd policy exceptions` lists it; the operators stop honouring
                 it by themselves at its expiry
  try:           kubectl --kubeconfig {kubeconfig} --context c0001 delete \\
                   validatingadmissionpolicybinding stackship-no-latest
                 (the operator's watch sees it at once, probes first: Verified False
                 Admitted; then it re-creates the binding within a second, verifies it again
                 and counts the repair in convergerd_operator_repairs_total)
  rollout:       once the fleet converged, the demo saves team-c-registries with the
                 three-wave strategy `careful` (canary c0009, half, the rest) as a revision
                 without the mirror the canary's web-0 runs from: the canary's audit finds it,
                 the rollout halts and the canary is sent back; then a fixed revision rolls
                 through every wave. Watch: convergerd rollout status team-c-registries \\
                   --addr {http}   (and `convergerd status`: rollouts in progress)
  API token:     {token_line}
                 the save/delete API (POST /v1/policies/ID/apply, DELETE /v1/policies/ID)
                 needs it: curl -X DELETE -H "Authorization: Bearer $TOKEN" {http}/v1/policies/ID
"""
