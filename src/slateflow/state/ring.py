"""The journal's ring: the last ``size`` changes in memory, with a cursor over commits."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from ..errors import CursorExpiredError
from .records import Change, RawChange

__all__ = ["Ring"]


class Ring:
    """The in-memory journal: the last ``size`` changes, with a cursor over commits.

    Appends are amortised: the deque may hold up to ``size + 64`` records between trims
    (``append`` trims past ``limit``; the state's single-write path trims every 64th commit)
    and is trimmed back to ``size`` in one go, and before every read, so readers see exactly
    ``size``. With ``size == 0`` nothing is ever kept.
    """

    __slots__ = ("dropped_seq", "limit", "records", "size")

    def __init__(self, size: int) -> None:
        if type(size) is not int or size < 0:
            raise ValueError(f"journal_size must be a non-negative int, got {size!r}")
        self.size = size
        self.limit = size + min(max(size // 8, 16), 64) if size else 0
        self.records: deque[RawChange] = deque()
        self.dropped_seq = 0

    def append(self, batch: Sequence[RawChange]) -> None:
        if not self.size:
            return
        self.records.extend(batch)
        if len(self.records) > self.limit:
            self.trim()

    def trim(self) -> None:
        """Drop all but the newest ``size`` records, remembering the newest seq dropped."""
        records = self.records
        excess = len(records) - self.size
        if excess <= 0:
            return
        for _ in range(excess - 1):
            records.popleft()
        self.dropped_seq = records.popleft()[4]

    def since(self, cursor: int, head: int) -> list[Change]:
        """Every record after ``cursor``; ``head`` is the state's newest seq."""
        self.trim()
        if not self.size and cursor < head:
            self.dropped_seq = head
        if cursor < self.dropped_seq:
            raise CursorExpiredError(
                f"journal cursor {cursor} has expired: changes up to seq {self.dropped_seq} "
                f"left the {self.size}-record ring; read more often, raise journal_size, or "
                "attach a journal sink"
            )
        records = self.records
        # Walk back from the newest record: readers usually ask for the last few commits.
        i = len(records)
        while i and records[i - 1][4] > cursor:
            i -= 1
        wrap = Change.wrap
        return [wrap(records[j]) for j in range(i, len(records))]

    def clear(self, seq: int) -> None:
        self.records.clear()
        self.dropped_seq = seq
