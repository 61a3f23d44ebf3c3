"""Derived values: a key under ``derived:`` computed from other keys, recomputed when they
change, with provenance naming the inputs it was computed from."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from ..errors import UsageError
from .keys import Key, check_key
from .keys import key_list as _key_list
from .records import Change

if TYPE_CHECKING:
    from .state import State
    from .subscriptions import Subscription

__all__ = ["Derived"]

log = logging.getLogger("slateflow.state")


class Derived:
    """A live ``Derived(state, name, fn, reads=[...])``: ``derived:<name>`` is ``fn(state)``,
    recomputed on every change to a key in ``reads`` (and at once). ``close()`` stops it; the
    last value stays. A computation that raises is reported on ``state.receiver_failed`` and
    leaves the last value as it was."""

    __slots__ = ("fn", "key", "name", "reads", "state", "sub")

    def __init__(
        self, state: State, name: str, fn: Callable[[State], Any], reads: Iterable[str | Key[Any]]
    ) -> None:
        if not callable(fn):
            raise UsageError(f"derive({name!r}, fn): fn must be a callable taking the state")
        self.key = check_key(f"derived:{name}")
        keys = [k.name if isinstance(k, Key) else check_key(k) for k in _key_list(reads)]
        if not keys:
            raise UsageError(
                f"derive({name!r}): give the keys it is computed from (reads=[...]), so it is "
                "recomputed when they change"
            )
        if self.key in keys:
            raise UsageError(f"derive({name!r}) may not read {self.key!r}, the key it writes")
        self.state = state
        self.name = name
        self.fn = fn
        self.reads = tuple(dict.fromkeys(keys))
        self.sub: Subscription = state.subscribe(self._changed, keys=list(self.reads))
        self.compute()

    def compute(self) -> None:
        """Recompute now (in the calling thread)."""
        state = self.state
        inputs = {k: state.version(k) for k in self.reads}
        try:
            value = self.fn(state)
            state.set(self.key, value, source="derived", writer=self.name, meta={"inputs": inputs})
        except Exception as exc:
            log.error("derived %r could not be computed: %s", self.key, exc)
            if state.receiver_failed.receivers:
                state.receiver_failed.send(state, receiver=self.fn, error=exc, changes=())

    def _changed(self, changes: tuple[Change, ...]) -> None:
        self.compute()

    def close(self) -> None:
        """Stop recomputing; the last value stays."""
        self.sub.close()

    def __repr__(self) -> str:
        return f"<Derived {self.key!r} from {', '.join(self.reads)}>"
