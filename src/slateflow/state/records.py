"""Records the state hands out: :class:`Change` (what the journal records) and :class:`Entry`."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from .provenance import Provenance, Stamp, ns_to_dt
from .values import JSON, copy_json

__all__ = ["SECRET_MASK", "Change", "Entry"]

SECRET_MASK = "***"
"""What a secret value is shown as wherever the state is formatted for people or models."""

_alloc = object.__new__

if TYPE_CHECKING:
    from .policy import Policy

RawChange = tuple[str, JSON, JSON, int, int, str, bool, int, Stamp, "Policy"]
"""A change as the commit path records it: a plain tuple, wrapped into a Change when read."""


class Change:
    """One committed change to one key, as delivered to subscribers and kept in the journal.

    ``key``; ``old`` and ``new`` values (``None`` when the key did not exist / was removed; each
    access returns a private copy); ``version`` (the key's version after the change, ``0`` for a
    removal); ``seq`` (the commit's global sequence number, shared by every change of a batch);
    ``origin`` (``"set"``, ``"remove"``, ``"commit"``, ``"clear_prefix"``, ``"rename"``,
    ``"flow"``, ``"turn"``, a run's mode, ...); ``removed``; ``provenance`` and ``at`` of the write.

    Changes are immutable and never hand out the stored values themselves; two changes are
    equal when they record the same commit of the same key. The journal's
    records are the same type.
    """

    __slots__ = ("_raw",)
    _raw: RawChange

    @classmethod
    def wrap(cls, raw: RawChange) -> Change:
        """The :class:`Change` view of a raw change recorded by the commit path."""
        change = _alloc(cls)
        change._raw = raw
        return change

    @property
    def key(self) -> str:
        """The key changed."""
        return self._raw[0]

    @property
    def old(self) -> JSON:
        """The value before the change (None when the key was created)."""
        return copy_json(self._raw[1])

    @property
    def new(self) -> JSON:
        """The value after the change (None when the key was removed)."""
        return copy_json(self._raw[2])

    @property
    def version(self) -> int:
        """The key's version after the change (0: removed)."""
        return self._raw[3]

    @property
    def seq(self) -> int:
        """The commit the change belongs to."""
        return self._raw[4]

    @property
    def origin(self) -> str:
        """What made the commit: ``set``, ``update``, ``transaction``, ``remove``, ..."""
        return self._raw[5]

    @property
    def removed(self) -> bool:
        """Whether the key was removed."""
        return self._raw[6]

    @property
    def created(self) -> bool:
        """Whether this change brought the key into existence."""
        return self._raw[3] == 1

    @property
    def secret(self) -> bool:
        """Whether the key is secret under the state's policy (its values are masked when
        formatted; a rule added later masks earlier changes too)."""
        return self._raw[9].is_secret(self._raw[0])

    @property
    def at(self) -> datetime:
        """When the commit was made (the State's clock, in seconds)."""
        return ns_to_dt(self._raw[7])

    @property
    def provenance(self) -> Provenance:
        """Who wrote the new value: source, writer, confidence, meta (None when removed)."""
        return self._raw[8].provenance(self._raw[7])

    def to_dict(self, *, redact: bool = True) -> dict[str, Any]:
        """A JSON-ready dict of this change; unless ``redact=False``, a secret key's values and
        the values of its provenance ``meta`` (which a writer may fill from the value) are
        masked."""
        mask = redact and self.secret
        provenance = self.provenance.model_dump(mode="json")
        if mask and provenance["meta"]:
            provenance["meta"] = dict.fromkeys(provenance["meta"], SECRET_MASK)
        return {
            "seq": self._raw[4],
            "key": self._raw[0],
            "origin": self._raw[5],
            "removed": self._raw[6],
            "version": self._raw[3],
            "old": SECRET_MASK if mask and self._raw[1] is not None else copy_json(self._raw[1]),
            "new": SECRET_MASK if mask and self._raw[2] is not None else copy_json(self._raw[2]),
            "provenance": provenance,
        }

    def __repr__(self) -> str:
        key, old, new, version, seq, origin, removed, _, stamp, _ = self._raw
        if self.secret:
            old, new = SECRET_MASK, SECRET_MASK
        what = "removed" if removed else f"{old!r} -> {new!r}"
        return (
            f"Change({key!r}: {what}, v{version}, seq {seq}, {origin}, "
            f"source={stamp.source!r}, writer={stamp.writer!r})"
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Change):
            return NotImplemented
        # Key, seq and version identify a commit of a key; the rest must agree too.
        return self._raw == other._raw

    def __hash__(self) -> int:
        raw = self._raw
        return hash((raw[0], raw[4], raw[3], raw[6]))


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
