"""A State's journal as one object: ``state.journal``.

The commits after a cursor (``since``), the sinks fed every committed batch, the State as it
was right after a commit (``at``, with a store that keeps history) and compaction of that
history. ``state.cursor`` is the seq of the last commit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import HistoryError
from ..stores.records import EntryRow
from .journal import JournalSink
from .records import Change

if TYPE_CHECKING:
    from .store import State

__all__ = ["Journal"]


class Journal:
    """The journal of one State (see the module docstring); ``state.journal`` is it."""

    __slots__ = ("_state",)

    def __init__(self, state: State) -> None:
        self._state = state

    @property
    def cursor(self) -> int:
        """The seq of the last committed batch (0 for a new state)."""
        return self._state._engine.seq

    def since(self, cursor: int) -> list[Change]:
        """Every change committed after ``cursor``, oldest first.

        Raises :class:`~slateflow.errors.CursorExpiredError` when the journal ring no longer
        holds all of them (raise ``journal_size`` or attach a sink).
        """
        engine = self._state._engine
        with self._state._lock:
            return engine.ring.since(cursor, engine.seq)

    def add_sink(self, sink: JournalSink) -> None:
        """Feed every later committed batch to ``sink`` as well."""
        self._state._engine.add_sink(sink)

    def remove_sink(self, sink: JournalSink) -> None:
        """Stop feeding ``sink``."""
        self._state._engine.remove_sink(sink)

    def at(self, seq: int) -> State:
        """The state as it was right after commit ``seq``: a detached, in-memory copy.

        Needs a store with history (``MemoryStore`` or a durable one). Raises
        :class:`~slateflow.errors.HistoryError` for a seq after the newest commit, before the
        last compaction, or on a state without a store. ``at(state.cursor)`` equals now.
        """
        state = self._state
        engine = state._engine
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
        past = type(state)(policy=state._policy, journal_size=engine.ring.size)
        past._engine.recover(loaded)
        return past

    def compact(self) -> int:
        """Replace the store's history by the current entries; returns the seq compacted to.

        Recovery then starts from this point (faster, smaller file), and ``at(seq)`` can no
        longer reach earlier commits. Without a store there is nothing to compact.
        """
        state = self._state
        store = state._engine.store
        with state._lock:
            seq = state._engine.seq
            rows: list[EntryRow] = [
                (key, value, version, row_seq, at, st.source, st.writer, st.confidence, st.meta)
                for key, (value, version, row_seq, at, st) in state._entries.items()
            ]
        if store is not None:
            store.compact(seq, rows)
        return seq
