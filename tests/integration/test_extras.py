"""`pip install convergerd` is the daemon only; the simulator and the demo need the `sim` extra.

Each case runs the real CLI in a fresh interpreter where `cryptography` (what the extra adds)
cannot be imported, as on a machine without the extra.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

WITHOUT_SIM_EXTRA = """
import sys

class NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name == "cryptography" or name.startswith("cryptography."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NotInstalled())
from convergerd.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def cli_without_extra(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_SIM_EXTRA, *args],
        capture_output=True, text=True, timeout=60, check=False,
    )


@pytest.mark.parametrize("command", ["sim", "demo"])
def test_sim_and_demo_name_the_missing_extra_in_one_line(command: str) -> None:
    done = cli_without_extra(command)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"convergerd {command} needs the simulator extra, which is not installed: "
        "pip install 'convergerd[sim]'"
    ]
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("args", [["--help"], ["run", "--help"], ["once", "--help"],
                                  ["migrate", "--help"], ["status", "--help"]])
def test_the_daemon_commands_work_without_the_extra(args: list[str]) -> None:
    done = cli_without_extra(*args)
    assert done.returncode == 0, done.stderr
    assert "usage: convergerd" in done.stdout


def test_the_daemon_modules_import_without_the_extra() -> None:
    code = WITHOUT_SIM_EXTRA.replace(
        "from convergerd.cli.main import main\nsys.exit(main(sys.argv[1:]))",
        "import convergerd.runtime, convergerd.api.server, convergerd.store.importer, "
        "convergerd.cli.status\nprint('ok')",
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_policy_eval_names_the_missing_extra_in_one_line(tmp_path: Path) -> None:
    policy = tmp_path / "p.yaml"
    policy.write_text("{id: x, boundary: b, rule: {type: ForbidLatestTag}}\n")
    done = cli_without_extra("policy", "eval", "--policy", str(policy), "--object", str(policy))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "convergerd policy eval needs the simulator extra, which is not installed: "
        "pip install 'convergerd[sim]'"
    ]
