"""Secrets on the command line, in files, and the demo's API token, as a user meets them: the
real `convergerd` process, its exit code, what it prints and what its HTTP server accepts."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from pathlib import Path

from convergerd import demo
from convergerd.config import load_settings
from tests.fixtures.fleet import free_port
from tests.integration.process_helpers import CONVERGERD, STARTUP_S, clean_env, run_demo
from tests.integration.rounds_helpers import wait_for


async def _run(*args: str, env: dict[str, str]) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        *CONVERGERD, *args, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode()


async def test_a_secret_flag_is_warned_about_once_without_its_value() -> None:
    code, output = await _run("once", "--api-token", "tok-on-the-cmdline-42", env=clean_env())
    assert code == 2  # no database configured: a setting error, after the warning
    warnings = [line for line in output.splitlines() if "given on the command line" in line]
    assert len(warnings) == 1, output
    assert "WARNING" in warnings[0]
    assert "--api-token was given on the command line" in warnings[0]
    assert "CONVERGERD_API_TOKEN_FILE (--api-token-file)" in warnings[0]
    assert "tok-on-the-cmdline-42" not in output


async def test_secrets_from_env_or_file_are_not_warned_about(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("tok-in-a-file-42\n")
    code, output = await _run("once", "--api-token-file", str(token),
                              env=clean_env(CONVERGERD_DATABASE_URL="postgresql://h:1/db"))
    assert code == 2, output  # no kubeconfig
    assert "given on the command line" not in output
    assert "CONVERGERD_KUBECONFIG" in output


async def test_a_missing_secret_file_is_a_startup_error_naming_setting_and_path(
    tmp_path: Path,
) -> None:
    missing = tmp_path / "dsn"
    code, output = await _run("migrate", "--database-url-file", str(missing), env=clean_env())
    assert code == 2
    assert output.strip() == (
        f"convergerd: setting error: CONVERGERD_DATABASE_URL_FILE={str(missing)!r}: "
        "cannot read: No such file or directory"
    )


def test_the_demo_listens_on_loopback_unless_told_otherwise() -> None:
    flags: dict[str, str | None] = {"http_addr": None}
    demo.default_flags(flags, {})
    settings = load_settings({}, flags)
    assert (settings.http_host, settings.http_port) == ("127.0.0.1", 8080)

    chosen: dict[str, str | None] = {"http_addr": ":9999"}
    demo.default_flags(chosen, {})
    assert chosen["http_addr"] == ":9999"
    from_env: dict[str, str | None] = {"http_addr": None}
    demo.default_flags(from_env, {"CONVERGERD_HTTP_ADDR": ":8080"})
    assert from_env["http_addr"] is None


def _request(method: str, url: str, token: str | None = None) -> int | None:
    """The answer's status; None when nothing listens (yet)."""
    req = urllib.request.Request(url, method=method)  # noqa: S310 - a loopback http URL
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=5) as response:  # noqa: S310
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except urllib.error.URLError:
        return None


async def test_the_demo_makes_a_random_token_prints_it_once_and_it_works(
    tmp_path: Path, database_url: str
) -> None:
    dsn_file = tmp_path / "dsn"
    dsn_file.write_text(database_url + "\n")
    port = free_port()
    env = clean_env(CONVERGERD_DATABASE_URL_FILE=str(dsn_file))
    async with run_demo(tmp_path, env, "--http-addr", f"127.0.0.1:{port}") as (_proc, banner):
        token_lines = [line for line in banner if "TOKEN=" in line]
        assert len(token_lines) == 1, banner
        token = token_lines[0].split("TOKEN=", 1)[1].split()[0]
        assert len(token) >= 32
        assert token != "demo-token"
        text = "\n".join(banner)
        assert text.count(token) == 1
        assert f"http://127.0.0.1:{port}/status" in text
        assert 'Authorization: Bearer $TOKEN' in text
        assert "://0.0.0.0" not in text

        base = f"http://127.0.0.1:{port}"
        delete = f"{base}/v1/policies/no-latest"
        async def serving() -> bool:
            return await asyncio.to_thread(_request, "GET", f"{base}/healthz") == 200

        await wait_for(serving, timeout_s=STARTUP_S, what="the demo's HTTP server")
        assert await asyncio.to_thread(_request, "DELETE", delete) == 401
        assert await asyncio.to_thread(_request, "DELETE", delete, "demo-token") == 401
        # The token is accepted: the deletion of an unknown policy is answered 404, not 401.
        unknown = f"{base}/v1/policies/no-such-policy"
        assert await asyncio.to_thread(_request, "DELETE", unknown, token) == 404
    log = (tmp_path / "demo.log").read_text()
    assert token not in log
    assert database_url not in log

