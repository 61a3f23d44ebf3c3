"""The inbox: background results waiting to be handed to the model.

Results enter it from any thread (a run ends, a held interrupt, a redelivery); a turn context
takes them when it is built and gives them back if it is dropped before the model got it, so a
result is handed over exactly once, or again only when the loop says it was not heard.

It stays small however long the call: a newer result of a resolver replaces its older one still
waiting (the State holds only the newest ``<name>:result`` too), and past ``limit`` waiting
results the oldest is dropped with a warning.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

from .background import BackgroundResult, Scheduling

__all__ = ["DEFAULT_INBOX_LIMIT", "Inbox", "ToInbox"]

log = logging.getLogger("slateflow.session")

DEFAULT_INBOX_LIMIT = 256
"""Background results that may wait for the model at once (after coalescing)."""


class Inbox:
    """Background results waiting for the model; thread-safe, each taken exactly once.

    Each entry remembers who queued it (``origin``), so a flow runner can take only its own.
    ``notify`` (if given) is called with each result put in, outside the lock, from the thread
    that put it. ``coalesced`` and ``dropped`` count the results replaced by a newer one of the
    same resolver and those dropped over ``limit``.
    """

    def __init__(
        self,
        notify: Callable[[BackgroundResult], Any] | None = None,
        *,
        limit: int = DEFAULT_INBOX_LIMIT,
    ) -> None:
        if type(limit) is not int or limit < 1:
            raise ValueError(f"the inbox limit must be a positive int, got {limit!r}")
        self._lock = threading.Lock()
        self._items: list[tuple[object, BackgroundResult]] = []
        self._notify = notify
        self.limit = limit
        self.coalesced = 0
        self.dropped = 0

    def put(self, result: BackgroundResult, origin: object = None) -> None:
        """Queue ``result`` (last), replacing an older result of the same resolver and origin."""
        with self._lock:
            items = self._items
            for i, (o, waiting) in enumerate(items):
                if o is origin and waiting.name == result.name:
                    del items[i]  # at most one per name waits: this keeps it so
                    self.coalesced += 1
                    break
            items.append((origin, result))
            dropped = self._trim()
        for old in dropped:
            log.warning(
                "slateflow session: %d background results wait for the model; the oldest, from "
                "%r, is dropped (raise the session's max_waiting, or let turns take them)",
                self.limit,
                old.name,
            )
        if self._notify is not None:
            self._notify(result)

    def _trim(self) -> list[BackgroundResult]:
        """Drop the oldest results over the limit (called under the lock)."""
        over = len(self._items) - self.limit
        if over <= 0:
            return []
        dropped = [r for _, r in self._items[:over]]
        del self._items[:over]
        self.dropped += over
        return dropped

    def restore(self, results: Iterable[BackgroundResult], origin: object = None) -> None:
        """Put ``results`` back first, in their order: a context that took them was dropped,
        or the model never heard them. One that a newer result of its resolver has replaced
        meanwhile stays out."""
        given = list(results)
        if not given:
            return
        with self._lock:
            waiting = {r.name for o, r in self._items if o is origin}
            kept: list[tuple[object, BackgroundResult]] = []
            for result in reversed(given):  # the newest of each resolver wins
                if result.name not in waiting:
                    waiting.add(result.name)
                    kept.append((origin, result))
            kept.reverse()
            self.coalesced += len(given) - len(kept)
            self._items[:0] = kept
            self._trim()
        if self._notify is not None:
            for _, result in kept:
                self._notify(result)

    def take(
        self, origin: object = None, *, scheduling: Scheduling | None = None
    ) -> list[BackgroundResult]:
        """Remove and return the waiting results (of ``origin`` and ``scheduling`` if given),
        oldest first."""
        with self._lock:
            taken: list[BackgroundResult] = []
            kept: list[tuple[object, BackgroundResult]] = []
            for item in self._items:
                o, r = item
                if (origin is None or o is origin) and (
                    scheduling is None or r.scheduling is scheduling
                ):
                    taken.append(r)
                else:
                    kept.append(item)
            self._items = kept
        return taken

    def peek(self) -> list[BackgroundResult]:
        """The waiting results, oldest first, left in place."""
        with self._lock:
            return [r for _, r in self._items]

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)


class ToInbox:
    """A ``deliver`` callback that sends a background result to its session's inbox (and, for
    ``interrupt`` scheduling, on to ``on_delivery``). ``origin`` marks whose result it is (a
    flow runner takes its own with ``take_deliveries``)."""

    __slots__ = ("origin", "sink")

    def __init__(self, sink: Callable[[BackgroundResult, object], Any], origin: object) -> None:
        self.sink = sink
        self.origin = origin

    def __call__(self, result: BackgroundResult) -> Any:
        return self.sink(result, self.origin)
