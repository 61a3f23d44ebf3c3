"""Encryption at rest for secret keys: their values are sealed before they reach the store.

``State.open(path, encryption_key=key)`` wraps the file's store in a :class:`SealedStore`. Each
committed value of a key the policy marks secret (``state.policy("card:*", secret=True)``) is
encrypted with Fernet (AES-128-CBC and HMAC-SHA256, from the ``cryptography`` package) and stored
as ``{"$sealed": "<token>"}``; everything else is stored as it was. Reading the file back (at
open, ``state.journal.at(seq)``) opens the seals with the key. Without the key the file still
opens for
``slateflow replay``, which shows a sealed value as ``***``; ``State.open`` without it refuses a
file holding sealed values, naming the key, rather than load a State with holes.

A user value that happens to look like a seal (a dict whose only key starts with ``$sealed``)
is escaped on the way in, so no stored value is ever mistaken for another.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ..errors import StoreError
from ..stores.base import Durability, Store
from ..stores.records import ChangeRow, CommitRow, EntryRow, Loaded

__all__ = [
    "SEAL",
    "EncryptionKey",
    "SealedStore",
    "Sealer",
    "escape",
    "is_sealed",
    "needs_key",
    "new_key",
    "unescape",
]

SEAL = "$sealed"
"""The one key of a sealed value's stored form: ``{"$sealed": "<Fernet token>"}``."""

_ESCAPE = "$sealed-escaped"

EncryptionKey = str | bytes | Sequence[str | bytes]
"""A Fernet key (url-safe base64 of 32 bytes, from :func:`new_key`), or several: the first
seals, every one may open (rotate by putting the new key first)."""


def _fernet() -> Any:
    try:
        from cryptography import fernet
    except ImportError:  # pragma: no cover - exercised only without the extra
        raise StoreError(
            "encryption at rest needs the cryptography package: pip install 'slateflow[crypto]'"
        ) from None
    return fernet


def new_key() -> str:
    """A fresh random encryption key (url-safe base64 text): keep it out of the file it opens,
    e.g. in a secrets manager or an environment variable."""
    return str(_fernet().Fernet.generate_key().decode("ascii"))


# A Fernet token: version byte 0x80 and a timestamp ("gAAAAA" in base64), an IV, at least one
# cipher block and the HMAC: 100 characters or more.
_TOKEN = re.compile(r"gAAAAA[A-Za-z0-9_-]{90,}={0,2}")


def is_sealed(value: Any) -> bool:
    """Whether ``value`` is a sealed value as stored (``{"$sealed": "<Fernet token>"}``).

    The token's shape is checked too, so a value a file written without a key happens to hold
    (``{"$sealed": "x"}``) is never taken for a seal.
    """
    if type(value) is not dict or len(value) != 1:
        return False
    token = value.get(SEAL)
    return type(token) is str and _TOKEN.fullmatch(token) is not None


class Sealer:
    """Seals and opens values with one or more Fernet keys (see :data:`EncryptionKey`)."""

    def __init__(self, key: EncryptionKey) -> None:
        fernet = _fernet()
        if isinstance(key, str | bytes):
            keys = [key]
        elif isinstance(key, Sequence):
            keys = list(key)  # type: ignore[arg-type]  # bytes was matched above
        else:
            raise StoreError(
                f"encryption_key must be a key (str or bytes) or a list of keys, got "
                f"{type(key).__name__}"
            )
        if not keys:
            raise StoreError("encryption_key is an empty list: give at least one key")
        try:
            ciphers = [fernet.Fernet(k) for k in keys]
        except (ValueError, TypeError) as exc:
            raise StoreError(
                f"encryption_key is not a Fernet key ({exc}); make one with "
                "slateflow.state.sealing.new_key()"
            ) from None
        self._cipher = fernet.MultiFernet(ciphers)
        self._invalid = fernet.InvalidToken

    def seal(self, value: Any) -> dict[str, str]:
        """``value`` encrypted, in its stored form."""
        text = json.dumps(value, ensure_ascii=True, allow_nan=False, separators=(",", ":"))
        return {SEAL: self._cipher.encrypt(text.encode("ascii")).decode("ascii")}

    def open(self, sealed: dict[str, str], key: str, where: str) -> Any:
        """The value inside ``sealed`` (the value of ``key``); raises ``StoreError`` if no key
        given opens it."""
        try:
            text = self._cipher.decrypt(sealed[SEAL].encode("ascii"))
        except (self._invalid, ValueError):
            raise StoreError(
                f"{where}: the secret value of {key!r} cannot be decrypted with the "
                "encryption_key given: it was sealed with another key (after a rotation, pass "
                "both: encryption_key=[new, old]) or the file was damaged"
            ) from None
        return json.loads(text)


def escape(value: Any) -> Any:
    """A user value that looks like a seal, wrapped so it is not taken for one."""
    if type(value) is dict and len(value) == 1 and next(iter(value)).startswith(SEAL):
        return {_ESCAPE: value}
    return value


def unescape(value: Any) -> Any:
    if type(value) is dict and len(value) == 1 and _ESCAPE in value:
        return value[_ESCAPE]
    return value


