"""Validation of writes: keys, values, declared schemas, policies, and provenance stamps.

The first step of the commit path (:mod:`slateflow.state.engine`): everything here runs before
the engine takes its lock, so a refused write holds nothing and changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..errors import ReadOnlyError, StateValueError
from .keys import META_PREFIX, Key, check_key, key_name
from .keys import key_list as _key_list
from .policy import Policy
from .provenance import Stamp
from .schema import Schemas, validate_with
from .values import JSON, REMOVED, clean

__all__ = ["Op", "Validator"]

Op = tuple[str, JSON, Stamp]
"""One validated write: ``(key, cleaned value or REMOVED, stamp)``."""

_SCALARS = frozenset({str, int, bool, type(None)})


class Validator:
    """Checks writes against a State's keys, schemas and policy; makes provenance stamps."""

    def __init__(self, entries: Mapping[str, Any], policy: Policy, schemas: Schemas) -> None:
        self.entries = entries
        self.policy = policy
        self.schemas = schemas
        self.default_stamp = Stamp("user", None, None, None)
        self._stamps: dict[tuple[str, str | None, float | None], Stamp] = {}

    def stamp(
        self,
        key: object,
        source: str,
        writer: str | None,
        confidence: float | None,
        meta: Mapping[str, Any] | None,
    ) -> Stamp:
        """The provenance stamp of a write (cached for the common, meta-less ones)."""
        cacheable = (
            meta is None
            and type(source) is str
            and (writer is None or type(writer) is str)
            and (confidence is None or type(confidence) is float)
        )
        if cacheable:
            if source == "user" and writer is None and confidence is None:
                return self.default_stamp
            stamp = self._stamps.get((source, writer, confidence))
            if stamp is not None:
                return stamp
        stamp = Stamp.checked(str(key), source, writer, confidence, meta)
        if cacheable:
            if len(self._stamps) > 4096:
                self._stamps = {}
            self._stamps[(source, writer, confidence)] = stamp
        return stamp

    def secret(self, key: str) -> bool:
        """Whether the policy marks ``key`` secret."""
        return self.policy.is_secret(key)

    def check_new_key(self, key: str) -> None:
        """Refuse a key no write may create (invalid, or a read-only ``state_meta:`` view)."""
        check_key(key)
        if key.startswith(META_PREFIX):
            raise ReadOnlyError(
                f"cannot write {key!r}: 'state_meta:' keys are read-only views of provenance; "
                "pass source=/writer=/meta= when writing the key itself"
            )

    def prepare(self, key: str | Key[Any], value: Any, stamp: Stamp) -> tuple[str, JSON]:
        """Validate a write of ``value`` to ``key`` (key, value, schema, policy): its name and
        its cleaned JSON value."""
        if type(key) is str:
            name = key
        elif isinstance(key, Key):
            name = key.name
            value = validate_with(key.adapter, name, value, key.type, secret=self.secret(name))
        else:
            name = check_key(key)
        if name not in self.entries:
            self.check_new_key(name)
        # A declared type sees the value as written (a datetime, a model) and yields its JSON.
        decl = self.schemas.find(name) if self.schemas.decls else None
        if decl is not None:
            value = Schemas.check(decl, name, value, secret=self.secret(name))
        cleaned = clean(value, name)
        if self.policy.active:
            self.policy.check(name, cleaned, stamp)
        return name, cleaned

    def check_remove(self, name: str, stamp: Stamp) -> None:
        """Refuse a removal the policy forbids."""
        if self.policy.active:
            self.policy.check(name, None, stamp, removing=True)

    @staticmethod
    def check_version_arg(name: str, expected: object) -> int:
        """An ``expected_version`` argument, checked."""
        if type(expected) is not int or expected < 0:
            raise StateValueError(
                f"expected_version for {name!r} must be an int >= 0 (0 = must not exist), "
                f"got {expected!r}"
            )
        return expected

    def stage_update(
        self,
        mapping: Mapping[str | Key[Any], Any],
        stamp: Stamp,
        remove: str | Key[Any] | Iterable[str | Key[Any]],
        expected_versions: Mapping[str | Key[Any], int] | None,
    ) -> tuple[list[Op], dict[str, int]]:
        """Validate an update (for the State and transactions): its ops and expected versions."""
        expected = {
            (name := check_key(key_name(key))): self.check_version_arg(name, version)
            for key, version in (expected_versions or {}).items()
        }
        entries = self.entries
        prepare = self.prepare
        odd: list[object] = []  # keys that are not plain str (a Key may repeat a str's name)

        def validated(k: str | Key[Any], v: Any) -> Op:
            if type(k) is not str:
                odd.append(k)
            return (*prepare(k, v, stamp), stamp)

        ops: list[Op]
        # Scalars written to existing keys of an ungoverned state need no validation work.
        if not self.schemas.decls and not self.policy.active:
            ops = [
                (k, v, stamp)
                if type(k) is str and type(v) in _SCALARS and k in entries
                else validated(k, v)
                for k, v in mapping.items()
            ]
        else:
            ops = [validated(k, v) for k, v in mapping.items()]
        if odd:
            names = [op[0] for op in ops]
            twice = sorted({n for n in names if names.count(n) > 1})
            if twice:
                raise StateValueError(
                    f"update() names {', '.join(map(repr, twice))} twice (as a str and a Key?);"
                    " give each key once"
                )
        if not remove:
            return ops, expected
        written = {op[0] for op in ops}
        removed: set[str] = set()
        for key in _key_list(remove):
            name = check_key(key_name(key))
            self.check_remove(name, stamp)
            if name in written:
                raise StateValueError(
                    f"update() both writes and removes {name!r}; do one or the other"
                )
            if name not in removed:
                removed.add(name)
                ops.append((name, REMOVED, stamp))
        return ops, expected
