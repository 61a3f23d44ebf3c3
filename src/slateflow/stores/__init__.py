"""Stores: where a State's committed batches live (the layer below the State).

``MemoryStore`` keeps every commit in memory (time travel, restart tests); ``SQLiteStore`` keeps
them in a SQLite file (WAL), one transaction per group of batches, at the durability you choose;
``slateflow.stores.redis.RedisStore`` (``slateflow[redis]``) shares one call's commits between
processes (a :class:`SharedStore`: the store decides the order, each State is a replica).
A store sees only plain records (:mod:`slateflow.stores.records`); it never imports the State.
"""

from .base import CheckpointStore, Durability, Store
from .memory import MemoryStore
from .records import ChangeRow, CommitRow, EntryRow, Loaded
from .shared import SharedStore
from .sqlite import SQLiteStore

__all__ = [
    "ChangeRow",
    "CheckpointStore",
    "CommitRow",
    "Durability",
    "EntryRow",
    "Loaded",
    "MemoryStore",
    "SQLiteStore",
    "SharedStore",
    "Store",
]
