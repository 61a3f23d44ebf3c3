"""Delivery: committed batches reach their receivers through the State's blinker signal.

``state.changed`` is a blinker :class:`~blinker.Signal`, and everything that reacts to the
State is one of its receivers, routed by key:

* ``state.changed.connect(fn)`` receives every batch: ``fn(state, changes=batch)``;
* ``state.changed.connect(fn, sender="booking:slot")`` is *sender-keyed*: it receives the
  batches that change that key, with only the changes of the keys it is connected to;
* ``state.subscribe(callback, keys=..., pattern=...)`` (what flows, watchers, waits and derived
  values use) is a receiver connected for those keys or patterns: ``callback(changes)``.

Order: receivers run in the order they were connected, whichever way, once per batch each;
batches are delivered in commit order, breadth-first (a receiver's own write is delivered after
the batch that caused it). ``with state.changed.muted():`` mutes every receiver, flows
included: batches committed meanwhile are never delivered. A receiver that raises is logged and
reported on ``state.receiver_failed``; the write stands and the other receivers still run.
A write costs the same however many receivers watch *other* keys.
"""

from __future__ import annotations

import inspect
import logging
import threading
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

from blinker import ANY, Signal
from blinker._utilities import make_id

from ..errors import DeliveryChainError
from .chains import MAX_CHAIN, enter, leave
from .records import Change, RawChange
from .subscriptions import Subscription, SubscriptionIndex

__all__ = ["ChangedSignal", "Delivery"]

log = logging.getLogger("slateflow.state")
_F = TypeVar("_F", bound=Callable[..., Any])
_wrap = Change.wrap


MAX_HELD = 1000
"""At most this many batches held back by stopped delivery chains (the newest are kept)."""


class ChangedSignal(Signal):
    """``state.changed``: the blinker signal every reaction to the State receives from.

    Connect with ``sender=ANY`` (or the state) for every batch, or with a key as the sender for
    the batches that change it. ``muted()`` mutes flows and subscriptions too.
    """

    def __init__(self, delivery: Delivery) -> None:
        super().__init__("slateflow.state.changed")
        self._delivery = delivery
        # receiver id -> its route: one subscription per receiver, watching the keys it is
        # connected for (or everything), so it is called once per batch, in connection order.
        self._routes: dict[Any, Subscription] = {}
        self._graveyard: list[Any] = []  # ids of weakly connected receivers since collected

    def connect(self, receiver: _F, sender: Any = ANY, weak: bool = True) -> _F:
        connected = super().connect(receiver, sender, weak)
        delivery = self._delivery
        everything = sender is ANY or sender is delivery.owner
        if not everything and not isinstance(sender, str):
            return connected  # another sender: blinker's own business, never sent by the State
        rid = make_id(receiver)
        subs = delivery.subscriptions
        with delivery.lock:
            self._bury()
            route = self._routes.get(rid)
            if route is None or not route.active:
                keys = None if everything else [sender]
                relay = _relay(receiver, weak, delivery.owner, lambda _: self._dead(rid))
                self._routes[rid] = subs.make(delivery.unsubscribe, relay, keys, None)
            elif everything:
                subs.widen(route)
            else:
                subs.add_key(route, sender)
        delivery.refresh()
        return connected

    def resume(self) -> int:
        """Deliver the changes a stopped delivery chain held back (see
        :class:`~slateflow.errors.DeliveryChainError`): each starts a new chain, so a cascade
        deeper than the cap (derived values built on each other) catches up, a step of
        ``MAX_CHAIN`` at a time. Returns how many batches were delivered."""
        return self._delivery.resume()

    def disconnect(self, receiver: Callable[..., Any], sender: Any = ANY) -> None:
        super().disconnect(receiver, sender)
        delivery = self._delivery
        rid = make_id(receiver)
        with delivery.lock:
            self._bury()
            route = self._routes.get(rid)
            if route is None:
                return
            # The state as sender means every batch, as ANY does.
            if sender is ANY or sender is delivery.owner:
                gone = True
            elif isinstance(sender, str):
                gone = not delivery.subscriptions.remove_key(route, sender)
            else:
                gone = False
            if gone:
                del self._routes[rid]
        if gone:
            delivery.unsubscribe(route)

    def _dead(self, rid: Any) -> None:
        # Called by the garbage collector, maybe while this thread holds a lock: only note it
        # (list.append takes no lock); the next connect or disconnect removes the route.
        self._graveyard.append(rid)

    def _bury(self) -> None:
        """Remove the routes of collected receivers (before a new receiver reuses an id)."""
        while self._graveyard:
            rid = self._graveyard.pop()
            route = self._routes.pop(rid, None)
            if route is not None:
                self._delivery.unsubscribe(route)


