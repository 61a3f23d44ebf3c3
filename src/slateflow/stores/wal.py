"""Checking a SQLite write-ahead log before SQLite recovers it.

After a crash the ``-wal`` file holds the newest commits. SQLite's recovery reads its frames in
order and stops, silently, at the first frame whose salt or checksum is wrong: one flipped bit
drops that commit and every one after it, ``durability="sync"`` ones included, and a flip in the
log's header drops the whole log. The format is documented (https://sqlite.org/fileformat.html,
"The WAL File Format"), so the store reads it first: a frame that fails while frames after it
still carry this log's salt and verify (each checked against the checksum stored in the frame
before it) is damage, not the torn tail a crash leaves, and opening raises
``StoreCorruptError`` naming the frame. What cannot be told from a torn write is the damage in
the log's last frame, or a log cut short: those open as the shorter history SQLite recovers.
"""

from __future__ import annotations

import logging
import shutil
import struct
from pathlib import Path

from ..errors import StoreCorruptError

__all__ = ["check_wal"]

log = logging.getLogger("slateflow.stores")

_MAGIC = {0x377F0682: "<", 0x377F0683: ">"}  # checksum words little- or big-endian
_HEADER = 32
_FRAME_HEADER = 24


def _checksum(data: bytes, order: str, s0: int, s1: int) -> tuple[int, int]:
    words = struct.unpack(f"{order}{len(data) // 4}I", data)
    for i in range(0, len(words), 2):
        s0 = (s0 + words[i] + s1) & 0xFFFFFFFF
        s1 = (s1 + words[i + 1] + s0) & 0xFFFFFFFF
    return s0, s1


def check_wal(db: Path, *, salvage: bool = False) -> None:
    """Raise ``StoreCorruptError`` if ``db``'s ``-wal`` holds damage that SQLite's recovery
    would silently cut off (see the module docstring); a missing or empty log passes. With
    ``salvage`` the damaged log is copied to ``-wal.damaged`` and a warning logged instead:
    SQLite then keeps what comes before the damage."""
    try:
        _check(db)
    except StoreCorruptError as exc:
        if not salvage:
            raise
        kept = Path(f"{db}-wal.damaged")
        shutil.copyfile(f"{db}-wal", kept)
        log.warning("%s; salvaging: the damaged log is kept at %s", exc, kept)


def _check(db: Path) -> None:
    try:
        data = Path(f"{db}-wal").read_bytes()
    except FileNotFoundError:
        return
    if len(data) < _HEADER:
        return
    magic, _version, page_size, _ckpt, salt1, salt2, c0, c1 = struct.unpack(">8I", data[:_HEADER])
    order = _MAGIC.get(magic)
    if (
        order is None
        or page_size < 512
        or page_size & (page_size - 1)
        or _checksum(data[:24], order, 0, 0) != (c0, c1)
    ):
        # SQLite ignores a log whose header fails: damage, if its frames still verify.
        frames = _damaged_header(data, (salt1, salt2), (c0, c1))
        if frames:
            raise StoreCorruptError(_message(db, "its header", frames))
        return
    size = _FRAME_HEADER + page_size
    frames = (len(data) - _HEADER) // size
    prev = (c0, c1)
    for n in range(frames):
        if not _verifies(data, n, size, order, (salt1, salt2), prev):
            for m in range(n + 1, frames):
                if _verifies(data, m, size, order, (salt1, salt2), _stored(data, m - 1, size)):
                    raise StoreCorruptError(_message(db, f"frame {n + 1} of {frames}", frames - n))
            return  # the log ends here: a torn tail, or frames of an older log
        prev = _stored(data, n, size)


def _stored(data: bytes, n: int, size: int) -> tuple[int, int]:
    """The checksum stored in frame ``n`` (0-based)."""
    at = _HEADER + n * size + 16
    c0, c1 = struct.unpack(">2I", data[at : at + 8])
    return c0, c1


def _verifies(
    data: bytes,
    n: int,
    size: int,
    order: str,
    salt: tuple[int, int],
    seed: tuple[int, int],
) -> bool:
    """Whether frame ``n`` (0-based) carries ``salt`` and its checksum, computed
    from ``seed`` (the checksum before it), matches the one it stores."""
    at = _HEADER + n * size
    head = data[at : at + _FRAME_HEADER]
    if len(head) < _FRAME_HEADER:
        return False
    *_, f_salt1, f_salt2, f0, f1 = struct.unpack(">6I", head)
    if (f_salt1, f_salt2) != salt:
        return False
    body = data[at + _FRAME_HEADER : at + size]
    return _checksum(body, order, *_checksum(head[:8], order, *seed)) == (f0, f1)


def _damaged_header(data: bytes, salt: tuple[int, int], seed: tuple[int, int]) -> int:
    """For a log whose header fails: how many frames verify under some layout (the first
    from the header's stored checksum, or the second, carrying the header's salt, from the
    first's), 0 when none does. Frames of an older log (a header torn as a new log began) were
    chained from another header's checksum and carry another salt."""
    for page_size in (4096, 1024, 2048, 8192, 16384, 32768, 65536, 512):
        size = _FRAME_HEADER + page_size
        frames = (len(data) - _HEADER) // size
        if not frames:
            continue
        for order in ("<", ">"):
            # Chained from the header's stored checksum, the first frame was written under
            # this very header: its salt is the one the header lost.
            own = struct.unpack(">2I", data[_HEADER + 8 : _HEADER + 16])
            if _verifies(data, 0, size, order, (own[0], own[1]), seed) or (
                frames > 1 and _verifies(data, 1, size, order, salt, _stored(data, 0, size))
            ):
                return frames
    return 0


def _message(db: Path, where: str, lost: int) -> str:
    return (
        f"{str(db)!r}: its write-ahead log ({db.name}-wal) is damaged at {where}, with valid "
        f"commits after it: SQLite would silently drop {lost} frame(s) of committed work. "
        "Nothing was opened or changed. Restore the file and its -wal from a backup, or open "
        "what can be saved with SQLiteStore(path, salvage=True) (the log is kept beside it as "
        "-wal.damaged, and the history ends before the damage)"
    )
