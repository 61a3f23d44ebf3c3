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

import json
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from .errors import StoreCorruptError, StoreError
from .state.governance import SECRET_KEYS
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
    "as_json",
    "escape",
    "load",
    "render",
    "replay",
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


REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


def recorded_secrets(store: Store, upto: int | None = None) -> tuple[str, ...]:
    """Every pattern the file records as secret (``policy:secret``), anywhere in it (a key
    declared secret late masks its earlier values too); a damaged part after ``upto`` is
    skipped, so the range before it still reads."""
    found: dict[str, None] = {}
    loaded = store.read(upto=0)
    for row in loaded.base:
        if row[0] == SECRET_KEYS and isinstance(row[1], list):
            found.update(dict.fromkeys(str(p) for p in row[1]))
    try:
        commits = list(store.commits(after=0))
    except StoreCorruptError:
        commits = list(store.commits(after=0, upto=upto))
    for commit in commits:
        for change in commit[3]:
            if change[0] == SECRET_KEYS and isinstance(change[1], list):
                found.update(dict.fromkeys(str(p) for p in change[1]))
    return tuple(found)


def timeline(
    store: Store,
    *,
    start: int = 1,
    end: int | None = None,
    keys: str | Iterable[str] = (),
    redact: str | Iterable[str] = (),
    secret: Callable[[str], bool] | None = None,
    show_secrets: bool = False,
) -> Timeline:
    """The commits of ``store`` with ``start <= seq <= end``, each change with its old value.

    Old values come from the state just before ``start`` (the compacted base plus the commits
    up to ``start - 1``), so a range shows the same old values as the whole timeline. Commits
    before a compaction are gone: a range reaching into them starts at the compaction.
    ``keys``: glob patterns (``fnmatch``, case-sensitive); only changes to matching keys are
    kept, and commits left with none are dropped. ``redact``: glob patterns of keys whose values
    are masked. ``secret``: a predicate masking more keys, e.g. ``state.is_secret`` or a
    :class:`~slateflow.state.policy.Policy`'s ``is_secret``. The keys the State declared
    secret are masked by default: a State with a store records their patterns in the file
    (``policy:secret``); ``show_secrets=True`` shows them (never values sealed with an
    encryption key). Raises :class:`~slateflow.errors.StoreCorruptError` for a damaged store.
    """
    keys, redact = _globs(keys), _globs(redact)
    if not show_secrets:
        redact = (*redact, *recorded_secrets(store, end))

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


def escape(text: str) -> str:
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
    text = escape(json.dumps(value, ensure_ascii=False, separators=separators))
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
    who = escape(source + (f"/{writer}" if writer else ""))
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
    name = escape(path)
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
                yield f"  {escape(e.key)}  {value}  v{e.version}  {who}  (seq {e.seq})"
    for commit in found.commits:
        yield ""
        yield f"seq {commit.seq}  {_time(commit.at_ns, zulu=True)}  {escape(commit.origin)}"
        for c in commit.changes:
            old = "(new)" if c.created else SECRET_MASK if c.redacted else _show(c.old, width)
            new = "(removed)" if c.removed else SECRET_MASK if c.redacted else _show(c.new, width)
            version = "" if c.removed else f"  v{c.version}"
            who = _who(c.source, c.writer, c.confidence, c.meta, width)
            yield f"  {escape(c.key)}  {old} -> {new}{version}  {who}"


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


def replay(
    path: str | os.PathLike[str],
    *,
    start: int = 1,
    end: int | None = None,
    keys: str | Iterable[str] = (),
    redact: str | Iterable[str] = (),
    secret: Callable[[str], bool] | None = None,
    show_secrets: bool = False,
    as_json_lines: bool = False,
    width: int | None = DEFAULT_WIDTH,
    quiet_base: bool = False,
    call: str | None = None,
) -> list[str]:
    """The lines ``slateflow replay`` prints for the file at ``path`` (see :func:`timeline`),
    or for the call ``call`` of a State shared on Redis when ``path`` is a ``redis://`` URL.

    The file is opened read-only, without the writer's lock, so a file another process is
    writing can be read (its commits on disk at that moment). Raises
    :class:`~slateflow.errors.StoreError` for a missing path (nothing is created there) or a
    range that is not one, and :class:`~slateflow.errors.StoreCorruptError` for a file that is
    not a readable store.
    """
    if start < 1 or (end is not None and end < start):
        shown = "the newest" if end is None else end
        raise StoreError(
            f"--from {start} --to {shown} is not a range of commits: give 1 <= from <= to"
        )
    options = {"start": start, "end": end, "keys": keys, "redact": redact, "secret": secret,
               "show_secrets": show_secrets}  # fmt: skip
    found = load(path, call=call, **options)
    label = f"{path} call {call}" if str(path).startswith(REDIS_SCHEMES) else str(path)
    if as_json_lines:
        lines = [_base_json(found)] if found.reaches_base else []
        lines.extend(as_json(commit) for commit in found.commits)
        return lines
    return list(render(found, label, width=width, quiet_base=quiet_base))


def load(path: str | os.PathLike[str], *, call: str | None = None, **options: Any) -> Timeline:
    """The :func:`timeline` of the file at ``path`` (opened read-only), or of the call ``call``
    of a State shared on Redis when ``path`` is a ``redis://`` URL; ``options`` go to
    :func:`timeline`."""
    text = str(path)
    if text.startswith(REDIS_SCHEMES):
        if not call:
            raise StoreError(f"{text} holds many calls: name one with --call CALL_ID")
        return _from_redis(text, call, options)
    return _from_file(Path(path), options)


def _from_redis(url: str, call: str, options: dict[str, Any]) -> Timeline:
    """The timeline of a call a shared State keeps on Redis (read only: nothing follows)."""
    from .stores.redis import RedisStore

    try:
        store = RedisStore(url, call)
    except ValueError as exc:
        raise StoreError(f"{url}: {exc}") from None
    if store.head()[0] == 0:
        raise StoreError(f"no call {call!r} on {store.server.where}: check the id and the db")
    return timeline(store, **options)


def _from_file(where: Path, options: dict[str, Any]) -> Timeline:
    """The timeline of a file State.open wrote, opened read-only."""
    if not where.exists():
        raise StoreError(f"no store at {str(where)!r}: give the path of a file State.open wrote")
    if not where.is_file():
        raise StoreError(f"{str(where)!r} is not a file: give the path of a file State.open wrote")
    if where.stat().st_size == 0:
        raise StoreCorruptError(
            f"{str(where)!r} is empty, not a slateflow store: give the path of a file State.open "
            "wrote"
        )
    store = SQLiteStore(where, readonly=True)
    try:
        return timeline(store, **options)
    finally:
        store.close()
