"""The distribution: `python -m build` makes an sdist and, from it, a wheel that installs into a
clean venv and runs. Deselect with `-m "not wheel"` (about 20-30 s: the build, and the runtime
dependencies installed from the package index or the pip cache).
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
import venv
from pathlib import Path

import pytest

pytestmark = pytest.mark.wheel

ROOT = Path(__file__).resolve().parents[2]
VERSION = str(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"])


def run(*args: str | Path, timeout_s: float = 90) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True,
                          timeout=timeout_s, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def test_the_wheel_built_from_the_sdist_installs_and_runs_in_a_clean_venv(
    tmp_path: Path,
) -> None:
    dist = tmp_path / "dist"
    # Without options, build makes the sdist and then the wheel from the unpacked sdist: a file
    # missing from the sdist fails here.
    run(sys.executable, "-m", "build", "--outdir", dist, ROOT)
    sdist = dist / f"convergerd-{VERSION}.tar.gz"
    wheel = dist / f"convergerd-{VERSION}-py3-none-any.whl"
    assert sdist.is_file(), sorted(p.name for p in dist.iterdir())
    assert wheel.is_file(), sorted(p.name for p in dist.iterdir())

    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    bin_dir = env_dir / "bin"
    run(bin_dir / "python", "-m", "pip", "install", "--quiet", wheel, timeout_s=110)

    assert run(bin_dir / "convergerd", "--version").stdout.strip() == f"convergerd {VERSION}"
    assert "once" in run(bin_dir / "convergerd", "--help").stdout
    # Package data the daemon needs at run time (`convergerd migrate`), and nothing of the
    # `sim` extra: the daemon's install does not pull it in.
    probe = ("import importlib.resources as r, importlib.util as u; "
             "print(sorted(p.name for p in (r.files('convergerd.store') / 'migrations')"
             ".iterdir() if p.name.endswith('.sql'))[:1], u.find_spec('cryptography') is None,"
             " (r.files('convergerd.api') / 'ui_static' / 'ui.css').is_file())")
    assert run(bin_dir / "python", "-c", probe).stdout.strip() == (
        "['0001_initial.sql'] True True")
