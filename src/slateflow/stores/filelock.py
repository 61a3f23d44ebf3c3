"""The one-writer lock of a store file, held on the file itself (its inode, not its name).

A lock keyed by the path string let the same file through a symlink, a hard link or another
spelling of the path take a second writer; an ``flock`` on the file's own inode is shared by
every name it has. The same descriptor tells when the file was deleted or replaced under an
open store (log rotation, cleanup): the path then names another inode, or none.
"""

from __future__ import annotations

import os
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows: no flock; a second writer is caught when commits collide
    fcntl = None  # type: ignore[assignment]

from ..errors import StoreError

__all__ = ["FileLock"]


class FileLock:
    """An exclusive ``flock`` on the store file at ``path``, held until :meth:`release`.

    Acquire it only while the file exists (after SQLite created it). Keep the descriptor open
    until SQLite's connections to the file are closed: closing any descriptor of a file drops
    the POSIX locks SQLite holds on it in this process.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        # Absolute now: a later chdir must not make the check look at another file.
        self._where = os.path.abspath(path)
        self._fd: int | None = None
        self._identity: tuple[int, int] | None = None

    @property
    def held(self) -> bool:
        """Whether this lock is held."""
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lock, or raise ``StoreError`` naming the process that holds it."""
        try:
            fd = os.open(self._where, os.O_RDONLY)
        except OSError as exc:
            raise StoreError(f"cannot lock store {str(self.path)!r}: {exc}") from None
        stat = os.fstat(fd)
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                raise self._taken(stat) from None
        self._fd = fd
        self._identity = (stat.st_dev, stat.st_ino)

    def _taken(self, stat: os.stat_result) -> StoreError:
        holder = _holder(stat)
        who = f"process {holder}" if holder is not None else "another process"
        if holder == os.getpid():
            who = f"process {holder}, this one"
        names = ""
        if stat.st_nlink > 1:
            names = (
                f"; the file has {stat.st_nlink} names (hard links), and every name shares one "
                "writer"
            )
        return StoreError(
            f"store {str(self.path)!r} is open for writing by another State ({who}){names}; "
            "one writer per file, whatever name or link it is opened by: close that one first, "
            "read this one with slateflow replay, or open a copy"
        )

    def check_in_place(self) -> None:
        """Raise ``StoreError`` if the path no longer names the locked file (deleted, moved or
        replaced while open): writes would go to a file nobody will open again."""
        if self._identity is None:
            return
        try:
            stat = os.stat(self._where)
        except FileNotFoundError:
            now = "no longer exists"
        except OSError as exc:
            now = f"cannot be checked ({exc})"
        else:
            if (stat.st_dev, stat.st_ino) == self._identity:
                return
            now = "is now another file"
        raise StoreError(
            f"store {str(self.path)!r} was deleted or moved while open (the path {now}); "
            "commits after that point were not persisted: put the file back (or stop whatever "
            "rotates or cleans it) and reopen it with State.open"
        )

    def release(self) -> None:
        """Drop the lock (idempotent)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def _holder(stat: os.stat_result) -> int | None:
    """The pid holding an flock on the file of ``stat``, where the OS says (Linux)."""
    wanted = f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}:{stat.st_ino}"
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as locks:
            for line in locks:
                fields = line.split()
                # "1: FLOCK  ADVISORY  WRITE 1234 fe:00:2146698 0 EOF"
                if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == wanted:
                    return int(fields[4])
    except (OSError, ValueError):
        pass
    return None
