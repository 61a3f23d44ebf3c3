"""Governance for the State: policy rules, secrets and declared types.

A part of the :class:`~slateflow.state.State` façade (a mixin): the rules live in the engine's
:class:`Policy` and :class:`Schemas`, which validation reads at every write.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ..errors import SchemaError, UsageError
from .facade import Facade
from .keys import Key, check_key, key_name
from .policy import Policy, Rule, name_set
from .schema import Schemas
from .sealing import SealedStore
from .values import plain

if TYPE_CHECKING:
    pass

__all__ = ["Governance"]

log = logging.getLogger("slateflow.state")


class Governance(Facade):
    """Rules for writes: ``policy``, ``is_secret`` and ``declare``."""

    if TYPE_CHECKING:  # Persistence's, a sibling part of the State

        @property
        def durable(self) -> bool: ...

    def policy(
        self,
        pattern: str | None = None,
        *,
        read_only: bool = False,
        sources: Iterable[str] | None = None,
        writers: Iterable[str] | None = None,
        max_bytes: int | None = None,
        secret: bool = False,
        max_keys: int | None = None,
    ) -> Policy:
        """Add a governance rule for ``pattern`` (and/or set ``max_keys``); returns the policy.

        ``state.policy("verify:*", writers=["verify"])`` lets only the ``verify`` resolver write
        its keys; ``state.policy("user:card", secret=True)`` masks a value wherever the state is
        shown. Rules govern later writes; existing values are not re-checked.
        """
        if pattern is None and (read_only or sources or writers or max_bytes or secret):
            given = [
                name
                for name, value in (
                    ("read_only", read_only),
                    ("sources", sources),
                    ("writers", writers),
                    ("max_bytes", max_bytes),
                    ("secret", secret),
                )
                if value
            ]
            raise UsageError(
                f"policy({', '.join(f'{g}=...' for g in given)}) names no key: give the key or "
                "pattern it governs, e.g. state.policy('booking:*', read_only=True)"
            )
        with self._lock:
            if max_keys is not None:
                self._policy.max_keys = max_keys
            if pattern is not None:
                self._policy.add(
                    Rule(
                        pattern,
                        read_only=read_only,
                        sources=name_set(sources),
                        writers=name_set(writers),
                        max_bytes=max_bytes,
                        secret=secret,
                    )
                )
        if secret and self.durable and not isinstance(self._engine.store, SealedStore):
            log.warning(
                "secret values of %r will be stored in clear in %s: open it with "
                "State.open(path, encryption_key=...) to encrypt them",
                pattern,
                getattr(self._engine.store, "path", "the store"),
            )
        return self._policy

    def is_secret(self, key: str | Key[Any]) -> bool:
        """Whether ``key`` is marked secret by the policy."""
        return self._secret(check_key(key_name(key)))

    def declare(self, key: str | Key[Any], type_: Any = None) -> None:
        """Declare the type of a key or ``*`` pattern; later writes are validated against it.

        ``state.declare("booking:party_size", int)``, ``state.declare("*:result", str)``, or
        ``state.declare(BOOKING)`` for a :class:`Key`. The most specific declaration matching a
        key wins. Values already stored under it must match, or :class:`SchemaError` lists them
        and nothing is declared.
        """
        decl = self._engine.schemas.add(key, type_)
        with self._lock:
            self._engine.schemas.activate(decl)
            bad = []
            try:
                # Only keys this declaration wins are checked: a more specific one still
                # governs the others.
                for name, row in self._entries.items():
                    if decl.pattern.matches(name) and self._engine.schemas.find(name) is decl:
                        try:
                            Schemas.check(decl, name, plain(row[0]), secret=self._secret(name))
                        except SchemaError as exc:
                            bad.append(str(exc))
            except BaseException:
                self._engine.schemas.deactivate(decl)
                raise
            if bad:
                self._engine.schemas.deactivate(decl)
                raise SchemaError(
                    f"cannot declare {decl.pattern.text!r}: {len(bad)} stored value(s) do not "
                    "match; fix or remove them first:\n" + "\n".join(bad)
                )
