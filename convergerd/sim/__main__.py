"""`python -m convergerd.sim`: the simulator without the rest of the CLI (for development)."""

from __future__ import annotations

import argparse
import logging
import sys

from convergerd.sim.main import add_arguments, run


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m convergerd.sim", description=__doc__)
    add_arguments(parser)
    args = parser.parse_args()
    # This is an entry point of its own, so it configures logging like cli.py does.
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
