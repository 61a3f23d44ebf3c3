"""Tool calls that claim their admission: no check-then-act between a reply's concurrent calls.

Voice frameworks run the tool calls of one model reply concurrently. Asking ``admit(tool)``
and reporting ``tool_ok(tool)`` afterwards lets two calls of a ``once`` tool both pass the check
before either reports (two bookings). A :class:`ToolDesk` closes that gap:

* :meth:`ToolDesk.claim` admits a call and, for a tool that may succeed only once (``once``,
  ``commit``), holds the tool until the call ends: a second call waits, then is admitted or
  refused on what the first came to (refused after a success, admitted after a failure).
* :meth:`ToolDesk.run` runs a tool through a claim, and lets identical concurrent calls (same
  tool, same canonical arguments) share one execution, each caller getting its result. Models
  routinely emit the same call twice in one reply.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from contextlib import asynccontextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import anyio

from .. import tracing
from ..errors import SessionError, ToolCallError
from ..flow import Admission
from ..resolve.sections import entered, inside
from ..state.keys import unprintable
from .protocols import Governor

__all__ = ["ToolClaim", "ToolDesk", "ToolFailed", "ToolResult", "admit_all"]


class ToolClaim(Admission):
    """An admitted (or refused) call of ``tool`` held for as long as it runs, yielded by
    ``conversation.claim(tool)``: its :class:`~slateflow.flow.Admission` (true when the call
    may go ahead; ``reason`` the refusal for the model or, in observe mode, the would-be
    refusal of an admitted ``violation``; ``once``).

    Leaving the ``async with`` block without an exception reports the tool as successful
    (``tool_ok``) unless :meth:`fail` was called; an exception reports nothing.
    """

    __slots__ = ("_failed",)
    _failed: bool

    def __init__(self, admission: Admission) -> None:
        super().__init__(
            admission.tool,
            admission.allowed,
            admission.reason,
            admission.violation,
            admission.once,
        )
        object.__setattr__(self, "_failed", False)

    def fail(self) -> None:
        """The tool ran but did not succeed (no table was free): do not count it as done, so a
        ``once`` tool may be called again."""
        object.__setattr__(self, "_failed", True)

    @property
    def failed(self) -> bool:
        """Whether :meth:`fail` was called."""
        return bool(self._failed)

    def __repr__(self) -> str:
        state = "admitted" if self.allowed else "refused"
        return f"<ToolClaim {self.tool!r} {state}{' (violation)' if self.violation else ''}>"


@dataclass(frozen=True, slots=True)
class ToolFailed:
    """What a tool's function returns when it ran but did not succeed ("no table free"):
    ``return ToolFailed("no table is free at 7")``. ``run_tool`` then reports the call as
    failed (a ``once`` tool may be called again) and hands ``value`` back, with
    ``failed=True``."""

    value: Any = None


@dataclass(frozen=True, slots=True)
class ToolResult:
    """What ``conversation.run_tool`` came to.

    ``allowed`` False: the call was refused and ``reason`` says why, for the model. Otherwise
    ``value`` is what the tool returned (unwrapped from :class:`ToolFailed`, with ``failed``
    True, when it ran but did not succeed); ``shared`` is True for a caller that got the
    result of an identical call already running, instead of running the tool again.
    """

    tool: str
    allowed: bool
    value: Any = None
    reason: str = ""
    shared: bool = False
    violation: bool = False
    failed: bool = False


@dataclass(slots=True)
class _Running:
    """One execution that identical calls share."""

    done: anyio.Event = field(default_factory=anyio.Event)
    result: ToolResult | None = None
    error: BaseException | None = None


class ToolDesk:
    """Claims and runs tool calls for one conversation (see the module docstring): ``admit``
    answers whether a tool may run now, ``succeeded`` reports a tool that ran."""

    def __init__(
        self,
        admit: Callable[[str], Admission],
        succeeded: Callable[[str], None],
        after: Callable[[str], Awaitable[None]],
    ) -> None:
        self._admit = admit
        self._succeeded = succeeded  # counts the tool as done: synchronous, cannot be cancelled
        self._after = after  # what runs after a success (the conversation's hooks)
        self._held: dict[str, anyio.Event] = {}  # once-only tools with a call in flight
        self._running: dict[tuple[str, str], _Running] = {}

    @asynccontextmanager
    async def claim(self, tool: str) -> AsyncIterator[ToolClaim]:
        """Admit a call of ``tool`` atomically; see :class:`ToolClaim`."""
        _check_tool(tool, "claim")
        while (held := self._held.get(tool)) is not None:
            if inside(held):
                raise SessionError(
                    f"tool {tool!r} was called from inside its own call: a once-only tool is "
                    "held until its call ends, so this call would wait for itself forever; "
                    "call the function directly, or give the inner call its own tool"
                )
            await held.wait()  # then decide on what that call came to
        # No await from here to the hold: nothing can slip between the check and the claim.
        claim = ToolClaim(self._admit(tool))
        if not claim.allowed:
            yield claim
            return
        release: anyio.Event | None = None
        if claim.once:
            release = self._held[tool] = anyio.Event()
        try:
            with entered(release) if release is not None else nullcontext():
                yield claim
            if not claim.failed:
                # The side effect happened: counted before anything can be cancelled (no lock
                # is waited for under a shield: that could wedge the call).
                self._succeeded(tool)
        finally:
            if release is not None:
                del self._held[tool]
                release.set()
        if not claim.failed:
            await self._after(tool)

    async def run(
        self, tool: str, fn: Callable[..., Any], arguments: Mapping[str, Any] | None = None
    ) -> ToolResult:
        """Run ``fn(**arguments)`` as a call of ``tool`` under a claim; identical concurrent
        calls share one execution. See ``Conversation.run_tool``."""
        _check_tool(tool, "run_tool")
        if not callable(fn):
            raise TypeError(f"run_tool({tool!r}) takes the tool's function, got {fn!r}")
        if arguments is not None and not isinstance(arguments, Mapping):
            raise TypeError(
                f"run_tool({tool!r}) takes the arguments as a mapping of names to values, "
                f"got {type(arguments).__name__}"
            )
        args = dict(arguments or {})
        identity = _identity(tool, args)
        if identity is None:  # not plain data: it cannot be told equal to another call's
            return await self._execute(tool, fn, args, _Running())
        key = (tool, identity)
        running = self._running.get(key)
        if running is not None:
            if inside(running):
                raise SessionError(
                    f"tool {tool!r} was called from inside its own call with the same "
                    "arguments: it would share its own result and wait for itself forever"
                )
            await running.done.wait()
            return _shared(tool, running)
        running = self._running[key] = _Running()
        try:
            return await self._execute(tool, fn, args, running)
        finally:
            del self._running[key]

    async def _execute(
        self, tool: str, fn: Callable[..., Any], args: dict[str, Any], running: _Running
    ) -> ToolResult:
        try:
            async with self.claim(tool) as claim:
                if not claim:
                    running.result = ToolResult(tool, False, reason=claim.reason)
                else:
                    with entered(running):
                        value = fn(**args)
                        if inspect.isawaitable(value):
                            value = await value
                    failed = type(value) is ToolFailed
                    if failed:
                        claim.fail()
                        value = value.value
                    running.result = ToolResult(
                        tool,
                        True,
                        value,
                        reason=claim.reason,
                        violation=claim.violation,
                        failed=failed,
                    )
        except BaseException as exc:
            running.error = exc
            raise
        finally:
            running.done.set()
        assert running.result is not None
        return running.result


def admit_all(flows: Iterable[Governor], tool: str, record: bool) -> Admission:
    """Whether every flow admits ``tool`` (the first refusal wins, with its reason); an
    observe-mode breach is admitted, flagged ``violation``."""
    flagged = ""
    once = False
    verdict: Admission | None = None
    for flow in flows:
        admission = flow.admit(tool, record=record)
        once = once or admission.once
        if not admission.allowed:
            verdict = Admission(tool, False, admission.reason, once=once)
            break
        if admission.violation and not flagged:
            flagged = admission.reason
    if verdict is None:
        verdict = Admission(tool, True, flagged, violation=bool(flagged), once=once)
    if record and tracing.current is not None:
        tracing.current.admission(tool, verdict.allowed, verdict.reason or None)
    return verdict


def _shared(tool: str, running: _Running) -> ToolResult:
    if running.result is not None and running.error is None:
        r = running.result
        return ToolResult(tool, r.allowed, r.value, r.reason, True, r.violation, r.failed)
    error = running.error
    if error is None or isinstance(error, anyio.get_cancelled_exc_class()):
        raise ToolCallError(
            f"tool {tool!r}: the identical call this one shared was cancelled before it "
            "finished; call it again"
        )
    raise ToolCallError(
        f"tool {tool!r} failed in the identical call this one shared: {error!r}"
    ) from error


class _NotData(Exception):
    pass


def _not_data(value: object) -> Any:
    raise _NotData


def _identity(tool: str, args: dict[str, Any]) -> str | None:
    """The arguments as canonical JSON text (equal for arguments equal as data, key order
    aside), or None when they hold a value that is not plain data (an object, NaN): such a
    call is never taken for another. Raises ``ToolCallError`` for arguments no data can hold
    (a cycle, an int over 4,300 digits, a dict key that is not a string)."""
    try:
        return json.dumps(
            args, sort_keys=True, separators=(",", ":"), allow_nan=False, default=_not_data
        )
    except _NotData:
        return None
    except ValueError as exc:
        if "float" in str(exc):  # NaN or infinity: not equal to itself as data
            return None
        why = str(exc)
    except (TypeError, RecursionError) as exc:
        why = str(exc) or type(exc).__name__
    raise ToolCallError(
        f"tool {tool!r}: its arguments cannot be read as data ({why}); pass JSON-like values: "
        "dicts with string keys, lists, strings, numbers (ints under 4,300 digits), no cycles"
    ) from None


def _check_tool(tool: object, what: str) -> None:
    if type(tool) is not str or not tool or unprintable(tool):
        raise SessionError(
            f"{what} takes the tool's name (a non-empty str with no invisible characters), "
            f"got {tool!r}"
        )
