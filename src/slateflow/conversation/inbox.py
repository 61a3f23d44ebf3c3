"""The inbox: background results waiting to be handed to the model.

Results enter it from any thread (a run ends, a held interrupt, a redelivery); a turn context
takes them when it is built and gives them back if it is dropped before the model got it, so a
result is handed over exactly once, or again only when the loop says it was not heard.

It stays small however long the call: a newer result of a resolver replaces its older one still
waiting (the State holds only the newest ``<name>:result`` too), and past ``limit`` waiting
results the oldest is dropped with a warning.

On a durable State the conversation records, per resolver, the last result handed to the model
(:data:`DELIVERED_KEY`); a result committed after it is handed over again when a conversation
over a restarted process is made (:func:`undelivered`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

from ..resolve.background import BackgroundResult, ResultFormatter, Scheduling, ToModel, dress
from ..state import State

__all__ = [
    "DEFAULT_INBOX_LIMIT",
    "DELIVERED_KEY",
    "Inbox",
    "ToConversation",
    "forget_delivered",
    "record_delivered",
    "redeliver",
    "undelivered",
]

log = logging.getLogger("slateflow.conversation")

DEFAULT_INBOX_LIMIT = 256
"""Background results that may wait for the model at once (after coalescing)."""

DELIVERED_KEY = "session:delivered"
"""On a durable State: per resolver, the seq of the last background result handed to the model
(a result committed after it is handed over again when a conversation is made after a
restart)."""


class Inbox:
    """Background results waiting for the model; thread-safe, each taken exactly once.

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
        self._items: list[BackgroundResult] = []
        self._notify = notify
        self.limit = limit
        self.coalesced = 0
        self.dropped = 0

    def put(self, result: BackgroundResult) -> None:
        """Queue ``result`` (last), replacing an older result of the same resolver."""
        with self._lock:
            items = self._items
            for i, waiting in enumerate(items):
                if waiting.name == result.name:
                    del items[i]  # at most one per name waits: this keeps it so
                    self.coalesced += 1
                    break
            items.append(result)
            dropped = self._trim()
        self._warn(dropped)
        if self._notify is not None:
            self._notify(result)

    def _trim(self) -> list[BackgroundResult]:
        """Drop the oldest results over the limit (called under the lock)."""
        over = len(self._items) - self.limit
        if over <= 0:
            return []
        dropped = self._items[:over]
        del self._items[:over]
        self.dropped += over
        return dropped

    def _warn(self, dropped: list[BackgroundResult]) -> None:
        for old in dropped:
            log.warning(
                "slateflow conversation: %d background results wait for the model; the oldest, "
                "from %r, is dropped (raise the conversation's max_waiting, or let turns take "
                "them)",
                self.limit,
                old.name,
            )

    def restore(self, results: Iterable[BackgroundResult]) -> None:
        """Put ``results`` back first, in their order: a context that took them was dropped,
        or the model never heard them. One that a newer result of its resolver has replaced
        meanwhile stays out."""
        given = list(results)
        if not given:
            return
        with self._lock:
            waiting = {r.name for r in self._items}
            kept: list[BackgroundResult] = []
            for result in reversed(given):  # the newest of each resolver wins
                if result.name not in waiting:
                    waiting.add(result.name)
                    kept.append(result)
            kept.reverse()
            self.coalesced += len(given) - len(kept)
            self._items[:0] = kept
            dropped = self._trim()
        self._warn(dropped)
        if self._notify is not None:
            for result in kept:
                self._notify(result)

    def take(self, *, scheduling: Scheduling | None = None) -> list[BackgroundResult]:
        """Remove and return the waiting results (of ``scheduling`` if given), oldest first."""
        with self._lock:
            if scheduling is None:
                taken, self._items = self._items, []
                return taken
            taken = [r for r in self._items if r.scheduling is scheduling]
            self._items = [r for r in self._items if r.scheduling is not scheduling]
        return taken

    def peek(self) -> list[BackgroundResult]:
        """The waiting results, oldest first, left in place."""
        with self._lock:
            return list(self._items)

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)