def _relay(
    receiver: Callable[..., Any],
    weak: bool,
    owner: object,
    on_dead: Callable[[Any], None],
) -> Callable[..., None]:
    """A subscription callback calling a blinker receiver as ``receiver(state, changes=...)``
    (through a weak reference when it was connected weakly, as blinker does; ``on_dead`` runs
    when the receiver is collected)."""
    ref: Callable[[], Callable[..., Any] | None]
    if not weak:

        def relay(changes: tuple[Change, ...]) -> None:
            receiver(owner, changes=changes)

        def ref() -> Callable[..., Any] | None:
            return receiver

    else:
        ref = (
            weakref.WeakMethod(receiver, on_dead)
            if inspect.ismethod(receiver)
            else weakref.ref(receiver, on_dead)
        )

        def relay(changes: tuple[Change, ...]) -> None:
            live = ref()
            if live is not None:
                live(owner, changes=changes)

    relay.__qualname__ = getattr(receiver, "__qualname__", None) or repr(receiver)
    # Failure reports name the receiver itself, not this relay.
    relay.__slateflow_receiver__ = ref  # type: ignore[attr-defined]
    return relay


class Delivery:
    """Queues committed batches and sends them to ``state.changed``'s receivers, in order."""

    def __init__(self, owner: object, lock: threading.RLock) -> None:
        self.owner = owner
        self.lock = lock
        self.subscriptions = SubscriptionIndex()
        # Batches waiting for delivery, each with the chain depth of the code that wrote it.
        self.pending: deque[tuple[tuple[RawChange, ...], int]] = deque()
        self._delivering = False
        # Whether any receiver exists; it may stay True after a weak receiver is collected,
        # which only costs a delivery that finds nobody.
        self.listening = False
        # The first batch of the chain being delivered (approximate when threads interleave
        # chains), and the batches stopped chains held back, for resume().
        self._origin: tuple[RawChange, ...] = ()
        self.held: list[tuple[RawChange, ...]] = []
        self.changed = ChangedSignal(self)
        self.receiver_failed = Signal("slateflow.state.receiver_failed")
        self.wants = self.subscriptions.watched

    def refresh(self) -> None:
        """Recompute the listening flags (after a receiver comes or goes)."""
        # Under the lock, so the last refresh always reflects every finished (un)subscribe.
        with self.lock:
            self.listening = self.subscriptions.count > 0

    def subscribe(
        self, callback: Callable[[tuple[Change, ...]], Any], keys: list[str] | None, pattern: Any
    ) -> Subscription:
        """Connect ``callback`` for ``keys`` / ``pattern`` (neither: every change)."""
        sub = self.subscriptions.make(self.unsubscribe, callback, keys, pattern)
        self.refresh()
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        """Disconnect a subscription (idempotent)."""
        self.subscriptions.remove(sub)
        self.refresh()

    def claim(self) -> bool:
        """Under the lock: whether the caller may deliver its batch at once (nothing queued,
        nobody delivering); if so it must call :meth:`deliver_now` after releasing the lock."""
        if self._delivering or self.pending:
            return False
        self._delivering = True
        return True

    def deliver_now(self, batch: tuple[RawChange, ...], level: int) -> None:
        """Deliver a batch whose delivery was :meth:`claim`-ed, then whatever queued meanwhile."""
        try:
            if level >= MAX_CHAIN:
                self._chain_stopped(batch, level)
            elif not self.changed.is_muted:
                if not level:
                    self._origin = batch
                # What receivers write now is one level deeper in this chain.
                token = enter(level + 1)
                try:
                    self._dispatch(batch)
                finally:
                    leave(token)
        except BaseException:
            with self.lock:
                self._delivering = False
            raise
        lock = self.lock
        lock.acquire()
        if not self.pending:  # the common case: nothing was written meanwhile
            self._delivering = False
            lock.release()
            return
        lock.release()
        self._drain()

    def deliver(self) -> None:
        """Deliver pending batches in commit order, breadth-first, from one thread at a time.

        A receiver's own write is committed at once but queued here, so chains of writes never
        recurse; another thread's write that arrives during delivery is delivered by this loop.
        """
        with self.lock:
            if self._delivering or not self.pending:
                return
            self._delivering = True
        self._drain()

    def _drain(self) -> None:
        lock = self.lock
        pending = self.pending
        try:
            while True:
                with lock:
                    if not pending:
                        self._delivering = False
                        return
                    batch, level = pending.popleft()
                self._send(batch, level)
        except BaseException:
            with lock:
                self._delivering = False
            raise

    def _send(self, batch: tuple[RawChange, ...], level: int) -> None:
        if level >= MAX_CHAIN:
            self._chain_stopped(batch, level)
            return
        if not level:
            self._origin = batch
        # What receivers write now is one level deeper in this chain.
        token = enter(level + 1)
        try:
            self._dispatch(batch)
        finally:
            leave(token)

    def _dispatch(self, raw: tuple[RawChange, ...]) -> None:
        if self.changed.is_muted:
            return
        subs = self.subscriptions
        batch: tuple[Change, ...]
        if len(raw) == 1:
            key = raw[0][0]
            found = (
                subs.for_key(key)
                if subs.by_pattern or subs.everything
                else subs.by_key.get(key, ())
            )
            if not found:
                return
            batch = (_wrap(raw[0]),)
            for sub in found:
                if sub.active:
                    try:
                        sub.callback(batch)
                    except Exception as exc:
                        self.report_failure(sub.callback, exc, batch)
            return
        batch = tuple(map(_wrap, raw))
        grouped: dict[Subscription, list[Change]] = {}
        for change, (key, *_) in zip(batch, raw, strict=True):
            for sub in subs.for_key(key):
                grouped.setdefault(sub, []).append(change)
        for sub in sorted(grouped, key=lambda s: s.id):
            if sub.active:
                try:
                    sub.callback(tuple(grouped[sub]))
                except Exception as exc:
                    self.report_failure(sub.callback, exc, batch)

    def _chain_stopped(self, raw: tuple[RawChange, ...], level: int) -> None:
        """A chain of reactions went past MAX_CHAIN: this batch stays committed, held back
        until :meth:`resume`."""
        batch = tuple(map(_wrap, raw))
        keys = ", ".join(sorted({c.key for c in batch}))
        first = ", ".join(sorted({c[0] for c in self._origin})) or keys
        with self.lock:
            self.held.append(raw)
            if len(self.held) > MAX_HELD:
                del self.held[0]  # a runaway loop stopped again and again: keep the newest
        error = DeliveryChainError(
            f"a chain of {level} deliveries, each a reaction to the last, began with a write "
            f"to {first} and was stopped at {keys}: the writes stand; the change to {keys} "
            "was held back, so what reacts to it has not seen it. If the chain is meant "
            "(derived values built on each other), call state.changed.resume() to deliver "
            "what was held back, each as a new chain; if a receiver or watcher writes a key "
            "it reacts to, make it write only when the value differs, or react to another key"
        )
        log.error("state delivery (seq %d): %s", batch[0].seq, error)
        self._send_failure("delivery chain", error, batch)

    def resume(self) -> int:
        """Deliver the batches stopped chains held back, oldest first, each starting a new
        chain; returns how many."""
        with self.lock:
            held, self.held = self.held, []
            self.pending.extend((batch, 0) for batch in held)
        self.deliver()
        return len(held)

    def report_failure(self, receiver: object, exc: Exception, batch: tuple[Change, ...]) -> None:
        """Log a receiver's (or sink's) exception and send it on ``receiver_failed``."""
        target = getattr(receiver, "__slateflow_receiver__", None)
        if target is not None:
            receiver = target() or receiver
        keys = ", ".join(sorted({c.key for c in batch}))
        name = getattr(receiver, "__qualname__", None) or repr(receiver)
        log.error(
            "state receiver %s failed on a change to %s (seq %d); the write stands and other "
            "receivers still ran",
            name,
            keys,
            batch[0].seq,
            exc_info=exc,
        )
        self._send_failure(receiver, exc, batch)

    def _send_failure(self, receiver: object, exc: Exception, batch: tuple[Change, ...]) -> None:
        if self.receiver_failed.receivers:
            try:
                self.receiver_failed.send(self.owner, receiver=receiver, error=exc, changes=batch)
            except Exception:
                log.exception("a receiver_failed handler failed too")
