"""Transactions: buffer writes, read your own writes, commit them as one batch or not at all."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from contextvars import Token
from typing import TYPE_CHECKING, Any

from ..errors import (
    KeyExistsError,
    MissingKeyError,
    TransactionError,
    VersionConflictError,
)
from .keys import META_PREFIX, Key, check_key, key_name
from .keys import key_list as _key_list
from .provenance import Stamp
from .values import JSON, MISSING, REMOVED, clean, copy_json

if TYPE_CHECKING:
    from .state import State

__all__ = ["Transaction"]

_MISSING = MISSING


class Transaction:
    """A batch of writes that commits atomically, made with ``with state.transaction() as tx:``.

    Inside the block, writes through ``tx`` *or* through ``state`` (in the same thread or task) are
    buffered, and reads see them. At the end of the block everything commits as one batch: one
    ``seq``, one journal batch, one change signal. An exception in the block, or ``tx.rollback()``,
    discards the buffer and leaves the state exactly as it was.

    Isolation is optimistic: the version of every key read through the transaction is recorded,
    and if another writer changed one of those keys before the commit, the commit raises
    :class:`~slateflow.errors.VersionConflictError` and writes nothing (so a read-modify-write in a
    transaction never loses a concurrent update; retry it). Validation (keys, values, schemas,
    policies) happens at each write, so an error points at the line that caused it.

    Transactions nest: an inner one commits into the outer one, or rolls back only its own writes.
    """

    def __init__(self, state: State, parent: Transaction | None) -> None:
        self._state = state
        self._parent = parent
        self._writes: dict[str, tuple[JSON, Stamp]] = {}
        self._reads: dict[str, int] = {}
        self._expected: dict[str, int] = {}
        self._token: Token[Transaction | None] | None = None
        self.status = "open"
        """``"open"``, ``"committed"`` or ``"rolled_back"``."""

    # -- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> Transaction:
        self._token = self._state.engine.context.enter_tx(self)
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if self._token is not None:
            self._state.engine.context.exit_tx(self._token)
            self._token = None
        if exc_type is not None:
            if self.status == "open":
                self.rollback()
            return
        if self.status == "open":
            self.commit()

    def _check_open(self) -> None:
        if self.status != "open":
            raise TransactionError(
                f"this transaction is {self.status.replace('_', ' ')}; start a new one with "
                "state.transaction()"
            )

    def commit(self) -> int:
        """Commit now (normally done at the end of the ``with`` block).

        Returns the commit's ``seq`` (for a nested transaction, or when nothing changed, the
        state's current cursor).
        """
        self._check_open()
        if self._parent is not None:
            parent = self._parent
            parent._check_open()
            # Check every expectation before merging anything, so a refused merge changes nothing.
            try:
                for key, version in self._expected.items():
                    parent._check_expect(key, version)
            except VersionConflictError:
                self.status = "rolled_back"
                raise
            parent._writes.update(self._writes)
            parent._expected.update(self._expected)
            self.status = "committed"
            return self._state.journal.cursor
        ops = [(key, value, stamp) for key, (value, stamp) in self._writes.items()]
        try:
            seq = self._state.engine.commit(
                ops, "commit", expected=self._expected, reads=self._reads
            )
        except Exception:
            self.status = "rolled_back"
            raise
        self.status = "committed"
        return seq

    def rollback(self) -> None:
        """Discard every buffered write; the state is left exactly as before."""
        self._check_open()
        self._writes.clear()
        self.status = "rolled_back"

    # -- reads -------------------------------------------------------------------------------

    def _read_row(self, name: str) -> tuple[JSON, Stamp | None]:
        """``(raw value, stamp)`` of ``name`` as this transaction sees it (``_MISSING`` value
        when absent); records the committed version read, for the conflict check."""
        if name in self._writes:
            value, stamp = self._writes[name]
            return (_MISSING, None) if value is REMOVED else (value, stamp)
        if self._parent is not None:
            return self._parent._read_row(name)
        entry = self._state.engine.entries.get(name)
        if entry is None:
            check_key(name)  # an invalid key is an error, not merely absent
        self._reads.setdefault(name, entry[1] if entry is not None else 0)
        return (_MISSING, None) if entry is None else (entry[0], entry[4])

    def _read(self, name: str) -> JSON:
        """The raw value of ``name`` as this transaction sees it (``_MISSING`` when absent)."""
        return self._read_row(name)[0]

    def get(self, key: str | Key[Any], default: Any = None) -> Any:
        """Like :meth:`State.get`, seeing this transaction's buffered writes."""
        name = key_name(key)
        value = self._read(name)
        if value is _MISSING:
            # Reserved and invalid keys behave as outside a transaction.
            if type(key) is str and (key.startswith(META_PREFIX) or key not in self._writes):
                return self._state._get_missing(key, default)
            return default
        if isinstance(key, Key):
            return self._state._typed(key, value)
        return copy_json(value)

    def __getitem__(self, key: str | Key[Any]) -> Any:
        """``tx[key]``: like ``state[key]``, seeing buffered writes."""
        value = self.get(key, _MISSING)
        if value is _MISSING:
            raise MissingKeyError(f"required key {key_name(key)!r} is not set")
        return value

    def __contains__(self, key: str | Key[Any]) -> bool:
        """``key in tx``: whether ``key`` exists as this transaction sees it."""
        return self._read(key_name(key)) is not _MISSING

    def keys(self, prefix: str = "") -> list[str]:
        """Keys starting with ``prefix`` as this transaction sees them (scans are not tracked
        for conflicts: only keys read individually are)."""
        base = self._parent.keys(prefix) if self._parent is not None else self._state._keys(prefix)
        out = [k for k in base if self._writes.get(k, (None,))[0] is not REMOVED]
        seen = set(base)
        out.extend(
            k
            for k, (v, _) in self._writes.items()
            if v is not REMOVED and k.startswith(prefix) and k not in seen
        )
        return out

    def items(self, prefix: str = "") -> list[tuple[str, Any]]:
        """``(key, value)`` pairs under ``prefix`` as this transaction sees them."""
        return [(k, self.get(k)) for k in self.keys(prefix)]

    def pick(self, *keys: str | Key[Any]) -> dict[str, Any]:
        """The values of those ``keys`` that exist, by key name."""
        out = {}
        for k in keys:
            name = key_name(k)
            value = self._read(name)
            if value is not _MISSING:
                out[name] = copy_json(value)
        return out

    # -- writes ------------------------------------------------------------------------------

    def _check_expect(self, name: str, version: int) -> None:
        if self._expected.get(name, version) != version:
            raise VersionConflictError(
                f"{name!r} is expected at two different versions in one transaction "
                f"({self._expected[name]} and {version})"
            )

    def _expect(self, name: str, version: int) -> None:
        self._check_expect(name, version)
        self._expected[name] = version

    def set(
        self,
        key: str | Key[Any],
        value: Any,
        *,
        source: str = "user",
        writer: str | None = None,
        confidence: float | None = None,
        meta: Mapping[str, Any] | None = None,
        expected_version: int | None = None,
    ) -> int:
        """Buffer a write; returns the version the key will have once committed."""
        self._check_open()
        if self._state.engine.context.acting:
            source, writer = self._state.engine.context.admit([key], source, writer)
        stamp = self._state.engine.stamp(key, source, writer, confidence, meta)
        name, cleaned = self._state.engine.prepare(key, value, stamp)
        if expected_version is not None:
            self._expect(name, self._state.engine.check_version_arg(name, expected_version))
        self._writes[name] = (cleaned, stamp)
        entry = self._state.engine.entries.get(name)
        return entry[1] + 1 if entry is not None else 1

    def update(
        self,
        mapping: Mapping[str | Key[Any], Any],
        *,
        source: str = "user",
        writer: str | None = None,
        confidence: float | None = None,
        meta: Mapping[str, Any] | None = None,
        remove: str | Key[Any] | Iterable[str | Key[Any]] = (),
        expected_versions: Mapping[str | Key[Any], int] | None = None,
    ) -> int:
        """Buffer several writes (and removals of the ``remove`` keys that exist).

        Everything is validated first: a refused update buffers nothing.
        """
        self._check_open()
        state = self._state
        if state.engine.context.acting:
            keys = [*mapping, *_key_list(remove)]
            source, writer = state.engine.context.admit(keys, source, writer)
        stamp = state.engine.stamp(next(iter(mapping), "update"), source, writer, confidence, meta)
        ops, expected = state.engine.stage_update(mapping, stamp, remove, expected_versions)
        for name, version in expected.items():
            self._check_expect(name, version)
        self._expected.update(expected)
        for name, cleaned, op_stamp in ops:
            if cleaned is REMOVED and self._read(name) is _MISSING:
                continue
            self._writes[name] = (cleaned, op_stamp)
        return self._state.journal.cursor

    def remove(
        self,
        key: str | Key[Any],
        default: Any = _MISSING,
        *,
        source: str = "user",
        writer: str | None = None,
    ) -> Any:
        """Buffer a removal; returns the value removed (or ``default`` if absent)."""
        self._check_open()
        if self._state.engine.context.acting:
            source, writer = self._state.engine.context.admit([key], source, writer)
        name = key_name(key)
        stamp = self._state.engine.stamp(key, source, writer, None, None)
        self._state.engine.check_remove(name, stamp)
        value = self._read(name)
        if value is _MISSING:
            if default is _MISSING:
                raise MissingKeyError(f"cannot remove {name!r}: it is not set")
            return default
        self._writes[name] = (REMOVED, stamp)
        return copy_json(value)

    def modify(
        self,
        key: str | Key[Any],
        default: Any,
        fn: Callable[[Any], Any],
        *,
        source: str = "user",
        writer: str | None = None,
        confidence: float | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> Any:
        """Buffer ``fn(current value or default)`` as the key's new value; returns it."""
        self._check_open()
        name = key_name(key)
        current = self._read(name)
        current = copy_json(clean(default, name) if current is _MISSING else current)
        new = fn(current)
        self.set(key, new, source=source, writer=writer, confidence=confidence, meta=meta)
        return copy_json(self._writes[name][0])

    def rename(
        self,
        old: str,
        new: str,
        *,
        overwrite: bool = False,
        source: str = "user",
        writer: str | None = None,
    ) -> int:
        """Buffer a rename (see :meth:`State.rename`); returns ``new``'s version-to-be."""
        self._check_open()
        if self._state.engine.context.acting:
            source, writer = self._state.engine.context.admit([old, new], source, writer)
        stamp = self._state.engine.stamp(old, source, writer, None, None)
        self._state.engine.check_remove(old, stamp)
        value, kept = self._read_row(old)
        if value is _MISSING or kept is None:
            raise MissingKeyError(f"cannot rename {old!r}: it is not set")
        if new == old:
            entry = self._state.engine.entries.get(old)
            return entry[1] if entry is not None and old not in self._writes else 1
        if self._read(new) is not _MISSING and not overwrite:
            raise KeyExistsError(
                f"cannot rename {old!r} to {new!r}: {new!r} exists; pass overwrite=True"
            )
        name, cleaned = self._state.engine.prepare(new, value, kept)
        if self._state.engine.policy.active:
            self._state.engine.policy.check(name, cleaned, stamp)
        self._writes[old] = (REMOVED, stamp)
        self._writes[name] = (cleaned, kept)
        entry = self._state.engine.entries.get(name)
        return entry[1] + 1 if entry is not None else 1

    def __repr__(self) -> str:
        return f"<Transaction {self.status}, {len(self._writes)} buffered writes>"
