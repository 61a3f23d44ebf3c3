"""Governance for the State: policy rules, secrets and declared types.

``state.policy(...)`` and ``state.declare(...)`` call these: the rules live in the engine's
:class:`Policy` and :class:`Schemas`, which validation reads at every write.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from ..errors import SchemaError, UsageError
from .engine import Engine
from .keys import Key
from .policy import Policy, Rule, name_set
from .provenance import Stamp
from .schema import Schemas
from .sealing import SealedStore
from .values import plain

__all__ = ["SECRET_KEYS", "add_rule", "declare", "record_secrets"]

SECRET_KEYS = "policy:secret"
"""Where a State with a store records the patterns of its secret keys, so that a file read
without the code that declared them (``slateflow replay``) still masks them."""

log = logging.getLogger("slateflow.state")


def add_rule(
    engine: Engine,
    pattern: str | None,
    *,
    read_only: bool,
    sources: Iterable[str] | None,
    writers: Iterable[str] | None,
    max_bytes: int | None,
    secret: bool,
    max_keys: int | None,
) -> Policy:
    """Add a rule for ``pattern`` (and/or set ``max_keys``) to the engine's policy."""
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
    if pattern is None and given:
        raise UsageError(
            f"policy({', '.join(f'{g}=...' for g in given)}) names no key: give the key or "
            "pattern it governs, e.g. state.policy('booking:*', read_only=True)"
        )
    policy = engine.policy
    with engine.lock:
        if max_keys is not None:
            policy.max_keys = max_keys
        if pattern is not None:
            policy.add(
                Rule(
                    pattern,
                    read_only=read_only,
                    sources=name_set(sources),
                    writers=name_set(writers),
                    max_bytes=max_bytes,
                    secret=secret,
                )
            )
    store = engine.store
    if secret and store is not None and pattern is not None:
        _record_secret(engine, pattern)
    durable = store is not None and store.durability != "memory"
    if secret and isinstance(store, SealedStore):
        # Values written before the key was secret are in the file in clear: seal them now.
        resealed = store.reseal((pattern or "").split("*", 1)[0])
        if resealed:
            log.info("sealed %d stored record(s) of %r written in clear", resealed, pattern)
    elif secret and durable:
        log.warning(
            "secret values of %r will be stored in clear in %s: open it with "
            "State.open(path, encryption_key=...) to encrypt them",
            pattern,
            getattr(store, "path", "the store"),
        )
    return policy


def _record_secret(engine: Engine, *patterns: str) -> None:
    row = engine.entries.get(SECRET_KEYS)
    known = list(row[0]) if row is not None and isinstance(row[0], list | tuple) else []
    new = [p for p in dict.fromkeys(patterns) if p not in known]
    if not new:
        return
    stamp = Stamp("policy", "state", None, None)
    engine.commit_owned({SECRET_KEYS: sorted([*known, *new])}, (), stamp, "policy")


def record_secrets(engine: Engine) -> None:
    """Record the secret patterns of a State opened on a store with a policy (see
    :data:`SECRET_KEYS`)."""
    if engine.store is not None:
        _record_secret(engine, *(r.pattern for r in engine.policy.rules if r.secret))


def declare(engine: Engine, key: str | Key[Any], type_: Any) -> None:
    """Declare the type of a key or pattern, after checking the values stored under it."""
    schemas = engine.schemas
    decl = schemas.add(key, type_)
    with engine.lock:
        schemas.activate(decl)
        bad = []
        try:
            # Only keys this declaration wins are checked: a more specific one still governs
            # the others.
            for name, row in engine.entries.items():
                if decl.pattern.matches(name) and schemas.find(name) is decl:
                    try:
                        Schemas.check(decl, name, plain(row[0]), secret=engine.secret(name))
                    except SchemaError as exc:
                        bad.append(str(exc))
        except BaseException:
            schemas.deactivate(decl)
            raise
        if bad:
            schemas.deactivate(decl)
            raise SchemaError(
                f"cannot declare {decl.pattern.text!r}: {len(bad)} stored value(s) do not "
                "match; fix or remove them first:\n" + "\n".join(bad)
            )
