"""``slateflow replay call.db``: the timeline of a durable state's commits, for a person to read.

Each commit is printed with its seq, time (UTC) and origin (``set``, ``update``, ``tx``, a
resolver's run, a flow), then one line per change: the key, its old and new value, its version
and who wrote it (source, writer, confidence, meta). ``--json`` prints one JSON object per
commit instead, for tools. The file is only read.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, TextIO

from .errors import StoreError
from .state.records import SECRET_MASK
from .stores.records import CommitRow
from .stores.sqlite import SQLiteStore

__all__ = ["ReplayChange", "ReplayCommit", "add_arguments", "replay", "run", "timeline"]

_ABSENT: Any = object()


@dataclass(frozen=True, slots=True)
class ReplayChange:
    """One key's change in a commit: its value before and after, and who wrote it."""

    key: str
    old: Any
    new: Any
    version: int
    """The key's version after the change; 0 means it was removed."""
    source: str
    writer: str | None
    confidence: float | None
    meta: dict[str, Any] | None
    created: bool
    """Whether the key did not exist before this commit."""
    redacted: bool = False
    """Whether the values are masked (``old`` and ``new`` are then None)."""

    @property
    def removed(self) -> bool:
        return self.version == 0


@dataclass(frozen=True, slots=True)
class ReplayCommit:
    """One committed batch: its seq, time (ns since the epoch), origin and changes."""

    seq: int
    at_ns: int
    origin: str
    changes: tuple[ReplayChange, ...]

    @property
    def at(self) -> datetime:
        return datetime.fromtimestamp(self.at_ns / 1e9, tz=UTC)


@dataclass(frozen=True, slots=True)
class Timeline:
    """What a file holds in a range: the compaction point, and the commits."""

    base_seq: int
    base_keys: int
    head: int
    commits: list[ReplayCommit]


def timeline(
    store: SQLiteStore,
    *,
    start: int = 1,
    end: int | None = None,
    keys: Sequence[str] = (),
    redact: Sequence[str] = (),
) -> Timeline:
    """The commits of ``store`` with ``start <= seq <= end``, each change with its old value.

    ``keys``: glob patterns (``fnmatch``); only changes to matching keys are kept, and commits
    left with none are dropped. ``redact``: glob patterns of keys whose values are masked.
    """
    before = max(start - 1, 0)
    loaded = store.read(upto=before)
    values: dict[str, Any] = {row[0]: row[1] for row in loaded.base}
    for commit in loaded.commits:
        _apply(values, commit)
    head = loaded.head
    commits = []
    for commit in store.commits(after=before, upto=end):
        head = commit[0]
        changes = []
        for key, value, version, source, writer, confidence, meta in commit[3]:
            old = values.get(key, _ABSENT)
            if not keys or any(fnmatchcase(key, k) for k in keys):
                hidden = any(fnmatchcase(key, r) for r in redact)
                changes.append(
                    ReplayChange(
                        key,
                        None if hidden or old is _ABSENT else old,
                        None if hidden else value,
                        version,
                        source,
                        writer,
                        confidence,
                        meta,
                        old is _ABSENT,
                        hidden,
                    )
                )
        _apply(values, commit)
        if changes:
            commits.append(ReplayCommit(commit[0], commit[1], commit[2], tuple(changes)))
    return Timeline(loaded.base_seq, len(loaded.base), head, commits)


def _apply(values: dict[str, Any], commit: CommitRow) -> None:
    for key, value, version, *_ in commit[3]:
        if version:
            values[key] = value
        else:
            values.pop(key, None)


# -- rendering -------------------------------------------------------------------------------


def _show(value: Any, width: int | None) -> str:
    text = json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
    if width is not None and len(text) > width:
        text = text[: width - 1] + "…"
    return text


def _who(change: ReplayChange) -> str:
    who = change.source + (f"/{change.writer}" if change.writer else "")
    if change.confidence is not None:
        who += f" conf {change.confidence:g}"
    if change.meta:
        who += " " + json.dumps(change.meta, ensure_ascii=False, separators=(",", ":"))
    return who


def _time(at_ns: int) -> str:
    return datetime.fromtimestamp(at_ns / 1e9, tz=UTC).isoformat(timespec="milliseconds")


