"""``slateflow replay call.db``: the timeline of a durable state's commits, for a person to read.

Each commit is printed with its seq, time (UTC, to the millisecond) and origin (``set``,
``update``, ``remove``, ``commit`` for a transaction, a resolver's run, a flow), then one line per
change: the key, its old and new value, its version and who wrote it (source, writer,
confidence, meta). A file compacted by ``state.journal.compact()`` starts with the entries it was
compacted to. ``--json`` prints one JSON object per line instead, for tools. The file is only
read.

The pieces are usable from Python: :func:`timeline` builds the data from any
:class:`~slateflow.stores.Store`, :func:`render` and :func:`as_json` format it, and :func:`replay`
does all of it for a file.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, TextIO

from .errors import StoreCorruptError, StoreError
from .state.records import SECRET_MASK
from .state.sealing import is_sealed
from .stores.base import Store
from .stores.records import CommitRow
from .stores.sqlite import SQLiteStore

__all__ = [
    "DEFAULT_WIDTH",
    "ReplayChange",
    "ReplayCommit",
    "ReplayEntry",
    "Timeline",
    "add_arguments",
    "as_json",
    "render",
    "replay",
    "run",
    "timeline",
]

DEFAULT_WIDTH = 60
"""How many characters of a value's JSON the text timeline shows before cutting it with ``…``."""

_ABSENT: Any = object()
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class ReplayChange:
    """One key's change in a commit: its value before and after, and who wrote it.

    ``old`` is the value just before the commit (None when ``created``); ``new`` is None when
    ``removed``. When ``redacted``, both are None and the renderers print ``***``.
    """

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
        """Whether this change removed the key (its version is 0)."""
        return self.version == 0


@dataclass(frozen=True, slots=True)
class ReplayCommit:
    """One committed batch: its seq, time (ns since the epoch), origin and changes.

    ``changes`` holds only the changes kept by the key filter, in the commit's order.
    """

    seq: int
    at_ns: int
    origin: str
    changes: tuple[ReplayChange, ...]

    @property
    def at(self) -> datetime:
        """The commit's time, in UTC (to the microsecond)."""
        return _datetime(self.at_ns)


@dataclass(frozen=True, slots=True)
class ReplayEntry:
    """One key of a compacted file's base: its value as of the compaction, and who wrote it.

    ``seq`` and ``at_ns`` are those of the commit that last wrote the key. When ``redacted``,
    ``value`` is None and the renderers print ``***``.
    """

    key: str
    value: Any
    version: int
    seq: int
    at_ns: int
    source: str
    writer: str | None
    confidence: float | None
    meta: dict[str, Any] | None
    redacted: bool = False


@dataclass(frozen=True, slots=True)
class Timeline:
    """What a store holds for a range of commits: the compaction point, and the commits.

    ``base_seq`` is the seq the file was last compacted to (0: never); ``base`` holds its
    entries (sorted by key, filtered by the key globs) when the range starts at or before
    the compaction, else it is empty; ``base_size`` counts all its entries. ``head`` is the
    newest seq read (the file's newest when no ``end`` was given). ``start`` and ``end`` are
    the range asked for.
    """

    base_seq: int
    base_size: int
    base: tuple[ReplayEntry, ...]
    head: int
    start: int
    end: int | None
    commits: tuple[ReplayCommit, ...]

    @property
    def reaches_base(self) -> bool:
        """Whether the range starts at or before the compaction (so the base matters)."""
        return self.base_seq > 0 and self.start <= self.base_seq + 1


