"""A private PostgreSQL for the demo and the tests, when no database is configured.

Uses the machine's PostgreSQL server binaries (`pg_config --bindir`, `/usr/lib/postgresql/*/bin`,
or PATH): `initdb` into a directory (kept, so a restart finds its data), then `postgres` on a
free loopback port with trust authentication for the `postgres` user, its unix socket inside
the data directory. `initdb` and `postgres` refuse to run as root: as root they run as the
`postgres` OS user, which must be able to reach the directory.

    async with private_postgres(path) as dsn:
        ...
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from convergerd.core.errors import ConvergerdError

log = logging.getLogger(__name__)

SERVER_USER = "postgres"  # the OS user the server runs as when we are root
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
_SOCKET_PATH_MAX = 100  # sun_path is 108 bytes; leave room for ".s.PGSQL.NNNNN"


class PostgresServerError(ConvergerdError):
    """A private PostgreSQL could not be found, initialised or started."""


def find_bindir() -> Path:
    """The directory holding `initdb` and `postgres`."""
    candidates: list[Path] = []
    pg_config = shutil.which("pg_config")
    if pg_config:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(  # noqa: S603 - our own path from which()
                [pg_config, "--bindir"], capture_output=True, text=True, check=True, timeout=10
            )
            candidates.append(Path(out.stdout.strip()))

    def version(path: Path) -> tuple[int, ...]:
        return tuple(int(n) for n in re.findall(r"\d+", path.parent.name)) or (0,)

    candidates += sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=version, reverse=True)
    for name in ("postgres", "initdb"):
        found = shutil.which(name)
        if found:
            candidates.append(Path(found).resolve().parent)
    for bindir in candidates:
        if (bindir / "initdb").is_file() and (bindir / "postgres").is_file():
            return bindir
    raise PostgresServerError(
        "no PostgreSQL server binaries (initdb, postgres) found via pg_config, "
        "/usr/lib/postgresql/*/bin or PATH: install the PostgreSQL server "
        "(e.g. `apt-get install postgresql`) or set CONVERGERD_DATABASE_URL"
    )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class PostgresServer:
    """One private server: `start()` returns its DSN, `stop()` shuts it down (fast mode)."""

    def __init__(self, path: Path, *, bindir: Path | None = None) -> None:
        self.path = Path(path).absolute()
        self.data = self.path / "data"
        self.bindir = bindir or find_bindir()
        self._as_root = os.geteuid() == 0
        self._process: subprocess.Popen[bytes] | None = None
        self.port: int | None = None

    @property
    def dsn(self) -> str:
        if self.port is None:
            raise PostgresServerError("the private PostgreSQL is not running")
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    @property
    def log_path(self) -> Path:
        return self.path / "postgres.log"

    def _command(self, program: str, *args: str) -> list[str]:
        argv = [str(self.bindir / program), *args]
        if not self._as_root:
            return argv
        setpriv = shutil.which("setpriv")
        if setpriv:  # execs in place: the pid we hold is the server's own
            return [setpriv, f"--reuid={SERVER_USER}", f"--regid={SERVER_USER}",
                    "--init-groups", "--", *argv]
        runuser = shutil.which("runuser")
        if runuser:
            return [runuser, "-u", SERVER_USER, "--", *argv]
        raise PostgresServerError(
            "running as root, and neither setpriv nor runuser is available to run PostgreSQL "
            f"as the {SERVER_USER!r} user"
        )

    def _prepare_directory(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        if not self._as_root:
            return
        try:
            user = pwd.getpwnam(SERVER_USER)
        except KeyError:
            raise PostgresServerError(
                f"running as root, and there is no {SERVER_USER!r} OS user to run PostgreSQL as"
            ) from None
        for parent in self.path.parents:
            if not os.stat(parent).st_mode & 0o001:
                raise PostgresServerError(
                    f"{parent} is not searchable by other users, so the {SERVER_USER!r} user "
                    f"cannot reach {self.path}: choose a directory under /tmp or /var/lib"
                )
        os.chown(self.path, user.pw_uid, user.pw_gid)
        if self.data.exists():
            os.chown(self.data, user.pw_uid, user.pw_gid)

    def _run(self, argv: Sequence[str]) -> None:
        done = subprocess.run(  # noqa: S603 - argv built from our own paths
            list(argv), capture_output=True, text=True, check=False, timeout=120
        )
        if done.returncode != 0:
            raise PostgresServerError(
                f"{Path(argv[0]).name} failed ({done.returncode}): "
                f"{(done.stderr or done.stdout).strip()[-2000:]}"
            )

    def initdb(self) -> None:
        """Create the cluster unless the directory already holds one."""
        self._prepare_directory()
        if (self.data / "PG_VERSION").is_file():
            return
        log.info("initialising a private PostgreSQL in %s", self.data)
        self._run(self._command(
            "initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust",
            "-E", "UTF8", "--locale=C", "--no-sync",
        ))

    def start(self) -> str:
        """Initialise if needed, start, wait until it accepts connections; the DSN."""
        if self._process is not None:
            return self.dsn
        self.initdb()
        socket_dir = str(self.data)
        if len(socket_dir) > _SOCKET_PATH_MAX - len("/.s.PGSQL.65535"):
            socket_dir = ""  # too long for a unix socket path: TCP only
        for _attempt in range(3):  # a port taken between choosing and binding: choose again
            port = free_port()
            argv = self._command(
                "postgres", "-D", str(self.data), "-p", str(port),
                "-c", "listen_addresses=127.0.0.1",
                "-c", f"unix_socket_directories={socket_dir}",
                "-c", "fsync=off", "-c", "synchronous_commit=off",
                "-c", "full_page_writes=off", "-c", "max_connections=200",
            )
            with self.log_path.open("ab") as log_file:
                self._process = subprocess.Popen(  # noqa: S603 - argv from our own paths
                    argv, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            if self._wait_ready(port):
                self.port = port
                log.info("private PostgreSQL on 127.0.0.1:%d (data %s)", port, self.data)
                return self.dsn
        raise PostgresServerError(
            f"the private PostgreSQL did not start; its log: {self.log_path}\n{self._log_tail()}"
        )

    def _wait_ready(self, port: int) -> bool:
        """Poll until the server says it is ready (postmaster.pid status line) and accepts a
        TCP connection; False if it exited (e.g. the port was taken)."""
        assert self._process is not None
        pid_file = self.data / "postmaster.pid"
        deadline = time.monotonic() + START_TIMEOUT_S
        pause = 0.005
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                self._process = None
                return False
            if _pid_file_ready(pid_file, port) and _accepts(port):
                return True
            time.sleep(pause)
            pause = min(pause * 2, 0.1)
        self.stop()
        raise PostgresServerError(
            f"the private PostgreSQL was not ready within {START_TIMEOUT_S:.0f} s; "
            f"its log: {self.log_path}\n{self._log_tail()}"
        )

    def _log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    def stop(self) -> None:
        """Fast shutdown (SIGINT: disconnect clients, checkpoint); SIGKILL if it hangs."""
        process, self._process, self.port = self._process, None, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            log.warning("private PostgreSQL did not stop in %.0f s: killing it", STOP_TIMEOUT_S)
            process.kill()
            process.wait()


def _pid_file_ready(pid_file: Path, port: int) -> bool:
    try:
        lines = pid_file.read_text().splitlines()
    except OSError:
        return False
    # Line 4 is the port, line 8 the status ("ready" once it accepts connections).
    return len(lines) >= 8 and lines[3].strip() == str(port) and lines[7].strip() == "ready"


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


@contextlib.asynccontextmanager
async def private_postgres(path: Path) -> AsyncIterator[str]:
    """Run a private PostgreSQL with its data in `path` for the duration; yields its DSN."""
    server = PostgresServer(path)
    dsn = await asyncio.to_thread(server.start)
    try:
        yield dsn
    finally:
        await asyncio.to_thread(server.stop)