def render(
    found: Timeline, path: str, *, start: int = 1, end: int | None = None, width: int | None = 60
) -> Iterator[str]:
    """The timeline as lines of text."""
    shown = len(found.commits)
    span = f"seq {start} to {end}" if end is not None else f"seq {start} to {found.head}"
    yield f"{path}: {span}, {shown} commit(s) shown"
    if found.base_seq:
        yield (
            f"(history up to seq {found.base_seq} was compacted: the file starts from the "
            f"{found.base_keys} key(s) as they were then)"
        )
    for commit in found.commits:
        yield ""
        yield f"seq {commit.seq}  {_time(commit.at_ns).replace('+00:00', 'Z')}  {commit.origin}"
        for c in commit.changes:
            mask = str(SECRET_MASK)
            old = "(new)" if c.created else mask if c.redacted else _show(c.old, width)
            new = "(removed)" if c.removed else mask if c.redacted else _show(c.new, width)
            version = "" if c.removed else f"  v{c.version}"
            yield f"  {c.key}  {old} -> {new}{version}  {_who(c)}"


def as_json(commit: ReplayCommit) -> str:
    """One commit as a line of JSON."""
    return json.dumps(
        {
            "seq": commit.seq,
            "at": _time(commit.at_ns),
            "origin": commit.origin,
            "changes": [
                {
                    "key": c.key,
                    "old": SECRET_MASK if c.redacted and not c.created else c.old,
                    "new": SECRET_MASK if c.redacted and not c.removed else c.new,
                    "created": c.created,
                    "removed": c.removed,
                    "version": c.version,
                    "source": c.source,
                    "writer": c.writer,
                    "confidence": c.confidence,
                    "meta": c.meta,
                }
                for c in commit.changes
            ],
        },
        ensure_ascii=False,
    )


# -- the command ------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``replay`` command's options."""
    parser.add_argument("path", help="a durable state's SQLite file (State.open)")
    parser.add_argument(
        "--from",
        dest="start",
        type=int,
        default=1,
        metavar="SEQ",
        help="first commit to show (default 1)",
    )
    parser.add_argument(
        "--to",
        dest="end",
        type=int,
        default=None,
        metavar="SEQ",
        help="last commit to show (default: the newest)",
    )
    parser.add_argument(
        "--key",
        dest="keys",
        action="append",
        default=[],
        metavar="GLOB",
        help="only changes to keys matching GLOB (repeatable)",
    )
    parser.add_argument(
        "--redact",
        action="append",
        default=[],
        metavar="GLOB",
        help="mask the values of keys matching GLOB (repeatable)",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per commit")
    parser.add_argument("--full", action="store_true", help="do not shorten long values")


def run(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run ``slateflow replay`` with parsed ``args``; returns the exit code."""
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        lines = replay(
            args.path,
            start=args.start,
            end=args.end,
            keys=args.keys,
            redact=args.redact,
            as_json_lines=args.json,
            width=None if args.full else 60,
        )
    except StoreError as exc:
        print(f"slateflow replay: {exc}", file=err)
        return 2
    try:
        for line in lines:
            print(line, file=out)
        out.flush()
    except BrokenPipeError:  # piped into head or less, which stopped reading: not an error
        return 0
    return 0


def replay(
    path: str | Path,
    *,
    start: int = 1,
    end: int | None = None,
    keys: Iterable[str] = (),
    redact: Iterable[str] = (),
    as_json_lines: bool = False,
    width: int | None = 60,
) -> list[str]:
    """The lines ``slateflow replay`` prints for the file at ``path``.

    Raises :class:`~slateflow.errors.StoreError` for a missing file (none is created) or
    :class:`~slateflow.errors.StoreCorruptError` for one that is not a readable store.
    """
    where = Path(path)
    if not where.is_file():
        raise StoreError(f"no store at {str(where)!r}: give the path of a State.open file")
    if start < 1 or (end is not None and end < start):
        raise StoreError(f"--from {start} --to {end} is not a range of commits (1 <= from <= to)")
    store = SQLiteStore(where, readonly=True)
    try:
        found = timeline(store, start=start, end=end, keys=list(keys), redact=list(redact))
    finally:
        store.close()
    if as_json_lines:
        return [as_json(commit) for commit in found.commits]
    return list(render(found, str(where), start=start, end=end, width=width))
