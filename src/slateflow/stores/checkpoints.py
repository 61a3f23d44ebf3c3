"""Workflow checkpoints in a SQLite store: the orchestration layer's resumable runs.

A :class:`~slateflow.stores.SQLiteStore` keeps, beside its commits, one checkpoint (text) per
workflow id, written outside the commit log (``save_checkpoint`` replaces it, ``delete_checkpoint``
removes it). Part of the store; it holds no state of its own.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from ..errors import StoreClosedError, StoreCorruptError, StoreError

__all__ = ["Checkpoints"]


class Checkpoints:
    """The checkpoint table of a SQLite store (see the module docstring)."""

    # The store's, which this part works through.
    path: Path
    readonly: bool
    _lock: AbstractContextManager[Any]
    _closing: bool
    _owner: Any
    _readonly: Callable[[], StoreError]
    _reader: Callable[[], sqlite3.Connection]

    def _side_write(self, sql: str, args: tuple[Any, ...]) -> None:
        if self.readonly:
            raise self._readonly()
        with self._lock:
            if self._closing:
                raise StoreClosedError(f"store {str(self.path)!r} is closed")
            self._owner.check_in_place()
            conn = self._reader()
            try:
                conn.execute(sql, args)
            except sqlite3.Error as exc:
                raise StoreError(f"store {str(self.path)!r}: {exc}") from None

    def load_checkpoint(self, workflow_id: str) -> str | None:
        with self._lock:
            if self._closing:
                raise StoreClosedError(f"store {str(self.path)!r} is closed")
            try:
                row = (
                    self._reader()
                    .execute("SELECT data FROM checkpoints WHERE workflow_id = ?", (workflow_id,))
                    .fetchone()
                )
            except sqlite3.Error as exc:
                raise StoreCorruptError(f"store {str(self.path)!r} is damaged ({exc})") from None
        if row is None:
            return None
        data = row[0]
        if type(data) is not str:
            raise StoreCorruptError(
                f"store {str(self.path)!r}: the checkpoint of {workflow_id!r} is not text"
            )
        return data

    def save_checkpoint(self, workflow_id: str, data: str) -> None:
        self._side_write(
            "INSERT OR REPLACE INTO checkpoints (workflow_id, data, updated_ns) VALUES (?, ?, ?)",
            (workflow_id, data, time.time_ns()),
        )

    def delete_checkpoint(self, workflow_id: str) -> None:
        self._side_write("DELETE FROM checkpoints WHERE workflow_id = ?", (workflow_id,))