class ToConversation(ToModel):
    """A conversation's ``deliver``: a background result's way into it. An ``interrupt`` one
    is offered to ``urgent`` first (which returns what hands it over now, or None when it must
    wait); the rest wait in ``inbox`` for the next context."""

    __slots__ = ("_inbox", "_urgent")

    def __init__(self, inbox: Inbox, urgent: Callable[[BackgroundResult], Any]) -> None:
        self._inbox = inbox
        self._urgent = urgent

    def __call__(self, result: BackgroundResult) -> Any:
        if result.scheduling is Scheduling.INTERRUPT:
            now = self._urgent(result)
            if now is not None:
                return now
        self._inbox.put(result)
        return None

    def __repr__(self) -> str:
        return "<deliver to the conversation>"


# -- durable deliveries --------------------------------------------------------------------------


def record_delivered(state: State, results: Iterable[BackgroundResult]) -> None:
    """On a durable State, remember that ``results`` reached the model."""
    if state.store is None:
        return
    done = {r.name: r.seq for r in results if r.seq}
    if not done:
        return

    def merged(seen: Any) -> dict[str, int]:
        out = dict(seen) if isinstance(seen, dict) else {}
        for name, seq in done.items():
            out[name] = max(int(out.get(name, 0)), seq)
        return out

    try:
        state.modify(DELIVERED_KEY, {}, merged, source="session", writer="delivery")
    except Exception as exc:
        log.error("slateflow conversation: could not record deliveries: %s", exc)


def forget_delivered(state: State, results: list[BackgroundResult]) -> None:
    """On a durable State, forget that ``results`` reached the model (they are handed over
    again)."""
    if state.store is None or not any(r.seq for r in results):
        return

    def back(seen: Any) -> dict[str, int]:
        out = dict(seen) if isinstance(seen, dict) else {}
        for r in results:
            if r.seq and int(out.get(r.name, 0)) >= r.seq:
                out[r.name] = r.seq - 1
        return out

    state.modify(DELIVERED_KEY, {}, back, source="session", writer="delivery")


def redeliver(state: State, inbox: Inbox, results: Iterable[BackgroundResult]) -> None:
    """Put ``results`` back in ``inbox`` and forget they were delivered (the model never heard
    them: the bot was cut off)."""
    results = list(results)
    for result in results:
        if not isinstance(result, BackgroundResult):
            raise TypeError(
                f"redeliver takes the BackgroundResults the model did not hear, got {result!r}"
            )
    forget_delivered(state, results)
    inbox.restore(results)


def _count(value: object) -> int:
    return value if type(value) is int and value > 0 else 1


def undelivered(state: State, formatter: ResultFormatter) -> list[BackgroundResult]:
    """On a durable State: the background results a previous process committed for the model
    but never handed over, oldest first, dressed for the model by ``formatter``."""
    if state.store is None:
        return []
    seen = state.get(DELIVERED_KEY, {})
    delivered = seen if isinstance(seen, dict) else {}
    found: list[BackgroundResult] = []
    for key in state.keys(prefix=""):
        if not key.endswith(":status"):
            continue
        entry = state.entry(key)
        if entry is None or entry.value not in ("done", "error"):
            continue
        meta = entry.provenance.meta or {}
        name = key[: -len(":status")]
        if not meta.get("inbox") or int(delivered.get(name, 0)) >= entry.seq:
            continue
        done = entry.value == "done"
        try:
            scheduling = Scheduling(str(meta.get("scheduling", "when_idle")))
        except ValueError:
            scheduling = Scheduling.WHEN_IDLE
        result = BackgroundResult(
            name=name,
            status="completed" if done else "error",
            value=state.get(f"{name}:result") if done else None,
            error=None if done else state.get(f"{name}:error"),
            scheduling=scheduling,
            attempts=_count(meta.get("attempt", meta.get("attempts"))),
            seq=entry.seq,
        )
        found.append(dress(result, formatter, state, to_model=True))
    return sorted(found, key=lambda r: r.seq)
