"""Reactive resolvers: re-run when a key they read changes, after a quiet period (debounce)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio

from ..state import Change
from ..state.values import same
from .background import Deliver, Scheduling
from .resolver import Resolver
from .run import Mode, Run

if TYPE_CHECKING:
    from .scheduler import Scheduler

__all__ = ["Reaction"]


class Reaction:
    """Keeps one reactive resolver fresh inside a session's scheduler.

    A change to any of its ``reads`` keys (from any thread) pushes a deadline ``debounce``
    seconds away on the session's clock; when the deadline passes with no further change, the
    resolver is dispatched again with ``on_conflict="latest"``, which cancels a run still working
    on stale inputs. If the latest run already read the current versions, nothing runs.
    """

    __slots__ = (
        "_due",
        "_scope",
        "deliver",
        "last",
        "mode",
        "resolver",
        "scheduler",
        "scheduling",
        "sub",
    )

    def __init__(
        self,
        scheduler: Scheduler,
        resolver: Resolver,
        mode: Mode,
        deliver: Deliver | None,
        scheduling: Scheduling | None,
    ) -> None:
        self.scheduler = scheduler
        self.resolver = resolver
        self.mode: Mode = mode
        self.deliver = deliver
        self.scheduling = scheduling
        self.last: Run | None = None
        self._due = 0.0
        self._scope: anyio.CancelScope | None = None
        self.sub = scheduler.state.subscribe(self._changed, keys=list(resolver.reads))

    def retarget(
        self,
        resolver: Resolver,
        mode: Mode,
        deliver: Deliver | None,
        scheduling: Scheduling | None,
    ) -> None:
        """Re-runs use this resolver, mode and delivery from now on (the latest dispatch wins)."""
        if resolver.reads != self.resolver.reads:
            self.sub.close()
            self.sub = self.scheduler.state.subscribe(self._changed, keys=list(resolver.reads))
        self.resolver = resolver
        self.mode = mode
        self.deliver = deliver
        self.scheduling = scheduling

    def _changed(self, changes: tuple[Change, ...]) -> None:
        # Called in the writer's thread; the timer lives on the session's loop. A refreshed
        # result (a re-run producing the same value) changes no input: reacting to it would let
        # two reactive resolvers reading each other's results ping-pong forever.
        if all(not c.removed and same(c.old, c.new) for c in changes):
            return
        self.scheduler.runtime.soon(self._poke)

    def _poke(self) -> None:
        if not self.sub.active:
            return
        self._due = self.scheduler.clock.monotonic() + self.resolver.debounce
        if self._scope is None:
            self._scope = anyio.CancelScope()
            self.scheduler.runtime.spawn(self._timer, self._scope)

    async def _timer(self, scope: anyio.CancelScope) -> None:
        clock = self.scheduler.clock
        with scope:
            # (Waits under a nanosecond count as elapsed: float rounding could spin forever.)
            while (wait := self._due - clock.monotonic()) > 1e-9:
                await clock.sleep(wait)
        if self._scope is scope:
            self._scope = None
        if not scope.cancel_called:
            self.scheduler.rerun(self)

    def stop(self) -> None:
        """Stop reacting (runs in flight are left alone)."""
        self.sub.close()
        if self._scope is not None:
            self._scope.cancel()
            self._scope = None
