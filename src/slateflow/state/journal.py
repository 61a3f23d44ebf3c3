"""A State's journal as one object: ``state.journal``.

The commits after a cursor (``since``), the sinks fed every committed batch, the State as it
was right after a commit (``at``, with a store that keeps history) and compaction of that
history. ``cursor`` is the seq of the last commit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ..errors import HistoryError
from ..stores.records import EntryRow, Loaded
from .records import Change
from .sinks import JournalSink

if TYPE_CHECKING:
    from .engine import Engine
    from .state import State

__all__ = ["Journal"]


class Journal:
    """The journal of one State (see the module docstring); ``state.journal`` is it."""

    __slots__ = ("_engine", "_past")

    def __init__(self, engine: Engine, past: Callable[[Loaded], State]) -> None:
        self._engine = engine
        self._past = past  # makes a detached State from a store's contents (``at``)

    @property
    def cursor(self) -> int:
        """The seq of the last committed batch (0 for a new state)."""
        return self._engine.seq

    def since(self, cursor: int) -> list[Change]:
        """Every change committed after ``cursor``, oldest first.

        Raises :class:`~slateflow.errors.CursorExpiredError` when the journal ring no longer
        holds all of them (raise ``journal_size`` or attach a sink).
        """
        engine = self._engine
        with engine.lock:
            return engine.ring.since(cursor, engine.seq)

    def add_sink(self, sink: JournalSink) -> None:
        """Feed every later committed batch to ``sink`` as well."""
        self._engine.add_sink(sink)

    def remove_sink(self, sink: JournalSink) -> None:
        """Stop feeding ``sink``."""
        self._engine.remove_sink(sink)

    def at(self, seq: int) -> State:
        """The state as it was right after commit ``seq``: a detached, in-memory copy.

        Needs a store with history (``MemoryStore`` or a durable one). Raises
        :class:`~slateflow.errors.HistoryError` for a seq after the newest commit, before the
        last compaction, or on a state without a store. ``at(cursor)`` equals now.
        """
        engine = self._engine
        store = engine.store
        if type(seq) is not int or seq < 0:
            raise HistoryError(f"at() needs a commit seq (an int >= 0), got {seq!r}")
        if store is None:
            raise HistoryError(
                f"cannot go back to seq {seq}: this state keeps no history; create it with "
                "State(store=MemoryStore()) or State.open(path)"
            )
        head = engine.seq
        if seq > head:
            raise HistoryError(f"seq {seq} is after the newest commit ({head})")
        store.sync(seq)
        loaded = store.read(upto=seq)
        if seq < loaded.base_seq:
            raise HistoryError(
                f"seq {seq} is before the last compaction (seq {loaded.base_seq}); history "
                "before it was dropped"
            )
        return self._past(loaded)

    def compact(self) -> int:
        """Replace the store's history by the current entries; returns the seq compacted to.

        Recovery then starts from this point (faster, smaller file), and ``at(seq)`` can no
        longer reach earlier commits. Without a store there is nothing to compact.
        """
        engine = self._engine
        store = engine.store
        with engine.lock:
            seq = engine.seq
            rows: list[EntryRow] = [
                (key, value, version, row_seq, at, st.source, st.writer, st.confidence, st.meta)
                for key, (value, version, row_seq, at, st) in engine.entries.items()
            ]
        if store is not None:
            store.compact(seq, rows)
        return seq
