"""The container image, built with `.ci/build-image` (what `make image` runs) and run with podman
the way deploy/ runs it: read-only root filesystem with an empty /tmp, a numeric non-root user,
no capabilities, the kubeconfig and the DSN as read-only mounted files. Host networking, so the
daemon in the container reaches the simulator and PostgreSQL on 127.0.0.1.

The first build on a machine also makes the Debian base image (about a minute, then cached);
afterwards a build takes about 20-40 s. Deselect with `-m "not image"`.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import time
import tomllib
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.harness import MEMBERS, POLICIES, STARTUP_S, TIMINGS, World, agent, wait_for
from tests.fixtures.fleet import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.image]

ROOT = Path(__file__).resolve().parents[2]
VERSION = str(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"])
# The first build on a clean machine installs podman and makes the base image.
BUILD_TIMEOUT_S = 900
KUBECONFIG_IN = "/etc/convergerd/kubeconfig/config"
DSN_IN = "/etc/convergerd/secrets/database-url"
USER = "65532:65532"


def _podman() -> str:
    podman = shutil.which("podman")
    if podman is None:
        installed = subprocess.run(["bash", str(ROOT / ".ci" / "install-tools"), "image"],
                                   capture_output=True, text=True, timeout=600, check=False)
        podman = shutil.which("podman")
        if podman is None:
            pytest.skip("podman is not installed and `.ci/install-tools image` could not "
                        f"install it (needs root or sudo and apt): {installed.stderr[-300:]}")
    return podman


@pytest.fixture(scope="session")
def image() -> str:
    """`IMAGE:VERSION` as `make image` builds it (the base image is reused between runs)."""
    _podman()
    started = time.monotonic()
    built = subprocess.run(
        ["bash", str(ROOT / ".ci" / "build-image")],
        capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False,
        env={**os.environ, "PYTHON": sys.executable}, cwd=ROOT,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    sys.stdout.write(f"image built in {time.monotonic() - started:.1f} s\n")
    return built.stdout.strip().splitlines()[-1]


def run_flags() -> list[str]:
    """What deploy/ sets, as podman flags; runc and explicit ulimits for hosts like CI's."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nofile = 65536 if hard == resource.RLIM_INFINITY else min(hard, 65536)
    return [
        "--runtime", "runc", "--network", "host",
        "--read-only", "--read-only-tmpfs=false", "--tmpfs", "/tmp:rw,size=64m",
        "--user", USER, "--cap-drop", "all", "--security-opt", "no-new-privileges",
        "--ulimit", f"nofile={nofile}:{nofile}", "--ulimit", "nproc=4096:4096",
    ]


