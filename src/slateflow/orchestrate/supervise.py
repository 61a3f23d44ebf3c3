"""Supervised long-lived agents: a hierarchy, handles to talk to them, restart policies.

``AgentOrchestrator`` registers agents by name (``add_agent``, ``add_child`` under a parent),
each with a factory that builds a fresh agent (an object with ``async prompt(messages)``).
``spawn(name)`` starts one in the orchestrator's task group and returns an
:class:`OrchestratedHandle`: ``await handle.send_message(text)`` asks it and waits for its
answer; ``await handle.await_result()`` ends it; ``handle.cancel()`` stops it and, unlike the
Rust original, every running descendant too.

When a prompt fails, the :class:`SupervisorPolicy` decides: ``restart`` (a fresh agent from the
factory; the caller still gets the error), ``stop`` (the agent ends, failed) or ``escalate``
(the caller gets the error, the agent goes on). :class:`DefaultSupervisor` restarts retryable
errors up to ``max_restarts`` consecutive failures (a success resets the count) and stops on
anything else. Without a policy, errors escalate.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from enum import StrEnum
from types import TracebackType
from typing import Any, Protocol, runtime_checkable

import anyio
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from ..errors import OrchestrationError, SupervisionError

__all__ = [
    "AgentOrchestrator",
    "AgentStatus",
    "DefaultSupervisor",
    "OrchestratedHandle",
    "PromptAgent",
    "SupervisorAction",
    "SupervisorPolicy",
    "is_retryable",
]

log = logging.getLogger("slateflow.orchestrate")


@runtime_checkable
class PromptAgent(Protocol):
    """A long-lived agent: ``async prompt(messages) -> result``."""

    async def prompt(self, messages: Sequence[str], /) -> Any:
        """Handle one prompt; the answer goes back to whoever sent it."""


class SupervisorAction(StrEnum):
    """What to do about a failed prompt."""

    RESTART = "restart"
    STOP = "stop"
    ESCALATE = "escalate"


class SupervisorPolicy(Protocol):
    """Decides about an agent's error: ``on_agent_error(name, error) -> SupervisorAction``."""

    def on_agent_error(self, name: str, error: BaseException, /) -> SupervisorAction:
        """What to do about an agent that failed: restart it, escalate or give up."""


def is_retryable(error: BaseException) -> bool:
    """Whether an error is worth a restart: its ``retryable`` attribute when it has one, else
    timeouts and connection errors."""
    flag = getattr(error, "retryable", None)
    if isinstance(flag, bool):
        return flag
    return isinstance(error, TimeoutError | ConnectionError)


class DefaultSupervisor:
    """Restart retryable errors (:func:`is_retryable`), stop on the rest. The orchestrator
    allows ``max_restarts`` consecutive restarts; one more failure stops the agent."""

    def __init__(self, max_restarts: int = 3) -> None:
        if type(max_restarts) is not int or max_restarts < 0:
            raise OrchestrationError(
                f"max_restarts must be a whole number >= 0, got {max_restarts!r}"
            )
        self.max_restarts = max_restarts

    def on_agent_error(self, name: str, error: BaseException, /) -> SupervisorAction:
        """Restart a retryable failure (up to the limit, with backoff), give up on the rest."""
        return SupervisorAction.RESTART if is_retryable(error) else SupervisorAction.STOP


class AgentStatus(StrEnum):
    """Where a spawned agent stands."""

    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


class _Request:
    __slots__ = ("done", "error", "messages", "result")

    def __init__(self, messages: list[str]) -> None:
        self.messages = messages
        self.done = anyio.Event()
        self.result: Any = None
        self.error: BaseException | None = None


class _Entry:
    __slots__ = ("children", "factory", "max_restarts", "parent")

    def __init__(
        self, factory: Callable[[], PromptAgent], parent: str | None, max_restarts: int
    ) -> None:
        self.factory = factory
        self.parent = parent
        self.children: list[str] = []
        self.max_restarts = max_restarts


