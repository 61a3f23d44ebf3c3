"""Delivery chains: how many writes deep the current code is, counting from a write nobody's
delivery caused.

A receiver that writes makes a chained write; so does a session watcher's action, and each
write of theirs one level deeper. A receiver that writes the key it listens to would chain
forever: the State stops delivering past :data:`MAX_CHAIN` levels and reports it. A resolver's
run starts a chain of its own (it is new work, not a reaction).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

__all__ = ["MAX_CHAIN", "depth", "enter", "fresh_chain", "in_chain", "leave"]

MAX_CHAIN = 1000
"""How many chained deliveries one originating write may lead to before they are stopped."""

_DEPTH: ContextVar[int] = ContextVar("slateflow_delivery_chain", default=0)
depth = _DEPTH.get
"""The chain depth of the code running now (0: not reacting to any write)."""
enter = _DEPTH.set
"""Enter chain depth ``level``; returns the token :func:`leave` takes (``in_chain`` without the
context manager, for the delivery loop)."""
leave = _DEPTH.reset
"""Leave the depth :func:`enter` entered."""


@contextmanager
def in_chain(level: int) -> Iterator[None]:
    """Run the block at chain depth ``level`` (a receiver called for a change of that depth)."""
    token = _DEPTH.set(level)
    try:
        yield
    finally:
        _DEPTH.reset(token)


def fresh_chain() -> None:
    """Start a new chain in this context (a task doing new work, such as a resolver's run)."""
    if _DEPTH.get():
        _DEPTH.set(0)
