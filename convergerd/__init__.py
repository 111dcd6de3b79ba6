"""convergerd: delivers tenants' admission policies into every cluster they cover."""

from importlib import metadata as _metadata


def _version() -> str:
    """The installed distribution's version: pyproject.toml's `version` is the only place it
    is written. A source tree that was never installed reads that file directly."""
    try:
        return _metadata.version("convergerd")
    except _metadata.PackageNotFoundError:
        import tomllib
        from pathlib import Path

        pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
        try:
            with pyproject.open("rb") as f:
                return str(tomllib.load(f)["project"]["version"])
        except (OSError, tomllib.TOMLDecodeError, KeyError):
            return "0+unknown"


__version__ = _version()