def timeline(
    store: Store,
    *,
    start: int = 1,
    end: int | None = None,
    keys: str | Iterable[str] = (),
    redact: str | Iterable[str] = (),
    secret: Callable[[str], bool] | None = None,
) -> Timeline:
    """The commits of ``store`` with ``start <= seq <= end``, each change with its old value.

    Old values come from the state just before ``start`` (the compacted base plus the commits
    up to ``start - 1``), so a range shows the same old values as the whole timeline. Commits
    before a compaction are gone: a range reaching into them starts at the compaction.
    ``keys``: glob patterns (``fnmatch``, case-sensitive); only changes to matching keys are
    kept, and commits left with none are dropped. ``redact``: glob patterns of keys whose values
    are masked. ``secret``: a predicate masking more keys, e.g. ``state.is_secret`` or a
    :class:`~slateflow.state.policy.Policy`'s ``is_secret`` (the file does not store which keys
    are secret: policies are code). Raises :class:`~slateflow.errors.StoreCorruptError` for a
    damaged store.
    """
    keys, redact = _globs(keys), _globs(redact)

    def shown(key: str) -> bool:
        return not keys or any(fnmatchcase(key, k) for k in keys)

    def hidden(key: str) -> bool:
        return any(fnmatchcase(key, r) for r in redact) or (secret is not None and secret(key))

    before = max(start - 1, 0)
    loaded = store.read(upto=before)
    values: dict[str, Any] = {row[0]: row[1] for row in loaded.base}
    for commit in loaded.commits:
        _apply(values, commit)
    head = loaded.head
    base: list[ReplayEntry] = []
    if loaded.base_seq and start <= loaded.base_seq + 1:
        for key, value, version, seq, at_ns, source, writer, confidence, meta in sorted(
            loaded.base, key=lambda row: row[0]
        ):
            if shown(key):
                mask = hidden(key) or is_sealed(value)
                base.append(
                    ReplayEntry(
                        key,
                        None if mask else value,
                        version,
                        seq,
                        at_ns,
                        source,
                        writer,
                        confidence,
                        _masked(meta) if mask else meta,
                        mask,
                    )
                )
    commits = []
    for commit in store.commits(after=before, upto=end):
        head = commit[0]
        changes = []
        for key, value, version, source, writer, confidence, meta in commit[3]:
            if shown(key):
                old = values.get(key, _ABSENT)
                # Sealed with an encryption key this replay does not have: shown as ***.
                mask = hidden(key) or is_sealed(value) or is_sealed(old)
                changes.append(
                    ReplayChange(
                        key,
                        None if mask or old is _ABSENT else old,
                        None if mask else value,
                        version,
                        source,
                        writer,
                        confidence,
                        _masked(meta) if mask else meta,
                        old is _ABSENT,
                        mask,
                    )
                )
        _apply(values, commit)
        if changes:
            commits.append(ReplayCommit(commit[0], commit[1], commit[2], tuple(changes)))
    return Timeline(
        loaded.base_seq, len(loaded.base), tuple(base), head, start, end, tuple(commits)
    )


def _globs(patterns: str | Iterable[str]) -> list[str]:
    # A lone string is one glob, not a set of one-character globs.
    return [patterns] if isinstance(patterns, str) else list(patterns)


def _apply(values: dict[str, Any], commit: CommitRow) -> None:
    for key, value, version, *_ in commit[3]:
        if version:
            values[key] = value
        else:
            values.pop(key, None)


# -- rendering -------------------------------------------------------------------------------


def _escape(text: str) -> str:
    """``text`` with every unprintable character (controls, bidi overrides, lone surrogates)
    as a ``\\uXXXX`` escape, so a stored value cannot drive the terminal; inside JSON strings
    the escapes read back as the same characters."""
    if text.isprintable():
        return text
    out = []
    for ch in text:
        if ch.isprintable():
            out.append(ch)
            continue
        code = ord(ch)
        if code > 0xFFFF:  # as a UTF-16 surrogate pair, which JSON reads back
            code -= 0x10000
            out.append(f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}")
        else:
            out.append(f"\\u{code:04x}")
    return "".join(out)


def _show(value: Any, width: int | None, *, compact: bool = False) -> str:
    separators = (",", ":") if compact else (", ", ": ")
    text = _escape(json.dumps(value, ensure_ascii=False, separators=separators))
    if width is not None and len(text) > width:
        text = text[: max(width - 1, 1)] + "…"
    return text