def podman(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([_podman(), *args], capture_output=True, text=True,
                          timeout=timeout_s, check=False)


def daemon_flags(world: World, identity: str, port: int) -> list[str]:
    """The environment and mounts of a daemon in the container, against this test's world."""
    dsn = world.workdir / f"{identity}.database-url"
    dsn.write_text(world.database_url)
    dsn.chmod(0o644)
    world.sim.kubeconfig_path.chmod(0o644)  # readable by the container's user
    env = {k: v for k, v in world.env(identity, port).items()
           if k.startswith(("CONVERGERD_", "Policies__"))}
    env.pop("CONVERGERD_DATABASE_URL")
    env.update({"CONVERGERD_DATABASE_URL_FILE": DSN_IN, "CONVERGERD_KUBECONFIG": KUBECONFIG_IN})
    flags = [f"--env={k}={v}" for k, v in sorted(env.items())]
    return [*flags, "--volume", f"{world.sim.kubeconfig_path}:{KUBECONFIG_IN}:ro",
            "--volume", f"{dsn}:{DSN_IN}:ro"]


@pytest.fixture
def containers() -> Iterator[list[str]]:
    """Names of detached containers; their logs are printed and they are removed afterwards."""
    names: list[str] = []
    yield names
    for name in names:
        sys.stderr.write(f"----- container {name} -----\n{podman('logs', name).stderr}")
        podman("rm", "--force", "--time", "0", name)


@pytest.mark.timeout(BUILD_TIMEOUT_S)
def test_the_image_holds_the_daemon_only_as_a_non_root_user(image: str) -> None:
    assert image.endswith(f":{VERSION}")
    version = podman("run", "--rm", *run_flags(), image, "--version")
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip() == f"convergerd {VERSION}"
    # deploy/ names the command (`command: ["convergerd"]`): it is on the image's PATH.
    helped = podman("run", "--rm", *run_flags(), "--entrypoint", "convergerd", image, "--help")
    assert helped.returncode == 0, helped.stderr
    assert "once" in helped.stdout

    inspected = podman("image", "inspect", image)
    assert inspected.returncode == 0, inspected.stderr
    (info,) = json.loads(inspected.stdout)
    config = info["Config"]
    assert config["User"] == USER
    assert config["Entrypoint"] == ["/opt/convergerd/bin/convergerd"]  # exec form: PID 1
    labels = config["Labels"]
    assert labels["org.opencontainers.image.version"] == VERSION
    assert labels["org.opencontainers.image.source"].startswith("https://")
    assert len(labels["org.opencontainers.image.revision"]) >= 7

    # The runtime dependencies only: no sim extra (cryptography), no test or build tools.
    probe = ("import importlib.util as u; "
             "print(','.join(m for m in ('convergerd', 'asyncpg', 'aiohttp', 'kubernetes_asyncio',"
             " 'cryptography', 'pytest', 'pip', 'setuptools') if u.find_spec(m)))")
    found = podman("run", "--rm", *run_flags(), "--entrypoint", "/opt/convergerd/bin/python",
                   image, "-c", probe)
    assert found.returncode == 0, found.stderr
    assert found.stdout.strip() == "convergerd,asyncpg,aiohttp,kubernetes_asyncio"


@pytest.mark.timeout(BUILD_TIMEOUT_S)
def test_once_in_the_container_converges_the_fleet(world: World, image: str) -> None:
    identity = "image-once"
    started = time.monotonic()
    done = podman("run", "--rm", *run_flags(), *daemon_flags(world, identity, free_port()),
                  image, "once", timeout_s=120)
    took_s = time.monotonic() - started
    sys.stdout.write(f"`convergerd once` in the container: exit {done.returncode} after "
                     f"{took_s:.1f} s\n")
    assert done.returncode == 0, done.stdout + done.stderr
    written = {(r.cluster, r.path.rsplit("/", 1)[-1].split("?")[0])
               for r in world.policy_writes() if r.status < 300}
    assert written == {(c, f"policy-{p}") for c in MEMBERS for p in POLICIES}
    # One version everywhere: what the clusters see is the package's version.
    assert {r.user_agent for r in world.requests() if r.cluster in MEMBERS} == {agent(identity)}
    assert agent(identity) == f"convergerd/{VERSION} ({identity})"


@pytest.mark.timeout(BUILD_TIMEOUT_S)
def test_sigterm_to_the_container_releases_the_lease_and_exits_0(
    world: World, image: str, containers: list[str],
) -> None:
    identity = f"image-run-{uuid.uuid4().hex[:8]}"
    port = free_port()
    containers.append(identity)
    started = podman("run", "--detach", "--name", identity, *run_flags(),
                     *daemon_flags(world, identity, port), image, "run")
    assert started.returncode == 0, started.stderr
    wait_for(lambda: world.lease_holder() == identity, STARTUP_S, "the container leading")

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        metrics = resp.read().decode()
    assert f'convergerd_build_info{{version="{VERSION}"}} 1.0' in metrics

    termed = time.monotonic()
    killed = podman("kill", "--signal", "TERM", identity)
    assert killed.returncode == 0, killed.stderr
    grace_s = float(TIMINGS["CONVERGERD_GRACE_PERIOD_SECONDS"])
    waited = podman("wait", identity, timeout_s=grace_s + 30)
    exited_s = time.monotonic() - termed
    sys.stdout.write(f"SIGTERM to the container: exit {waited.stdout.strip()} after "
                     f"{exited_s:.2f} s (grace period {grace_s:g} s)\n")
    assert waited.stdout.strip() == "0", podman("logs", identity).stderr
    assert exited_s < grace_s + 2  # the daemon's own grace period, plus podman's overhead
    assert world.lease_holder() == ""  # released, not left to expire
