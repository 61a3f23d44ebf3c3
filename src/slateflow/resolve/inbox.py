"""The inbox: background results waiting to be handed to the model.

Results enter it from any thread (a run ends, a held interrupt, a redelivery); a turn context
takes them when it is built and gives them back if it is dropped before the model got it, so a
result is handed over exactly once, or again only when the loop says it was not heard.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

from .background import BackgroundResult, Scheduling

__all__ = ["Inbox", "ToInbox"]


class Inbox:
    """Background results waiting for the model; thread-safe, each taken exactly once.

    Each entry remembers who queued it (``origin``), so a flow runner can take only its own.
    ``notify`` (if given) is called with each result put in, outside the lock, from the thread
    that put it.
    """

    def __init__(self, notify: Callable[[BackgroundResult], Any] | None = None) -> None:
        self._lock = threading.Lock()
        self._items: list[tuple[object, BackgroundResult]] = []
        self._notify = notify

    def put(self, result: BackgroundResult, origin: object = None) -> None:
        """Queue ``result`` (last)."""
        with self._lock:
            self._items.append((origin, result))
        if self._notify is not None:
            self._notify(result)

    def restore(self, results: Iterable[BackgroundResult], origin: object = None) -> None:
        """Put ``results`` back first, in their order: a context that took them was dropped,
        or the model never heard them."""
        restored = [(origin, r) for r in results]
        if not restored:
            return
        with self._lock:
            self._items[:0] = restored
        if self._notify is not None:
            for _, result in restored:
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