class OrchestratedHandle:
    """A spawned agent: talk to it, end it, cancel it, read its status."""

    def __init__(self, orchestrator: AgentOrchestrator, name: str) -> None:
        self.name = name
        self._orchestrator = orchestrator
        send, receive = anyio.create_memory_object_stream[_Request](math.inf)
        self._send: MemoryObjectSendStream[_Request] = send
        self._receive: MemoryObjectReceiveStream[_Request] = receive
        self._scope = anyio.CancelScope()
        self._ended = anyio.Event()
        self.status = AgentStatus.RUNNING
        """``running``, then ``completed``, ``failed`` or ``cancelled``."""
        self.error: BaseException | None = None
        """Why it failed, when it did."""
        self.restarts = 0
        """Restarts so far in a row (a success resets it)."""

    @property
    def is_done(self) -> bool:
        """Whether it has ended (completed, failed or cancelled)."""
        return self.status is not AgentStatus.RUNNING

    async def send_message(self, text: str) -> Any:
        """Ask the agent ``text`` and wait for its answer (its error is raised)."""
        return await self.send_messages([text])

    async def send_messages(self, messages: Sequence[str]) -> Any:
        """Ask the agent ``messages`` and wait for its answer (its error is raised)."""
        if self.is_done:
            raise SupervisionError(f"agent {self.name!r} has ended ({self.status.value})")
        request = _Request(list(messages))
        try:
            self._send.send_nowait(request)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            raise SupervisionError(f"agent {self.name!r} takes no more messages") from None
        await request.done.wait()
        if request.error is not None:
            raise request.error
        return request.result

    async def await_result(self) -> AgentStatus:
        """Take no more messages, let the agent finish what it was asked, and wait for it to
        end; returns its final status (raises :class:`SupervisionError` if it failed)."""
        self._send.close()
        await self._ended.wait()
        if self.status is AgentStatus.FAILED:
            raise SupervisionError(f"agent {self.name!r} failed: {self.error!r}") from self.error
        return self.status

    def cancel(self) -> None:
        """Stop the agent now, and every running agent below it in the hierarchy."""
        self._scope.cancel()
        self._send.close()
        for child in self._orchestrator._running_children(self.name):
            child.cancel()

    async def _run(self, entry: _Entry, supervisor: SupervisorPolicy | None) -> None:
        final = AgentStatus.COMPLETED
        try:
            with self._scope:
                agent = entry.factory()
                # The stream is drained and closed by _fail_waiting, below.
                async for request in self._receive:
                    try:
                        request.result = await agent.prompt(request.messages)
                        self.restarts = 0
                    except anyio.get_cancelled_exc_class():
                        request.error = SupervisionError(f"agent {self.name!r} was cancelled")
                        raise
                    except Exception as exc:
                        request.error = exc
                        if self._supervise(exc, entry, supervisor):
                            agent = entry.factory()
                        elif self.error is not None:
                            final = AgentStatus.FAILED
                            break
                    finally:
                        request.done.set()
            if self._scope.cancelled_caught:
                final = AgentStatus.CANCELLED
        finally:
            self._fail_waiting(final)
            self.status = final
            self._ended.set()

    def _supervise(
        self, exc: BaseException, entry: _Entry, supervisor: SupervisorPolicy | None
    ) -> bool:
        """Apply the policy to a failed prompt: True to restart; sets ``error`` to stop."""
        action = (
            SupervisorAction.ESCALATE
            if supervisor is None
            else supervisor.on_agent_error(self.name, exc)
        )
        if action is SupervisorAction.RESTART and self.restarts < entry.max_restarts:
            self.restarts += 1
            log.warning(
                "agent %r: restart %d of %d after %r",
                self.name,
                self.restarts,
                entry.max_restarts,
                exc,
            )
            return True
        if action is not SupervisorAction.ESCALATE:
            self.error = exc
        return False

    def _fail_waiting(self, final: AgentStatus) -> None:
        # Requests still queued when the agent ends get an answer too: nobody waits for ever.
        self._send.close()
        while True:
            try:
                request = self._receive.receive_nowait()
            except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                break
            request.error = SupervisionError(f"agent {self.name!r} ended ({final.value})")
            request.done.set()
        self._receive.close()

    def __repr__(self) -> str:
        return f"<OrchestratedHandle {self.name!r} {self.status.value}>"


