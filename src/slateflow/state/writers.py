"""Who is writing: the actor a context writes as, and the transaction it writes into.

A resolver's source runs fenced as its actor (``push_actor`` / ``pop_actor``, a hot path of
every run); ``state.acting_as(...)`` blocks do the same for user code; a transaction's ``with``
block routes the context's calls into it (``enter_tx`` / ``exit_tx``), and runtime writes that
must commit now step outside it (``outside_transaction``). Part of the :class:`Engine`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from contextlib import AbstractContextManager, nullcontext
from contextvars import ContextVar, Token
from typing import TYPE_CHECKING, Any

from .actors import Actor
from .keys import Key, key_name

if TYPE_CHECKING:
    from .transaction import Transaction

__all__ = ["Writers"]

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


class Writers:
    """The writer context of an :class:`Engine` (see the module docstring)."""

    # Set by the Engine: its lock, and how many actor blocks / transaction blocks are open.
    lock: threading.RLock
    tx_open: int
    acting: int
    fenced: int
    _txvar: ContextVar[Transaction | None]
    _actorvar: ContextVar[Actor | None]

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
