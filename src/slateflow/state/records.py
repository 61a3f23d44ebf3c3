"""Records the state hands out: :class:`Change` (also the journal's mutation) and :class:`Entry`."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from .provenance import Provenance, Stamp, ns_to_dt
from .values import JSON, copy_json

__all__ = ["SECRET_MASK", "Change", "Entry", "Mutation"]

SECRET_MASK = "***"
"""What a secret value is shown as wherever the state is formatted for people or models."""

_new_tuple = tuple.__new__

if TYPE_CHECKING:
    from .policy import Policy

_Fields = tuple[str, JSON, JSON, int, int, str, bool, int, Stamp, "Policy"]
RawChange = tuple[str, JSON, JSON, int, int, str, bool, int, Stamp, "Policy"]
"""A change as the commit path records it: a plain tuple, wrapped into a Change when read."""


class Change(_Fields):
    """One committed change to one key, as delivered to subscribers and kept in the journal.

    ``key``; ``old`` and ``new`` values (``None`` when the key did not exist / was removed; each
    access returns a private copy); ``version`` (the key's version after the change, ``0`` for a
    removal); ``seq`` (the commit's global sequence number, shared by every change of a batch);
    ``origin`` (``"set"``, ``"remove"``, ``"commit"``, ``"clear_prefix"``, ``"rename"``,
    ``"end_turn"``, ...); ``removed``; ``provenance`` and ``at`` of the write.

    Changes are immutable; two changes are equal when they record the same commit of the same
    key. The journal's :data:`Mutation` records are the same type.
    """

    __slots__ = ()

    @classmethod
    def wrap(cls, raw: RawChange) -> Change:
        """The :class:`Change` view of a raw change recorded by the commit path."""
        return _new_tuple(cls, raw)

    @property
    def key(self) -> str:
        return self[0]

    @property
    def old(self) -> JSON:
        return copy_json(self[1])

    @property
    def new(self) -> JSON:
        return copy_json(self[2])

    @property
    def version(self) -> int:
        return self[3]

    @property
    def seq(self) -> int:
        return self[4]

    @property
    def origin(self) -> str:
        return self[5]

    @property
    def removed(self) -> bool:
        return self[6]

    @property
    def created(self) -> bool:
        """Whether this change brought the key into existence."""
        return self[3] == 1

    @property
    def secret(self) -> bool:
        """Whether the key is secret under the state's policy (its values are masked when
        formatted; a rule added later masks earlier changes too)."""
        return self[9].is_secret(self[0])

    @property
    def at(self) -> datetime:
        return ns_to_dt(self[7])

    @property
    def provenance(self) -> Provenance:
        return self[8].provenance(self[7])

    def to_dict(self, *, redact: bool = True) -> dict[str, Any]:
        """A JSON-ready dict of this change; secret values are masked unless ``redact=False``."""
        mask = redact and self.secret
        return {
            "seq": self[4],
            "key": self[0],
            "origin": self[5],
            "removed": self[6],
            "version": self[3],
            "old": SECRET_MASK if mask and self[1] is not None else copy_json(self[1]),
            "new": SECRET_MASK if mask and self[2] is not None else copy_json(self[2]),
            "provenance": self.provenance.model_dump(mode="json"),
        }

    def __repr__(self) -> str:
        old, new = (SECRET_MASK, SECRET_MASK) if self.secret else (self[1], self[2])
        what = "removed" if self[6] else f"{old!r} -> {new!r}"
        return (
            f"Change({self[0]!r}: {what}, v{self[3]}, seq {self[4]}, {self[5]}, "
            f"source={self[8].source!r}, writer={self[8].writer!r})"
        )

    # Equality stays the tuple's (the fields, the shared stamp by identity); values may be
    # unhashable, so hash what identifies the change.
    def __hash__(self) -> int:
        return hash((self[0], self[4], self[3], self[6]))


Mutation = Change
"""A journal record: the same immutable :class:`Change` delivered to subscribers."""


@dataclass(frozen=True, slots=True)
class Entry:
    """A key's current value with its metadata, as returned by ``state.entry(key)``.

    ``value`` is a private copy; ``version`` counts writes to the key since it was created (from
    1); ``seq`` is the global commit that last wrote it; ``updated_at`` is that commit's time.
    """

    key: str
    value: JSON
    version: int
    seq: int
    provenance: Provenance
    updated_at: datetime
    secret: bool = False

    def __repr__(self) -> str:
        value = SECRET_MASK if self.secret else self.value
        return (
            f"Entry({self.key!r}, {value!r}, version={self.version}, seq={self.seq}, "
            f"source={self.provenance.source!r}, writer={self.provenance.writer!r})"
        )
