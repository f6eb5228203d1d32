"""``python -m conformance.join HOST:PORT``: this machine becomes one node of a run across
machines, whose controller (``python -m pytest conformance --nnodes N --rdzv-endpoint
HOST:PORT``) listens at HOST:PORT. The run's token comes from ``CONFORMANCE_TOKEN``, as the
controller printed it or as both were given it. See docs/running.md, "Worlds across machines".
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from conformance.world import agent
from conformance.world.protocol import split_endpoint
from conformance.world.seal import ENV_TOKEN


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conformance.join", description=__doc__.split("\n\n")[0])
    parser.add_argument("endpoint", metavar="HOST:PORT", help="the controller's --rdzv-endpoint")
    parser.add_argument(
        "--world-dir",
        type=Path,
        default=None,
        help="where this node's ranks keep their logs (default: a temporary folder, removed when the run ends well)",
    )
    args = parser.parse_args(argv)
    try:
        split_endpoint(args.endpoint)
    except ValueError as exc:
        parser.error(str(exc))
    token = os.environ.get(ENV_TOKEN)
    if not token:
        agent.say(f"set {ENV_TOKEN} to the run's token (the controller prints it where it made one up)")
        return 2
    return agent.run(args.endpoint, token, args.world_dir)


if __name__ == "__main__":
    status = main()
    # threads still inside c10d calls on stores that closed would abort the interpreter's
    # own shutdown (and turn this status into 134): everything is said, so leave at once
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
