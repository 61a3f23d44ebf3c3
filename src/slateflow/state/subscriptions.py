"""Subscriptions and the index that routes each change only to the subscriptions that watch it."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from .keys import Pattern, check_key, compile_pattern
from .records import Change

__all__ = ["Callback", "Subscription", "SubscriptionIndex", "on_transition"]

Callback = Callable[[tuple[Change, ...]], Any]
"""A subscriber: called once per committed batch with the changes it watches, in commit order."""

_ids = itertools.count(1)


class Subscription:
    """A live subscription to a state's changes; ``close()`` (or leave its ``with`` block) to stop.

    ``keys`` and ``patterns`` say what it watches (made with neither: everything; an empty list
    watches nothing). Closing is idempotent and takes effect for batches delivered after it
    returns.
    """

    __slots__ = ("__weakref__", "_closer", "active", "callback", "id", "keys", "patterns")

    def __init__(
        self,
        closer: Callable[[Subscription], None],
        callback: Callback,
        keys: frozenset[str],
        patterns: tuple[Pattern, ...],
    ) -> None:
        self._closer = closer
        self.callback = callback
        self.keys = keys
        self.patterns = patterns
        self.id = next(_ids)
        self.active = True

    def close(self) -> None:
        """Stop receiving changes."""
        if self.active:
            self._closer(self)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        what = sorted(self.keys) + [p.text for p in self.patterns] or ["*"]
        name = getattr(self.callback, "__qualname__", repr(self.callback))
        return f"<Subscription #{self.id} {name} on {', '.join(what)}>"


def on_transition(
    key: str, when: Callable[[Any, Any], bool], action: Callable[[Change], Any]
) -> Callback:
    """A subscription callback running ``action(change)`` for each change of ``key`` that
    satisfies ``when(old, new)`` (``state.watch``); named after them in failure reports."""
    if not callable(when) or not callable(action):
        raise TypeError(
            f"watch({key!r}, when, action) needs two callables: a predicate over "
            "(old, new) such as when.changed_to('done'), and an action taking the Change"
        )

    def on_change(changes: tuple[Change, ...]) -> None:
        for change in changes:
            if when(change.old, change.new):
                action(change)

    action_name = getattr(action, "__qualname__", repr(action))
    on_change.__qualname__ = f"watch({key!r}, {when!r}, {action_name})"
    return on_change


def _id(sub: Subscription) -> int:
    return sub.id


def _merge(*groups: Sequence[Subscription]) -> tuple[Subscription, ...]:
    # Subscriptions are called in the order they were made, whichever index found them.
    return tuple(sorted({s.id: s for g in groups for s in g}.values(), key=lambda s: s.id))


class SubscriptionIndex:
    """Routes a key to the subscriptions watching it.

    Exact keys are a dict lookup, so a write costs the same whatever the number of subscriptions
    on *other* keys. Pattern subscriptions are matched once per key and cached. All tuples are
    replaced, never mutated, so delivery can iterate them without a lock.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.by_key: dict[str, tuple[Subscription, ...]] = {}
        self.by_pattern: tuple[Subscription, ...] = ()
        self.everything: tuple[Subscription, ...] = ()
        self._pattern_cache: dict[str, tuple[Subscription, ...]] = {}
        self.count = 0

    def make(
        self,
        closer: Callable[[Subscription], None],
        callback: Callback,
        keys: Iterable[str] | None,
        pattern: str | Iterable[str] | None,
    ) -> Subscription:
        if not callable(callback):
            raise TypeError(f"subscribe() needs a callable, got {callback!r}")
        key_set = frozenset(map(check_key, keys or ()))
        texts = [pattern] if isinstance(pattern, str) else list(pattern or ())
        sub = Subscription(closer, callback, key_set, tuple(compile_pattern(p) for p in texts))
        with self._lock:
            for k in key_set:
                self.by_key[k] = (*self.by_key.get(k, ()), sub)
            if sub.patterns:
                self.by_pattern = (*self.by_pattern, sub)
                self._pattern_cache = {}
            if keys is None and pattern is None:
                self.everything = (*self.everything, sub)
            self.count += 1
        return sub

    def remove(self, sub: Subscription) -> None:
        with self._lock:
            if not sub.active:
                return  # closed already, maybe by another thread at the same moment
            sub.active = False
            self._unindex(sub, sub.keys)
            if sub.patterns:
                self.by_pattern = tuple(s for s in self.by_pattern if s is not sub)
                self._pattern_cache = {}
            if sub in self.everything:
                self.everything = tuple(s for s in self.everything if s is not sub)
            self.count -= 1

    def add_key(self, sub: Subscription, key: str) -> None:
        """Make ``sub`` watch ``key`` too (it keeps its place in the order)."""
        with self._lock:
            if not sub.active or key in sub.keys or sub in self.everything:
                return
            sub.keys = sub.keys | {key}
            self.by_key[key] = tuple(sorted((*self.by_key.get(key, ()), sub), key=_id))

    def remove_key(self, sub: Subscription, key: str) -> bool:
        """Stop ``sub`` watching ``key``; returns whether it still watches anything."""
        with self._lock:
            if key in sub.keys:
                sub.keys = sub.keys - {key}
                self._unindex(sub, (key,))
            return bool(sub.keys or sub.patterns or sub in self.everything)

    def widen(self, sub: Subscription) -> None:
        """Make ``sub`` watch every key (it keeps its place in the order)."""
        with self._lock:
            if not sub.active or sub in self.everything:
                return
            self._unindex(sub, sub.keys)
            sub.keys = frozenset()
            self.everything = tuple(sorted((*self.everything, sub), key=_id))

    def _unindex(self, sub: Subscription, keys: Iterable[str]) -> None:
        """Drop ``sub`` from the exact-key index of ``keys`` (call under the lock)."""
        by_key = self.by_key
        for k in keys:
            subs = by_key.get(k, ())
            if len(subs) == 1 and subs[0] is sub:  # most keys have one subscriber (a runner)
                del by_key[k]
                continue
            rest = tuple(s for s in subs if s is not sub)
            if rest:
                by_key[k] = rest
            else:
                by_key.pop(k, None)

    def _pattern_subs(self, key: str) -> tuple[Subscription, ...]:
        cache = self._pattern_cache
        found = cache.get(key)
        if found is None:
            found = tuple(s for s in self.by_pattern if any(p.matches(key) for p in s.patterns))
            if len(cache) > 100_000:
                cache.clear()
            cache[key] = found
        return found

    def watched(self, key: str) -> bool:
        """Whether any subscription watches ``key``."""
        return bool(
            key in self.by_key or self.everything or (self.by_pattern and self._pattern_subs(key))
        )

    def for_key(self, key: str) -> tuple[Subscription, ...]:
        """Subscriptions watching ``key``, in the order they were made."""
        exact = self.by_key.get(key, ())
        patterned = self._pattern_subs(key) if self.by_pattern else ()
        every = self.everything
        if not patterned and not every:
            return exact
        if not exact and not patterned:
            return every
        return _merge(exact, patterned, every)