class AgentOrchestrator:
    """Supervised agents in a hierarchy; use as ``async with AgentOrchestrator(...) as orch``
    (the agents it spawns run in its task group and are cancelled when the block ends)."""

    def __init__(
        self, *, supervisor: SupervisorPolicy | None = None, max_restarts: int = 3
    ) -> None:
        if type(max_restarts) is not int or max_restarts < 0:
            raise OrchestrationError(
                f"max_restarts must be a whole number >= 0, got {max_restarts!r}"
            )
        self.supervisor = supervisor
        self.max_restarts = (
            supervisor.max_restarts if isinstance(supervisor, DefaultSupervisor) else max_restarts
        )
        self._entries: dict[str, _Entry] = {}
        self._handles: dict[str, list[OrchestratedHandle]] = {}
        self._tg: TaskGroup | None = None

    async def __aenter__(self) -> AgentOrchestrator:
        tg = anyio.create_task_group()
        await tg.__aenter__()
        self._tg = tg
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        assert self._tg is not None
        for handles in self._handles.values():
            for handle in handles:
                handle.cancel()
        try:
            return await self._tg.__aexit__(exc_type, exc, tb)
        finally:
            self._tg = None

    # -- the hierarchy ---------------------------------------------------------------------------

    def _add(self, name: str, factory: Callable[[], PromptAgent], parent: str | None) -> None:
        if type(name) is not str or not name:
            raise OrchestrationError(f"an agent name is a non-empty string, got {name!r}")
        if name in self._entries:
            raise OrchestrationError(f"agent {name!r} is already registered")
        if parent is not None and parent not in self._entries:
            raise OrchestrationError(
                f"parent agent {parent!r} of {name!r} is not registered; add it first"
            )
        if not callable(factory):
            raise OrchestrationError(f"agent {name!r}: the factory must be callable")
        self._entries[name] = _Entry(factory, parent, self.max_restarts)
        if parent is not None:
            self._entries[parent].children.append(name)

    def add_agent(self, name: str, factory: Callable[[], PromptAgent]) -> None:
        """Register a top-level agent; ``factory()`` builds a fresh one (also on restart)."""
        self._add(name, factory, None)

    def add_child(self, name: str, parent: str, factory: Callable[[], PromptAgent]) -> None:
        """Register an agent under ``parent`` (which must be registered)."""
        self._add(name, factory, parent)

    def parent_of(self, name: str) -> str | None:
        """The parent's name, or None."""
        entry = self._entries.get(name)
        return entry.parent if entry is not None else None

    def children_of(self, name: str) -> list[str] | None:
        """The children's names in the order added, or None for an unknown agent."""
        entry = self._entries.get(name)
        return list(entry.children) if entry is not None else None

    def names(self) -> list[str]:
        """Every registered agent's name, in the order registered."""
        return list(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def _running_children(self, name: str) -> list[OrchestratedHandle]:
        entry = self._entries.get(name)
        if entry is None:
            return []
        return [
            handle
            for child in entry.children
            for handle in self._handles.get(child, [])
            if not handle.is_done
        ]

    # -- running -----------------------------------------------------------------------------------

    def spawn(self, name: str) -> OrchestratedHandle:
        """Start agent ``name``; returns its handle."""
        if self._tg is None:
            raise OrchestrationError(
                "spawn needs a running orchestrator: use `async with AgentOrchestrator() as orch`"
            )
        entry = self._entries.get(name)
        if entry is None:
            known = ", ".join(self._entries) or "none"
            raise OrchestrationError(f"agent {name!r} is not registered (registered: {known})")
        handle = OrchestratedHandle(self, name)
        self._handles.setdefault(name, []).append(handle)
        self._tg.start_soon(handle._run, entry, self.supervisor, name=f"slateflow:agent:{name}")
        return handle

    def __repr__(self) -> str:
        return f"<AgentOrchestrator {self.names()}>"
