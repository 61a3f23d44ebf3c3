"""Provenance: who wrote a value, from what source, with what confidence, and when."""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from ..errors import StateValueError
from .values import clean, copy_json

if TYPE_CHECKING:
    from .keys import Key
    from .state import State

__all__ = ["Provenance", "Stamp", "dt_to_ns", "ns_to_dt", "source_of"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_US = timedelta(microseconds=1)


def ns_to_dt(ns: int) -> datetime:
    """Nanoseconds since the Unix epoch to an aware UTC datetime (truncated to microseconds)."""
    return _EPOCH + timedelta(microseconds=ns // 1000)


def dt_to_ns(at: datetime) -> int:
    """An aware datetime to nanoseconds since the Unix epoch (exact; naive means UTC)."""
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return (at - _EPOCH) // _ONE_US * 1000


class Provenance(BaseModel):
    """Where a value came from.

    ``source`` is the kind of writer (``"user"``, ``"agent"``, ``"fetch"``, ``"llm"``,
    ``"extraction"``, ``"tool"``, ``"system"``, ...), ``writer`` names it (a resolver or extractor),
    ``confidence`` is in ``[0, 1]`` when the writer gave one, ``at`` is the commit time (UTC,
    microsecond precision) and ``meta`` holds anything else the writer recorded.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    source: str = Field(min_length=1)
    writer: str | None = None
    confidence: float | None = Field(default=None, ge=0.0, le=1.0)
    at: datetime
    meta: dict[str, JsonValue] = Field(default_factory=dict)

    def as_meta(self) -> dict[str, Any]:
        """The seed-compatible dict stored virtually at ``state_meta:<key>``.

        Adds ``resolver`` (the writer's name) beside the model's fields, as seed code expects.
        """
        out = self.model_dump(mode="json")
        out["resolver"] = self.writer
        return out


class Stamp:
    """The part of a provenance shared by every key of one write: source, writer, confidence, meta.

    Internal and immutable; the commit time lives beside it in the entry so that identical stamps
    can be shared between keys and writes (this keeps a stored key small).
    """

    __slots__ = ("confidence", "meta", "source", "writer")

    def __init__(
        self,
        source: str,
        writer: str | None,
        confidence: float | None,
        meta: dict[str, Any] | None,
    ) -> None:
        self.source = source
        self.writer = writer
        self.confidence = confidence
        self.meta = meta

    @classmethod
    def checked(
        cls,
        key: str,
        source: object,
        writer: object,
        confidence: object,
        meta: object,
    ) -> Stamp:
        """Validate provenance arguments given for a write to ``key``."""
        if type(source) is not str or not source:
            raise StateValueError(f"source for {key!r} must be a non-empty string, got {source!r}")
        if writer is not None and (type(writer) is not str or not writer):
            raise StateValueError(
                f"writer for {key!r} must be a non-empty string or None, got {writer!r}"
            )
        if confidence is not None:
            if (
                isinstance(confidence, bool)
                or not isinstance(confidence, int | float)
                or not math.isfinite(confidence)
                or not 0.0 <= confidence <= 1.0
            ):
                raise StateValueError(
                    f"confidence for {key!r} must be a number between 0 and 1, got {confidence!r}"
                )
            confidence = float(confidence)
        if meta is not None:
            if not isinstance(meta, Mapping):
                raise StateValueError(f"meta for {key!r} must be a dict, got {type(meta).__name__}")
            meta = clean(dict(meta), f"meta of {key}") or None
        return cls(source, writer, confidence, meta)

    def provenance(self, at_ns: int) -> Provenance:
        """The public :class:`Provenance` of a value written with this stamp at ``at_ns``."""
        return Provenance.model_construct(
            source=self.source,
            writer=self.writer,
            confidence=self.confidence,
            at=ns_to_dt(at_ns),
            meta=copy_json(self.meta) if self.meta else {},
        )

    @classmethod
    def of(cls, provenance: Provenance) -> Stamp:
        """The stamp part of a :class:`Provenance` (used when restoring snapshots)."""
        meta = copy_json(provenance.meta) if provenance.meta else None
        return cls(provenance.source, provenance.writer, provenance.confidence, meta)


def source_of(state: State, key: str | Key[Any]) -> str | None:
    """The provenance source (``"agent"``, ``"fetch"``, ``"user"``, ...) of ``key``'s value.

    None when the key is not set. The full record is ``state.provenance(key)``.
    """
    record = state.provenance(key)
    return None if record is None else record.source
