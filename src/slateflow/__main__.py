"""Command line: ``python -m slateflow demo [--db PATH]``, ``python -m slateflow replay PATH`` and
``python -m slateflow draw MODULE:FLOW`` (also installed as the ``slateflow`` script)."""

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
    demo = commands.add_parser("demo", help="narrate a voice-agent booking call on the State")
    demo.add_argument(
        "--db",
        metavar="PATH",
        help="run the call on a durable state in PATH instead: it drops mid-call; run the same "
        "command again to resume it",
    )
    demo.add_argument(
        "--verbose",
        action="store_true",
        help="tell the call in full, then show the State's journal of another call",
    )
    from .replay_cli import add_arguments

    add_arguments(
        commands.add_parser("replay", help="print the timeline of a durable state's commits")
    )
    from .draw import add_arguments as add_draw_arguments

    add_draw_arguments(
        commands.add_parser(
            "draw",
            help="draw a flow (Mermaid or an HTML page), optionally "
            "coloured by what a recorded call did",
        )
    )
    from .timeline import add_arguments as add_timeline_arguments

    add_timeline_arguments(
        commands.add_parser(
            "timeline", help="write a call's timeline as one HTML page (or serve it live)"
        )
    )
    args = parser.parse_args(argv)

    if args.command == "demo":
        if args.db is not None:
            import anyio

            from .demo_durable import run_durable_demo

            anyio.run(run_durable_demo, args.db, print)
            return 0
        from .demo import run

        run(verbose=args.verbose)
        return 0
    if args.command == "replay":
        from .replay_cli import run as replay

        return replay(args)
    if args.command == "timeline":
        from .timeline import run as timeline

        return timeline(args)
    if args.command == "draw":
        from .draw import run as draw

        return draw(args)
    parser.print_help()
    return 2


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except BrokenPipeError:  # `slateflow demo | head`: the reader left; nothing is wrong
        import os
        import sys

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(0) from None
