"""Journal sinks: receivers of every committed batch, in commit order (in memory, JSON lines)."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Protocol, runtime_checkable

from .records import Change

__all__ = ["JournalSink", "JsonlSink", "MemorySink"]


@runtime_checkable
class JournalSink(Protocol):
    """Receives every committed batch of changes, in commit order.

    ``record`` is called synchronously inside the commit, so keep it quick. An exception is logged
    and reported on ``state.receiver_failed``; it never fails the write.
    """

    def record(self, changes: Sequence[Change]) -> None:
        """Receive one committed batch (called under the State's lock: be quick, do not write)."""


class MemorySink:
    """A sink keeping every change in a list (``.changes``); handy in tests and audits."""

    def __init__(self) -> None:
        self.changes: list[Change] = []

    def record(self, changes: Sequence[Change]) -> None:
        """Keep the batch's changes (in :attr:`changes`)."""
        self.changes.extend(changes)


class JsonlSink:
    """A sink appending one JSON object per change to a file (JSON lines).

    Secret values are masked unless ``redact=False``. ``fsync=True`` makes each batch durable
    before the write returns (slow; the SQLite store is the durable path). Close it when done,
    or use it as a context manager.
    """

    def __init__(self, path: str | os.PathLike[str], *, redact: bool = True, fsync: bool = False):
        self.path = Path(path)
        self.redact = redact
        self.fsync = fsync
        self._file: IO[str] | None = self.path.open("a", encoding="utf-8")
        self._lock = threading.Lock()

    def record(self, changes: Sequence[Change]) -> None:
        """Append the batch's changes to the file, one JSON object per line."""
        lines = "".join(
            json.dumps(m.to_dict(redact=self.redact), ensure_ascii=False) + "\n" for m in changes
        )
        with self._lock:
            if self._file is None:
                raise ValueError(f"journal file {self.path} is closed")
            self._file.write(lines)
            self._file.flush()
            if self.fsync:
                os.fsync(self._file.fileno())

    def close(self) -> None:
        """Flush and close the file; later batches raise (and are reported, not fatal)."""
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def __enter__(self) -> JsonlSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