def _masked(meta: dict[str, Any] | None) -> dict[str, Any] | None:
    # A writer may fill a secret key's meta from its value: its values are masked too.
    return dict.fromkeys(meta, SECRET_MASK) if meta else meta


def _who(
    source: str,
    writer: str | None,
    confidence: float | None,
    meta: dict[str, Any] | None,
    width: int | None,
) -> str:
    who = _escape(source + (f"/{writer}" if writer else ""))
    if confidence is not None and confidence != 1:
        who += f" conf {confidence:g}"
    if meta:
        who += " " + _show(meta, width, compact=True)
    return who


def _datetime(at_ns: int) -> datetime:
    # Integer arithmetic: a float of ns since 1970 rounds (0.9999995 s would show the next second).
    return _EPOCH + timedelta(microseconds=at_ns // 1000)


def _time(at_ns: int, *, zulu: bool = False) -> str:
    try:
        text = _datetime(at_ns).isoformat(timespec="milliseconds")
    except OverflowError:  # a damaged or hand-edited time: show it as it is stored
        return f"{at_ns}ns"
    return text.replace("+00:00", "Z") if zulu else text


def render(
    found: Timeline, path: str, *, width: int | None = DEFAULT_WIDTH, quiet_base: bool = False
) -> Iterator[str]:
    """The timeline as lines of text (no line ends), as ``slateflow replay`` prints them.

    A header line names ``path`` and the range; a compacted file's base follows (its entries,
    or only their count with ``quiet_base``), then each commit: a blank line, ``seq N  time
    origin``, and one indented line per change. Values (and provenance meta) are compact JSON
    cut to ``width`` characters with ``…`` (None: never cut); unprintable characters are
    escaped.
    """
    name = _escape(path)
    if found.head < found.start:
        yield f"{name}: no commits from seq {found.start}: the newest is seq {found.head}"
    else:
        yield f"{name}: seq {found.start} to {found.head}, {len(found.commits)} commit(s) shown"
    if found.reaches_base:
        n = found.base_seq
        if quiet_base:
            yield (
                f"(history up to seq {n} was compacted: the file starts from the "
                f"{found.base_size} key(s) as they were then)"
            )
        else:
            listed = "" if len(found.base) == found.base_size else f", {len(found.base)} shown"
            yield (
                f"(history up to seq {n} was compacted: the file starts from these "
                f"{found.base_size} key(s){listed}, as they were then)"
            )
            for e in found.base:
                value = SECRET_MASK if e.redacted else _show(e.value, width)
                who = _who(e.source, e.writer, e.confidence, e.meta, width)
                yield f"  {_escape(e.key)}  {value}  v{e.version}  {who}  (seq {e.seq})"
    for commit in found.commits:
        yield ""
        yield f"seq {commit.seq}  {_time(commit.at_ns, zulu=True)}  {_escape(commit.origin)}"
        for c in commit.changes:
            old = "(new)" if c.created else SECRET_MASK if c.redacted else _show(c.old, width)
            new = "(removed)" if c.removed else SECRET_MASK if c.redacted else _show(c.new, width)
            version = "" if c.removed else f"  v{c.version}"
            who = _who(c.source, c.writer, c.confidence, c.meta, width)
            yield f"  {_escape(c.key)}  {old} -> {new}{version}  {who}"


def _dumps(record: dict[str, Any]) -> str:
    # ASCII: valid in any output encoding, lone surrogates and controls escaped.
    return json.dumps(record, ensure_ascii=True, separators=(",", ":"))


def as_json(commit: ReplayCommit) -> str:
    """One commit as a line of JSON (ASCII), what ``slateflow replay --json`` prints.

    ``{"kind": "commit", "seq", "at" (ISO 8601, UTC, ms), "at_ns", "origin", "changes": [{"key",
    "old", "new", "created", "removed", "version", "source", "writer", "confidence", "meta"}]}``;
    ``old`` is null when created, ``new`` is null when removed, and a redacted value is
    ``"***"``.
    """
    return _dumps(
        {
            "kind": "commit",
            "seq": commit.seq,
            "at": _time(commit.at_ns),
            "at_ns": commit.at_ns,
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
        }
    )


def _base_json(found: Timeline) -> str:
    return _dumps(
        {
            "kind": "base",
            "seq": found.base_seq,
            "size": found.base_size,
            "entries": [
                {
                    "key": e.key,
                    "value": SECRET_MASK if e.redacted else e.value,
                    "version": e.version,
                    "seq": e.seq,
                    "at": _time(e.at_ns),
                    "at_ns": e.at_ns,
                    "source": e.source,
                    "writer": e.writer,
                    "confidence": e.confidence,
                    "meta": e.meta,
                }
                for e in found.base
            ],
        }
    )


# -- the command ------------------------------------------------------------------------------


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
        "Print the timeline of a durable state's commits (a file State.open wrote): each\n"
        "commit's seq, UTC time and origin, then each change: key, old -> new value, version\n"
        "and provenance (source/writer, confidence, meta). The file is only read."
    )
    parser.epilog = (
        "examples:\n"
        "  slateflow replay call.db\n"
        "  slateflow replay call.db --from 10 --to 20 --key 'booking:*'\n"
        "  slateflow replay call.db --redact 'user:card' --json | jq .\n"
        "\nexit code 2 (and a message naming the file) when the file cannot be read"
    )
    parser.add_argument("path", help="a durable state's SQLite file (written by State.open)")
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
        help="print *** for the values of keys matching GLOB (repeatable); the file does not "
        "record which keys are secret, so name them here",
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
            as_json_lines=args.json,
            width=None if args.full else DEFAULT_WIDTH,
            quiet_base=args.quiet_base,
        )
    except StoreError as exc:
        print(f"slateflow replay: {_escape(str(exc))}", file=err)
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


