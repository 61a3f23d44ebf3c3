"""``slateflow replay PATH``: the command line of :mod:`slateflow.replay`."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TextIO

from .errors import StoreError
from .replay import DEFAULT_WIDTH, escape, replay

__all__ = ["add_arguments", "run"]


def _seq(text: str) -> int:
    try:
        seq = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a commit seq (an int >= 1)") from None
    if seq < 1:
        raise argparse.ArgumentTypeError(f"{seq} is not a commit seq (seqs start at 1)")
    return seq


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``replay`` command's arguments to ``parser`` (``__main__`` builds the command).

    Also sets the parser's description and examples, shown by ``slateflow replay --help``.
    """
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.description = (
        "Print the timeline of a durable state's commits (a file State.open wrote, or a call\n"
        "State.connect shares on Redis): each commit's seq, UTC time and origin, then each\n"
        "change: key, old -> new value, version and provenance (source/writer, confidence,\n"
        "meta). The file or the call is only read."
    )
    parser.epilog = (
        "examples:\n"
        "  slateflow replay call.db\n"
        "  slateflow replay call.db --from 10 --to 20 --key 'booking:*'\n"
        "  slateflow replay call.db --redact 'user:card' --json | jq .\n"
        "  slateflow replay redis://127.0.0.1:6379/0 --call call-42\n"
        "\nexit code 2 (and a message naming the file) when the file cannot be read"
    )
    parser.add_argument(
        "path",
        help="a durable state's SQLite file (written by State.open), or the redis:// URL of a "
        "server holding shared States (with --call)",
    )
    parser.add_argument(
        "--call", default=None, metavar="CALL_ID", help="the call to show, on a redis:// URL"
    )
    parser.add_argument(
        "--from",
        dest="start",
        type=_seq,
        default=1,
        metavar="SEQ",
        help="first commit to show (default 1); old values still come from the state before it",
    )
    parser.add_argument(
        "--to",
        dest="end",
        type=_seq,
        default=None,
        metavar="SEQ",
        help="last commit to show, inclusive (default: the newest)",
    )
    parser.add_argument(
        "--key",
        dest="keys",
        action="append",
        default=[],
        metavar="GLOB",
        help="only changes to keys matching GLOB, e.g. 'booking:*' (repeatable); commits "
        "with none are skipped",
    )
    parser.add_argument(
        "--redact",
        action="append",
        default=[],
        metavar="GLOB",
        help="print *** for the values of keys matching GLOB (repeatable), beside the keys the "
        "State declared secret (masked by default)",
    )
    parser.add_argument(
        "--show-secrets",
        action="store_true",
        help="print the values of keys the State declared secret (values sealed with an "
        "encryption key stay ***)",
    )
    parser.add_argument(
        "--json", action="store_true", help="one JSON object per line (a commit, or the base)"
    )
    parser.add_argument(
        "--full", action="store_true", help=f"do not cut values longer than {DEFAULT_WIDTH} chars"
    )
    parser.add_argument(
        "--quiet-base",
        action="store_true",
        help="for a compacted file, print only how many keys it was compacted to, not the keys",
    )


def run(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run ``slateflow replay`` with the parsed ``args``; returns the exit code.

    0 when the timeline was printed; 2 (a message on ``err`` naming the file, no traceback)
    when the file is missing, not a store, damaged, or the range is empty.
    """
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        lines = replay(
            args.path,
            start=args.start,
            end=args.end,
            keys=args.keys,
            redact=args.redact,
            show_secrets=args.show_secrets,
            as_json_lines=args.json,
            width=None if args.full else DEFAULT_WIDTH,
            quiet_base=args.quiet_base,
            call=args.call,
        )
    except StoreError as exc:
        print(f"slateflow replay: {escape(str(exc))}", file=err)
        return 2
    try:
        for line in lines:
            _write(out, line)
        out.flush()
    except BrokenPipeError:  # piped into head or less, which stopped reading: not an error
        _quiet_stdout(out)
    return 0


def _write(out: TextIO, line: str) -> None:
    try:
        out.write(line + "\n")
    except UnicodeEncodeError:  # a terminal that cannot show "…" or "é": escape, do not crash
        encoding = getattr(out, "encoding", None) or "ascii"
        out.write(line.encode(encoding, "backslashreplace").decode(encoding) + "\n")


def _quiet_stdout(out: TextIO) -> None:
    # Python flushes stdout again at exit and would report the broken pipe there: point the
    # descriptor at /dev/null so that last flush goes nowhere.
    if out is sys.stdout:
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
        except (OSError, ValueError):
            pass
