"""Governance: which keys are read-only or secret, who may write them, and how big they may get."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from ..errors import PolicyViolation, ReadOnlyError
from .keys import compile_pattern
from .provenance import Stamp
from .values import JSON, serialized_size

__all__ = ["Policy", "Rule", "name_set"]


def name_set(names: str | Iterable[str] | None) -> frozenset[str] | None:
    """``names`` as a frozenset; a lone string is one name, not a set of characters."""
    if names is None:
        return None
    return frozenset([names] if isinstance(names, str) else names)


@dataclass(frozen=True, slots=True)
class Rule:
    """One governance rule for the keys matching ``pattern`` (``*`` wildcards allowed).

    - ``read_only``: nobody may write or remove the keys.
    - ``sources`` / ``writers``: only writes whose provenance source / writer is in the set.
    - ``max_bytes``: cap on the value's size as compact UTF-8 JSON.
    - ``secret``: values are masked in ``repr``, logs, redacted snapshots and journal files.

    When several rules match a key, all of them apply (the strictest cap wins).
    """

    pattern: str
    read_only: bool = False
    sources: frozenset[str] | None = None
    writers: frozenset[str] | None = None
    max_bytes: int | None = None
    secret: bool = False

    def __post_init__(self) -> None:
        compile_pattern(self.pattern)  # raises InvalidKeyError for a bad pattern
        for field_name in ("sources", "writers"):
            names = getattr(self, field_name)
            if names is not None and not isinstance(names, frozenset):
                object.__setattr__(self, field_name, name_set(names))
        if self.max_bytes is not None and (type(self.max_bytes) is not int or self.max_bytes < 1):
            raise ValueError(f"max_bytes for {self.pattern!r} must be a positive int")


@dataclass(slots=True)
class _Effective:
    """Every rule matching one key, folded together."""

    read_only: str | None = None
    sources: list[tuple[str, frozenset[str]]] = field(default_factory=list)
    writers: list[tuple[str, frozenset[str]]] = field(default_factory=list)
    max_bytes: tuple[str, int] | None = None
    secret: bool = False


_NO_RULES = _Effective()


class Policy:
    """The governance rules of a state, plus limits on the number of keys and value size.

    Pass one to ``State(policy=...)`` or add rules later with ``state.policy(pattern, ...)``.
    A write that breaks a rule raises :class:`~slateflow.errors.PolicyViolation` (or its subclass
    :class:`~slateflow.errors.ReadOnlyError`) and writes nothing.
    """

    def __init__(
        self,
        rules: Iterable[Rule] = (),
        *,
        max_keys: int | None = None,
        max_value_bytes: int | None = None,
    ) -> None:
        self.rules: tuple[Rule, ...] = ()
        self.max_keys = max_keys
        self._max_value_bytes = max_value_bytes
        self._cache: dict[str, _Effective] = {}
        self.active = max_value_bytes is not None
        """Whether any rule or value-size cap exists (writes skip policy checks otherwise)."""
        for rule in rules:
            self.add(rule)

    @property
    def max_value_bytes(self) -> int | None:
        """A cap on every value's size as compact UTF-8 JSON, or None."""
        return self._max_value_bytes

    @max_value_bytes.setter
    def max_value_bytes(self, cap: int | None) -> None:
        self._max_value_bytes = cap
        self.active = bool(self.rules) or cap is not None

    def add(self, rule: Rule) -> Rule:
        """Add ``rule``; it governs every later write and masks matching keys from now on."""
        self.rules = (*self.rules, rule)
        self._cache = {}
        self.active = True
        return rule

    def for_key(self, key: str) -> _Effective:
        """The rules governing ``key``, folded (cached per key)."""
        # One read of the cache and the rules: a rule added meanwhile replaces the cache, and
        # what is folded here from the old rules must not land in the new cache.
        cache, rules = self._cache, self.rules
        eff = cache.get(key)
        if eff is not None:
            return eff
        eff = _NO_RULES
        for rule in rules:
            if not compile_pattern(rule.pattern).matches(key):
                continue
            if eff is _NO_RULES:
                eff = _Effective()
            if rule.read_only and eff.read_only is None:
                eff.read_only = rule.pattern
            if rule.sources is not None:
                eff.sources.append((rule.pattern, rule.sources))
            if rule.writers is not None:
                eff.writers.append((rule.pattern, rule.writers))
            if rule.max_bytes is not None and (
                eff.max_bytes is None or rule.max_bytes < eff.max_bytes[1]
            ):
                eff.max_bytes = (rule.pattern, rule.max_bytes)
            eff.secret = eff.secret or rule.secret
        if len(cache) > 100_000:
            cache.clear()
        cache[key] = eff
        return eff

    def is_secret(self, key: str) -> bool:
        """Whether ``key`` is marked secret."""
        return bool(self.rules) and self.for_key(key).secret

    def check(self, key: str, value: JSON, stamp: Stamp, *, removing: bool = False) -> None:
        """Raise if writing ``value`` (or removing) ``key`` with ``stamp`` breaks a rule."""
        eff = self.for_key(key) if self.rules else _NO_RULES
        if eff.read_only is not None:
            raise ReadOnlyError(
                f"{key!r} is read-only (policy rule for {eff.read_only!r}); "
                "write another key or change the policy"
            )
        for pattern, allowed in eff.sources:
            if stamp.source not in allowed:
                raise PolicyViolation(
                    f"source {stamp.source!r} may not write {key!r}: the policy for {pattern!r} "
                    f"allows sources {sorted(allowed)}; write it with one of those sources"
                )
        for pattern, allowed in eff.writers:
            if stamp.writer not in allowed:
                raise PolicyViolation(
                    f"writer {stamp.writer!r} (source {stamp.source!r}) may not write {key!r}: "
                    f"the policy for {pattern!r} allows writers {sorted(allowed)}; write it "
                    "from one of those writers or change the policy"
                )
        if removing:
            return
        cap = eff.max_bytes
        limit = self._max_value_bytes
        if limit is not None and (cap is None or limit < cap[1]):
            cap = ("*", limit)
        if cap is not None:
            size = serialized_size(value)
            if size > cap[1]:
                raise PolicyViolation(
                    f"value for {key!r} is {size} bytes as JSON, over the {cap[1]}-byte cap "
                    f"(policy for {cap[0]!r}); store less, or a reference to it"
                )

    def check_count(self, key: str, new_count: int) -> None:
        """Raise if creating ``key`` would take the state to ``new_count`` keys, over the cap."""
        if self.max_keys is not None and new_count > self.max_keys:
            raise PolicyViolation(
                f"cannot create {key!r}: the state is capped at {self.max_keys} keys "
                "(policy max_keys); remove keys (e.g. clear_prefix) or raise the cap"
            )
