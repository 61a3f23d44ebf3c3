"""A read-only ``Mapping`` view of the State, for templates that walk dotted names.

Template engines outside slateflow (pipecat Flows' ``{{ booking.date }}``, Jinja's
``{{ booking.date }}``, ``str.format_map``) read a mapping and walk into it with dots; state keys
are joined with ``:``. :class:`StateMapping` bridges the two: ``view["booking"]["date"]`` is the
value at ``booking:date``, and a dict value is walked into as it is. It reads the State live (a
value written later is seen by the next read), never writes, and shows a secret key's value as
the mask, so a template cannot leak it into a prompt.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from .records import SECRET_MASK

if TYPE_CHECKING:
    from .state import State

__all__ = ["StateMapping"]


class StateMapping(Mapping[str, Any]):
    """The State as nested mappings: one level per ``:``-separated key segment.

    ``StateMapping(state)["booking"]["date"]`` reads ``booking:date``; a key that is both a value
    and a prefix (``booking`` and ``booking:date``) reads as its value. Iterating yields the
    first segments under this view's ``prefix``. Secret keys read as ``"***"``.
    """

    __slots__ = ("_prefix", "_state")

    def __init__(self, state: State, prefix: str = "") -> None:
        if prefix and not prefix.endswith(":"):
            prefix += ":"
        self._state = state
        self._prefix = prefix

    def __getitem__(self, name: str) -> Any:
        if not isinstance(name, str) or not name or ":" in name:
            raise KeyError(name)
        key = self._prefix + name
        state = self._state
        if key in state:
            return SECRET_MASK if state.is_secret(key) else state.get(key)
        if state.keys(key + ":"):
            return StateMapping(state, key)
        raise KeyError(name)

    def __iter__(self) -> Iterator[str]:
        cut = len(self._prefix)
        return iter(
            dict.fromkeys(key[cut:].split(":", 1)[0] for key in self._state.keys(self._prefix))
        )

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __contains__(self, name: object) -> bool:
        try:
            self[name]  # type: ignore[index]
        except KeyError:
            return False
        return True

    def __repr__(self) -> str:
        return f"StateMapping({self._prefix or '*'}: {len(self)} names)"