class SealedStore:
    """A :class:`~slateflow.stores.base.Store` that seals the values of secret keys on their way
    into ``inner`` and opens them on the way out (see the module docstring).

    ``secret(key)`` says which keys are secret (the State's policy, asked at each commit: a key
    marked secret later is sealed from then on). Everything else, checkpoints included, goes
    to ``inner`` unchanged.
    """

    def __init__(self, inner: Store, sealer: Sealer, secret: Callable[[str], bool]) -> None:
        self.inner = inner
        self.sealer = sealer
        self.secret = secret
        self._where = str(getattr(inner, "path", type(inner).__name__))

    # -- the Store protocol -------------------------------------------------------------------

    @property
    def durability(self) -> Durability:
        return self.inner.durability

    @durability.setter
    def durability(self, value: Durability) -> None:
        self.inner.durability = value

    @property
    def error(self) -> Exception | None:
        return self.inner.error

    @error.setter
    def error(self, value: Exception | None) -> None:
        self.inner.error = value

    def load(self) -> Loaded:
        return self._opened(self.inner.load())

    def read(self, upto: int | None = None) -> Loaded:
        return self._opened(self.inner.read(upto))

    def append(self, commit: CommitRow) -> None:
        seq, at_ns, origin, changes = commit
        self.inner.append((seq, at_ns, origin, tuple(self._seal_change(c) for c in changes)))

    def sync(self, seq: int | None = None) -> None:
        self.inner.sync(seq)

    def commits(self, after: int = 0, upto: int | None = None) -> Iterator[CommitRow]:
        for seq, at_ns, origin, changes in self.inner.commits(after, upto):
            yield seq, at_ns, origin, tuple(self._open_change(c, seq) for c in changes)

    def compact(self, seq: int, entries: list[EntryRow]) -> None:
        self.inner.compact(seq, [self._seal_entry(e) for e in entries])

    def close(self) -> None:
        self.inner.close()

    # -- checkpoints and the rest pass through ------------------------------------------------

    def load_checkpoint(self, workflow_id: str) -> str | None:
        return self.inner.load_checkpoint(workflow_id)  # type: ignore[attr-defined, no-any-return]

    def save_checkpoint(self, workflow_id: str, data: str) -> None:
        self.inner.save_checkpoint(workflow_id, data)  # type: ignore[attr-defined]

    def delete_checkpoint(self, workflow_id: str) -> None:
        self.inner.delete_checkpoint(workflow_id)  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet (a half-made copy): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)  # path, readonly, max_lag, ...

    def __repr__(self) -> str:
        return f"<SealedStore over {self.inner!r}>"

    def reseal(self, prefix: str = "") -> int:
        """Seal the stored values of secret keys that are in clear (written before the key was
        declared secret), in every commit and the base, rewriting the file in place; returns
        how many records were rewritten (0 for a store that cannot rewrite its history).
        ``prefix``: the keys to look at all begin with it (a file that holds no such key is
        not read through)."""
        rewrite = getattr(self.inner, "rewrite", None)
        if rewrite is None or getattr(self.inner, "readonly", False):
            return 0

        def change(row: ChangeRow) -> ChangeRow:
            key, value, version, *rest = row
            if not version or value is None or is_sealed(value) or not self.secret(key):
                return row
            return (key, self.sealer.seal(unescape(value)), version, *rest)  # type: ignore[return-value]

        def entry(row: EntryRow) -> EntryRow:
            key, value, *rest = row
            if value is None or is_sealed(value) or not self.secret(key):
                return row
            return (key, self.sealer.seal(unescape(value)), *rest)  # type: ignore[return-value]

        # A key is stored as a JSON string: its encoding starts with the prefix's.
        hint = json.dumps(prefix, ensure_ascii=True)[:-1] if prefix else None
        return int(rewrite(change, entry, hint))

    # -- sealing ------------------------------------------------------------------------------

    def _stored(self, key: str, value: Any) -> Any:
        if self.secret(key) and value is not None:
            return self.sealer.seal(value)
        return escape(value)

    def _loaded(self, key: str, value: Any, where: str) -> Any:
        if is_sealed(value):
            return self.sealer.open(value, key, where)
        return unescape(value)

    def _seal_change(self, change: ChangeRow) -> ChangeRow:
        key, value, version, source, writer, confidence, meta = change
        if not version:  # a removal carries no value
            return change
        return (key, self._stored(key, value), version, source, writer, confidence, meta)

    def _open_change(self, change: ChangeRow, seq: int) -> ChangeRow:
        key, value, version, source, writer, confidence, meta = change
        value = self._loaded(key, value, f"{self._where} commit {seq}")
        return (key, value, version, source, writer, confidence, meta)

    def _seal_entry(self, entry: EntryRow) -> EntryRow:
        key, value, *rest = entry
        return (key, self._stored(key, value), *rest)

    def _opened(self, loaded: Loaded) -> Loaded:
        where = f"{self._where} base"
        base: list[EntryRow] = [
            (e[0], self._loaded(e[0], e[1], where), *e[2:]) for e in loaded.base
        ]
        commits = [
            (seq, at_ns, origin, tuple(self._open_change(c, seq) for c in changes))
            for seq, at_ns, origin, changes in loaded.commits
        ]
        return Loaded(loaded.base_seq, base, commits)


def needs_key(path: str | os.PathLike[str], key: str) -> StoreError:
    """The refusal to open ``path`` without a key: it holds the sealed value of ``key``."""
    return StoreError(
        f"{str(path)!r} holds encrypted secret values (the first: {key!r}); open it with "
        "State.open(path, encryption_key=...) (slateflow replay reads it without the key, "
        "showing them as ***)"
    )
