"""The Orchestrator protocol: how work is handed to agents, wherever they run.

``dispatch`` one call, ``dispatch_many`` several (results in input order, each failing on its
own), ``signal`` a running workflow (fire-and-forget: returns when accepted) and ``query`` it
(read-only JSON). Calling code must not know what is behind it: :class:`LocalOrchestrator`
runs agent functions in this process; a distributed one (a later issue) sends them elsewhere.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from pydantic import BaseModel, ConfigDict, JsonValue

from ..errors import DispatchError, OrchestrationError

__all__ = [
    "LocalOrchestrator",
    "Orchestrator",
    "QueryPayload",
    "SignalPayload",
]


class SignalPayload(BaseModel):
    """A message to a running workflow: its ``signal_type`` and ``data``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    signal_type: str
    data: JsonValue = None


class QueryPayload(BaseModel):
    """A read-only question to a running workflow: its ``query_type`` and ``params``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    query_type: str
    params: JsonValue = None


@runtime_checkable
class Orchestrator(Protocol):
    """Hands work to agents; see the module docs. ``dispatch`` raises :class:`DispatchError`
    for a failed call; ``dispatch_many`` returns it in that call's place instead."""

    async def dispatch(self, agent_id: str, input: JsonValue, /) -> JsonValue:
        """Run ``agent_id`` on ``input``; raises :class:`DispatchError` if it fails."""

    async def dispatch_many(
        self, tasks: Sequence[tuple[str, JsonValue]], /
    ) -> list[JsonValue | DispatchError]:
        """Run every ``(agent_id, input)``; results in input order, a failure in its place."""

    async def signal(self, workflow_id: str, signal: SignalPayload, /) -> None:
        """Send ``signal`` to a running workflow; returns once it is accepted."""

    async def query(self, workflow_id: str, query: QueryPayload, /) -> JsonValue:
        """Ask a running workflow ``query`` (read-only); returns its JSON answer."""


QueryHandler = Callable[[QueryPayload], JsonValue]


class _Workflow:
    def __init__(self, on_query: QueryHandler | None) -> None:
        self.on_query = on_query
        send, receive = anyio.create_memory_object_stream[SignalPayload](math.inf)
        self.send: MemoryObjectSendStream[SignalPayload] = send
        self.receive: MemoryObjectReceiveStream[SignalPayload] = receive


class LocalOrchestrator:
    """An :class:`Orchestrator` that runs agent functions in this process.

    ``agents`` maps ids to functions (sync or async) of the input returning JSON data.
    ``dispatch_many`` runs at most ``concurrency`` calls at once. Workflows that take signals
    and queries are registered with :meth:`register`; a workflow reads its signals with
    ``async for signal in orchestrator.signals(workflow_id)``.
    """

    def __init__(self, agents: Mapping[str, Callable[[Any], Any]], *, concurrency: int = 8) -> None:
        if type(concurrency) is not int or concurrency < 1:
            raise OrchestrationError(
                f"LocalOrchestrator: concurrency must be a whole number >= 1, got {concurrency!r}"
            )
        for name, fn in agents.items():
            if not callable(fn):
                raise OrchestrationError(f"LocalOrchestrator: agent {name!r} is not callable")
        self.agents = dict(agents)
        self.concurrency = concurrency
        self._workflows: dict[str, _Workflow] = {}

    async def dispatch(self, agent_id: str, input: JsonValue, /) -> JsonValue:
        """Run ``agent_id`` on ``input``; raises :class:`DispatchError` if it fails."""
        agent = self.agents.get(agent_id)
        if agent is None:
            known = ", ".join(sorted(self.agents)) or "none"
            raise DispatchError(agent_id, f"no agent {agent_id!r} (known: {known})")
        try:
            output = agent(input)
            if inspect.isawaitable(output):
                output = await output
        except Exception as exc:
            raise DispatchError(
                agent_id, f"agent {agent_id!r} failed: {type(exc).__name__}: {exc}"
            ) from exc
        return output  # type: ignore[no-any-return]

    async def dispatch_many(
        self, tasks: Sequence[tuple[str, JsonValue]], /
    ) -> list[JsonValue | DispatchError]:
        """Run every ``(agent_id, input)`` at once (``concurrency`` at a time); results come
        back in input order, a failed call's :class:`DispatchError` in its place."""
        work = list(tasks)
        results: list[JsonValue | DispatchError] = [None] * len(work)
        limiter = anyio.CapacityLimiter(self.concurrency)

        async def one(i: int, agent_id: str, input: JsonValue) -> None:
            async with limiter:
                try:
                    results[i] = await self.dispatch(agent_id, input)
                except DispatchError as exc:
                    results[i] = exc

        async with anyio.create_task_group() as tg:
            for i, (agent_id, input) in enumerate(work):
                tg.start_soon(one, i, agent_id, input)
        return results

    def register(self, workflow_id: str, *, on_query: QueryHandler | None = None) -> None:
        """Make ``workflow_id`` known, so it can be signalled (and queried, with
        ``on_query``)."""
        if type(workflow_id) is not str or not workflow_id:
            raise OrchestrationError(f"a workflow id is a non-empty string, got {workflow_id!r}")
        if workflow_id in self._workflows:
            raise OrchestrationError(f"workflow {workflow_id!r} is already registered")
        self._workflows[workflow_id] = _Workflow(on_query)

    def _workflow(self, workflow_id: str) -> _Workflow:
        workflow = self._workflows.get(workflow_id)
        if workflow is None:
            known = ", ".join(sorted(self._workflows)) or "none"
            raise OrchestrationError(
                f"no workflow {workflow_id!r} is registered (known: {known}); register it first"
            )
        return workflow

    async def signal(self, workflow_id: str, signal: SignalPayload, /) -> None:
        """Queue ``signal`` for the workflow; returns as soon as it is accepted."""
        if not isinstance(signal, SignalPayload):
            raise OrchestrationError(f"signal takes a SignalPayload, got {signal!r}")
        self._workflow(workflow_id).send.send_nowait(signal)

    def signals(self, workflow_id: str) -> MemoryObjectReceiveStream[SignalPayload]:
        """The workflow's incoming signals, in the order they were accepted."""
        return self._workflow(workflow_id).receive

    def unregister(self, workflow_id: str) -> None:
        """Forget ``workflow_id``: signals to it are refused from now on, and its stream ends
        (after the signals already accepted)."""
        workflow = self._workflows.pop(workflow_id, None)
        if workflow is not None:
            workflow.send.close()
            workflow.receive.close()

    def close(self) -> None:
        """Unregister every workflow."""
        for workflow_id in list(self._workflows):
            self.unregister(workflow_id)

    async def query(self, workflow_id: str, query: QueryPayload, /) -> JsonValue:
        """Ask the workflow's ``on_query`` handler (read-only)."""
        workflow = self._workflow(workflow_id)
        if workflow.on_query is None:
            raise OrchestrationError(f"workflow {workflow_id!r} answers no queries")
        return workflow.on_query(query)
