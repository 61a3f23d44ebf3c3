"""Who is writing: the actor a context writes as, and the transaction it writes into.

A resolver's source runs fenced as its actor (``push_actor`` / ``pop_actor``, a hot path of
every run); ``state.acting_as(...)`` blocks do the same for user code; a transaction's ``with``
block routes the context's calls into it (``enter_tx`` / ``exit_tx``), and runtime writes that
must commit now step outside it (``outside_transaction``). One :class:`WriteContext` per engine
(``state.engine.context``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar, Token
from typing import TYPE_CHECKING, Any

from .actors import Actor
from .keys import Key, key_name

if TYPE_CHECKING:
    from .transaction import Transaction

__all__ = ["WriteContext"]

_NOTHING = nullcontext()


class _Outside:
    """Hides the open transaction from this context for the block."""

    __slots__ = ("_token", "_var")

    def __init__(self, var: ContextVar[Transaction | None]) -> None:
        self._var = var
        self._token: Token[Transaction | None] | None = None

    def __enter__(self) -> None:
        self._token = self._var.set(None)

    def __exit__(self, *exc: object) -> None:
        assert self._token is not None
        self._var.reset(self._token)


class WriteContext:
    """Who writes, and into which transaction, for one engine (see the module docstring).

    ``tx_open``, ``acting`` and ``fenced`` count the open transaction blocks, the open actor
    blocks and both, in any context: a write looks for either only while one is open.
    """

    __slots__ = ("_actorvar", "_txvar", "acting", "fenced", "lock", "tx_open")

    def __init__(self, lock: threading.RLock, owner: int) -> None:
        self.lock = lock
        self.tx_open = 0
        self.acting = 0
        self.fenced = 0
        self._txvar: ContextVar[Transaction | None] = ContextVar(
            f"slateflow_tx_{owner}", default=None
        )
        self._actorvar: ContextVar[Actor | None] = ContextVar(
            f"slateflow_actor_{owner}", default=None
        )

    def push_actor(self, actor: Actor | None) -> Token[Actor | None]:
        """Write as ``actor`` (None: as nobody) in this context until :meth:`pop_actor`.

        Not a context manager: the Session enters one per resolver run (a hot path).
        """
        token = self._actorvar.set(actor)
        with self.lock:
            self.acting += 1
            self.fenced += 1
        return token

    def pop_actor(self, token: Token[Actor | None]) -> None:
        """Undo the matching :meth:`push_actor`."""
        self._actorvar.reset(token)
        with self.lock:
            self.acting -= 1
            self.fenced -= 1

    @contextmanager
    def acting_as(self, actor: Actor) -> Iterator[Actor]:
        """Write as ``actor`` in this context for the block (``state.acting_as``)."""
        token = self.push_actor(actor)
        try:
            yield actor
        finally:
            self.pop_actor(token)

    def actor(self) -> Actor | None:
        """The actor this context writes as, if any."""
        return self._actorvar.get()

    def admit(
        self, keys: Iterable[str | Key[Any]], source: str, writer: str | None
    ) -> tuple[str, str | None]:
        """The provenance the current actor gives a write of ``keys`` (raises if it may not)."""
        actor = self._actorvar.get()
        if actor is None:
            return source, writer
        admitted = source, writer
        for key in keys:
            admitted = actor.admit(key_name(key), source, writer)
        return admitted

    def transaction(self) -> Transaction | None:
        """The transaction whose ``with`` block the current context is in, if any.

        A task started inside the block inherits its context; once the block has exited, that
        task's reads and writes go to the state again.
        """
        if not self.tx_open:
            return None
        tx = self._txvar.get()
        # After an inner block exits, an outer block may still be open.
        while tx is not None and tx._token is None:
            tx = tx._parent
        return tx

    def enter_tx(self, tx: Transaction) -> Token[Transaction | None]:
        """Route this context's state calls into ``tx`` (its ``with`` block opens)."""
        with self.lock:
            self.tx_open += 1
            self.fenced += 1
        return self._txvar.set(tx)

    def exit_tx(self, token: Token[Transaction | None]) -> None:
        """Undo the matching :meth:`enter_tx`."""
        self._txvar.reset(token)
        with self.lock:
            self.tx_open -= 1
            self.fenced -= 1

    def outside_transaction(self) -> AbstractContextManager[None]:
        """A context in which this context's calls go to the state as if no transaction were
        open (runtime writes that must commit now, whatever block the writer's code is in)."""
        if not self.tx_open or self._txvar.get() is None:
            return _NOTHING
        return _Outside(self._txvar)