def replay(
    path: str | os.PathLike[str],
    *,
    start: int = 1,
    end: int | None = None,
    keys: str | Iterable[str] = (),
    redact: str | Iterable[str] = (),
    secret: Callable[[str], bool] | None = None,
    as_json_lines: bool = False,
    width: int | None = DEFAULT_WIDTH,
    quiet_base: bool = False,
) -> list[str]:
    """The lines ``slateflow replay`` prints for the file at ``path`` (see :func:`timeline`).

    The file is opened read-only, without the writer's lock, so a file another process is
    writing can be read (its commits on disk at that moment). Raises
    :class:`~slateflow.errors.StoreError` for a missing path (nothing is created there) or a
    range that is not one, and :class:`~slateflow.errors.StoreCorruptError` for a file that is
    not a readable store.
    """
    where = Path(path)
    if not where.exists():
        raise StoreError(f"no store at {str(where)!r}: give the path of a file State.open wrote")
    if not where.is_file():
        raise StoreError(f"{str(where)!r} is not a file: give the path of a file State.open wrote")
    if where.stat().st_size == 0:
        raise StoreCorruptError(
            f"{str(where)!r} is empty, not a slateflow store: give the path of a file State.open "
            "wrote"
        )
    if start < 1 or (end is not None and end < start):
        shown = "the newest" if end is None else end
        raise StoreError(
            f"--from {start} --to {shown} is not a range of commits: give 1 <= from <= to"
        )
    store = SQLiteStore(where, readonly=True)
    try:
        found = timeline(store, start=start, end=end, keys=keys, redact=redact, secret=secret)
    finally:
        store.close()
    if as_json_lines:
        lines = [_base_json(found)] if found.reaches_base else []
        lines.extend(as_json(commit) for commit in found.commits)
        return lines
    return list(render(found, str(where), width=width, quiet_base=quiet_base))
