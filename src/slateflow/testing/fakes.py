"""Fake sources for tests: agents and fetches that answer from a script and record every call.

``Resolver.agent("verify", fake_agent(returns="ok"))`` and ``Resolver.fetch("availability",
fake_fetch(script=[{"open": False}, {"open": True}]))`` behave like the real sources: the
resolver writes ``<name>:result`` or ``<name>:error`` with provenance, in any mode. A fake with
neither ``returns``, ``raises`` nor ``script`` holds every call until the test completes it
(``fake.complete(value)`` / ``fake.fail(error)``), which is how a test plays a slow backend.
"""

from __future__ import annotations

import inspect
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import anyio

from ..errors import FakeScriptError
from ..resolve.clock import SYSTEM_CLOCK, Clock
from ..state import State

__all__ = ["Fake", "FakeCall", "fake_agent", "fake_fetch"]

_UNSET: Any = object()


@dataclass(frozen=True, slots=True)
class FakeCall:
    """One call of a fake: its number (from 1), the State's cursor and every key's version then.

    ``versions`` tells a test exactly what the source saw: ``call.versions["booking:date"]``
    is the version of the date when the fake was called (missing keys are absent).
    """

    number: int
    cursor: int
    versions: dict[str, int]

    def saw(self, key: str) -> bool:
        """Whether ``key`` was set when the fake was called."""
        return key in self.versions


class _Held:
    __slots__ = ("error", "event", "value")

    def __init__(self) -> None:
        self.event = anyio.Event()
        self.value: Any = _UNSET
        self.error: BaseException | None = None


class Fake:
    """A scripted source; build one with :func:`fake_agent` or :func:`fake_fetch`.

    Call it like a fetch function (``await fake(state)``) or an agent (``await fake.run(state)``).
    ``calls`` records each call; ``held`` counts the calls waiting for :meth:`complete` or
    :meth:`fail`. Each call, in order: wait ``delay`` seconds on ``clock``; then take the next
    ``script`` entry if there is a script (a value is returned, an exception raised, a callable
    called with the state, sync or async), else raise ``raises``, else return ``returns``, else
    hold until the test completes it. A script that runs out raises :class:`FakeScriptError`.
    """

    def __init__(
        self,
        kind: str,
        *,
        returns: Any = _UNSET,
        raises: BaseException | type[BaseException] | None = None,
        delay: float = 0.0,
        script: Iterable[Any] | None = None,
        clock: Clock | None = None,
        label: str | None = None,
    ) -> None:
        chosen = [
            name
            for name, given in (
                ("returns", returns is not _UNSET),
                ("raises", raises is not None),
                ("script", script is not None),
            )
            if given
        ]
        if len(chosen) > 1:
            raise ValueError(f"{kind}: give one of returns=, raises= or script=, not {chosen}")
        if (
            not isinstance(delay, int | float)
            or isinstance(delay, bool)
            or not 0 <= delay < float("inf")
        ):
            raise ValueError(
                f"{kind}: delay must be a finite number of seconds >= 0, got {delay!r}"
            )
        self.kind = kind
        self.label = label or kind
        self.returns = returns
        self.raises = raises
        self.delay = float(delay)
        self.script: deque[Any] | None = deque(script) if script is not None else None
        self._scripted = 0 if script is None else len(self.script or ())
        self.clock = clock if clock is not None else SYSTEM_CLOCK
        self.calls: list[FakeCall] = []
        self._held: deque[_Held] = deque()

    @property
    def call_count(self) -> int:
        """How many times the fake was called."""
        return len(self.calls)

    @property
    def held(self) -> int:
        """Calls waiting for :meth:`complete` or :meth:`fail`."""
        return sum(1 for h in self._held if not h.event.is_set())

    def complete(self, value: Any) -> None:
        """Answer the oldest held call with ``value``; raises :class:`FakeScriptError` if no
        call is waiting."""
        self._answer(value, None)

    def fail(self, error: BaseException | str) -> None:
        """Make the oldest held call raise ``error`` (a message becomes a ``RuntimeError``)."""
        self._answer(_UNSET, RuntimeError(error) if isinstance(error, str) else error)

    def _answer(self, value: Any, error: BaseException | None) -> None:
        while self._held and self._held[0].event.is_set():
            self._held.popleft()
        if not self._held:
            raise FakeScriptError(
                f"{self.label}: no call is waiting to be answered ({self.call_count} call(s) so "
                "far); start the resolver first, or give the fake returns=/script="
            )
        held = self._held.popleft()
        held.value, held.error = value, error
        held.event.set()

    def _record(self, state: State) -> None:
        versions = state.engine.versions()  # one consistent view, even while others write
        self.calls.append(FakeCall(len(self.calls) + 1, state.journal.cursor, versions))

    async def __call__(self, state: State) -> Any:
        self._record(state)
        if self.delay:
            await self.clock.sleep(self.delay)
        if self.script is not None:
            if not self.script:
                raise FakeScriptError(
                    f"{self.label} was called {self.call_count} times but its script has "
                    f"{self._scripted} entr{'y' if self._scripted == 1 else 'ies'}; add entries "
                    "for every call the test makes"
                )
            return await _play(self.script.popleft(), state)
        if self.raises is not None:
            raise self.raises
        if self.returns is not _UNSET:
            return self.returns
        held = _Held()
        self._held.append(held)
        try:
            await held.event.wait()
        finally:
            if not held.event.is_set():  # cancelled (superseded, session closed): not waiting
                self._held.remove(held)
        if held.error is not None:
            raise held.error
        return held.value

    async def run(self, state: State) -> Any:
        """The agent form (``TextAgent.run``): the same as calling the fake."""
        return await self(state)

    def __repr__(self) -> str:
        return f"<{self.label}: {self.call_count} call(s), {self.held} held>"


async def _play(entry: Any, state: State) -> Any:
    if isinstance(entry, BaseException) or (
        isinstance(entry, type) and issubclass(entry, BaseException)
    ):
        raise entry
    if callable(entry):
        out = entry(state)
        return await out if inspect.isawaitable(out) else out
    return entry


def fake_agent(
    *,
    returns: str | None = None,
    raises: BaseException | type[BaseException] | None = None,
    delay: float = 0.0,
    script: Iterable[str | BaseException | Callable[[State], Any]] | None = None,
    clock: Clock | None = None,
) -> Fake:
    """A fake sub-agent for ``Resolver.agent(name, fake_agent(...))``.

    ``delay`` waits on ``clock`` (pass the session's ``ManualClock``: the call then finishes
    only when the test advances it). With no ``returns``/``raises``/``script`` every call is
    held until ``fake.complete(text)``.
    """
    return Fake(
        "fake_agent",
        returns=_UNSET if returns is None else returns,
        raises=raises,
        delay=delay,
        script=script,
        clock=clock,
    )


def fake_fetch(
    *,
    returns: Any = _UNSET,
    raises: BaseException | type[BaseException] | None = None,
    delay: float = 0.0,
    script: Iterable[Any] | None = None,
    clock: Clock | None = None,
) -> Fake:
    """A fake fetch for ``Resolver.fetch(name, fake_fetch(...))`` (any JSON value, even None).

    Same rules as :func:`fake_agent`.
    """
    return Fake(
        "fake_fetch", returns=returns, raises=raises, delay=delay, script=script, clock=clock
    )
