"""Persistence for the State: attaching a store, durable files, shared calls, closing.

``State(store=...)``, ``State.open(path)``, ``State.connect(url, call_id)``, ``state.sync()``
and ``state.close()`` call these; the commit path itself hands each batch to the store
(:mod:`slateflow.state.engine`), or to the replica of a shared one
(:mod:`slateflow.state.replica`).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from ..errors import StoreCorruptError, UsageError
from ..stores.base import Durability, Store
from . import governance
from .engine import Engine
from .policy import Policy
from .replica import Replica
from .sealing import EncryptionKey, SealedStore, Sealer, is_sealed, needs_key

if TYPE_CHECKING:
    from .state import State

__all__ = ["attach", "close", "connect", "open_file", "sync"]

S = TypeVar("S", bound="State")


def attach(engine: Engine, store: Store) -> None:
    """Recover the engine from ``store`` exactly, then commit every later batch to it."""
    if not isinstance(store, Store):
        raise TypeError(f"store must implement slateflow.stores.Store, got {store!r}")
    try:
        engine.recover(store.load())
    except StoreCorruptError as exc:
        where = getattr(store, "path", None)
        if where is None or str(where) in str(exc):
            raise
        raise StoreCorruptError(
            f"{str(where)!r}: {exc}; restore it from a backup or open a new file"
        ) from None
    engine.store = store
    engine.sync = store.durability == "sync"


def open_file(
    cls: type[S],
    options: dict[str, Any],
    path: str | os.PathLike[str],
    durability: Durability,
    encryption_key: EncryptionKey | None,
) -> S:
    """``cls(store=..., **options)`` over the SQLite file at ``path`` (secret values sealed
    with ``encryption_key``); the file is closed again if that fails, and a file holding
    sealed values refuses to open without the key."""
    from ..stores.sqlite import SQLiteStore

    policy: Policy = options["policy"]
    sealer = Sealer(encryption_key) if encryption_key is not None else None
    store = SQLiteStore(path, durability=durability)
    backing: Store = store if sealer is None else SealedStore(store, sealer, policy.is_secret)
    try:
        state = cls(store=backing, **options)
    except BaseException:
        store.close()
        raise
    if sealer is None:
        entries = state.engine.entries
        sealed = next((k for k, row in entries.items() if is_sealed(row[0])), None)
        if sealed is not None:
            store.close()
            raise needs_key(path, sealed)
    return state


def connect(cls: type[S], options: dict[str, Any], url: str, call_id: str, **store: Any) -> S:
    """``cls(**options)`` as a replica of ``call_id`` on the Redis server at ``url``: loaded
    from the server's snapshot, committing through it, following its commits."""
    from ..stores.redis import RedisStore

    shared = RedisStore(url, call_id, **store)
    snapshot = shared.snapshot()
    state = cls(**options)
    engine = state.engine
    engine.recover(snapshot.loaded)
    engine.store = shared
    engine.shared = Replica(engine, shared, snapshot.head)
    governance.record_secrets(engine)
    shared.follow(engine.shared)
    return state


def sync(engine: Engine) -> None:
    """Every commit so far in the store (on disk, for a durable one), and on a shared State
    every commit the other processes made applied here."""
    if engine.shared is not None:
        engine.shared.sync()
    if engine.store is not None:
        engine.store.sync(engine.seq)


def not_shipped(state: object) -> NoReturn:
    """A State is refused by pickle (and so by multiprocessing and Ray): it is one process's
    replica, with its locks, subscribers and store."""
    raise UsageError(
        f"{state!r} cannot be pickled or sent to another process: send its call id and "
        "connect there (State.connect(url, call_id), or call_state(spec) in a Ray worker)"
    )


def close(engine: Engine) -> None:
    """Flush the store and close it (later writes raise ``StoreClosedError``)."""
    store = engine.store
    if store is None:
        return
    try:
        store.sync(engine.seq)
    finally:
        store.close()
