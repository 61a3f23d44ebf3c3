"""Reacting to the State: subscriptions, watchers, waits and derived values.

The part of the :class:`~slateflow.state.State` façade through which code reacts to commits:
``subscribe`` (every receiver runs on ``state.changed``, in connection order), ``watch`` (a
predicate over ``(old, new)``), ``wait_for`` / ``wait_until`` (async, from any thread) and
``derive`` (a value recomputed from the keys it reads). It holds no state of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, cast

from . import waits
from .facade import Facade
from .keys import Key, key_name
from .keys import key_list as _key_list
from .records import Change
from .subscriptions import Callback, Subscription
from .when import Transition

if TYPE_CHECKING:
    from .store import State

__all__ = ["Reacting"]


class Reacting(Facade):
    """Subscriptions, watchers, waits and derived values (see the module docstring)."""

    def subscribe(
        self,
        callback: Callback,
        keys: str | Key[Any] | Iterable[str | Key[Any]] | None = None,
        pattern: str | Iterable[str] | None = None,
    ) -> Subscription:
        """Call ``callback(changes)`` once per committed batch touching the watched keys.

        ``keys`` (exact keys) and ``pattern`` (one or more ``*`` patterns) filter what is
        delivered; with neither, every change is. ``changes`` holds only the matching changes of
        the batch, in commit order. A callback that raises is logged and reported on
        ``receiver_failed``; the write and the other subscribers are unaffected.
        """
        names = None if keys is None else [key_name(k) for k in _key_list(keys)]
        return self._engine.delivery.subscribe(callback, names, pattern)

    def _unsubscribe(self, sub: Subscription) -> None:
        self._engine.delivery.unsubscribe(sub)

    def watch(
        self,
        key: str | Key[Any],
        when: Transition | Callable[[Any, Any], bool],
        action: Callable[[Change], Any],
    ) -> Subscription:
        """Call ``action(change)`` whenever a change to ``key`` satisfies ``when(old, new)``.

        Use the predicates in :mod:`slateflow.when` (``changed_to``, ``crossed_above``, ...).
        """
        name = key_name(key)
        if not callable(when) or not callable(action):
            raise TypeError(
                f"watch({name!r}, when, action) needs two callables: a predicate over "
                "(old, new) such as when.changed_to('done'), and an action taking the Change"
            )

        def on_change(changes: tuple[Change, ...]) -> None:
            for change in changes:
                if when(change.old, change.new):
                    action(change)

        action_name = getattr(action, "__qualname__", repr(action))
        on_change.__qualname__ = f"watch({name!r}, {when!r}, {action_name})"
        return self.subscribe(on_change, keys=[name])

    # -- async waits -------------------------------------------------------------------------

    async def wait_for(self, key: str | Key[Any], *, timeout: float | None = None) -> Any:
        """Wait until ``key`` is set and return its value (at once if it already is).

        Wakes on writes from any thread. Raises :class:`WaitTimeoutError` (a ``TimeoutError``)
        after ``timeout`` seconds; cancelling the waiting task leaves nothing behind.
        """
        return await waits.wait_for(cast("State", self), key, timeout)

    async def wait_until(
        self,
        predicate: Callable[[State], Any],
        *,
        keys: Iterable[str | Key[Any]] | None = None,
        pattern: str | Iterable[str] | None = None,
        timeout: float | None = None,
    ) -> Any:
        """Wait until ``predicate(state)`` is truthy and return what it returned.

        The predicate is checked now and after every committed batch touching ``keys`` /
        ``pattern`` (every batch if neither is given), at delivery time, so a condition that is
        true only briefly is still seen. An exception from the predicate is raised here
        unchanged. Raises :class:`WaitTimeoutError` after ``timeout`` seconds.
        """
        return await waits.wait_until(cast("State", self), predicate, keys, pattern, timeout)
