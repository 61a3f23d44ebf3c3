"""Command line: ``python -m slateflow demo`` (also installed as the ``slateflow`` script)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from . import __version__


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (default: ``sys.argv[1:]``); returns the exit code."""
    parser = argparse.ArgumentParser(
        prog="slateflow",
        description="slateflow: a reactive state blackboard for conversational and voice agents.",
    )
    parser.add_argument("--version", action="version", version=f"slateflow {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.add_parser("demo", help="narrate a voice-agent booking call on the State")
    args = parser.parse_args(argv)

    if args.command == "demo":
        from .demo import run

        run()
        return 0
    parser.print_help()
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
