"""RayExecutor: orchestrated steps run on a Ray cluster (extra ``slateflow[ray]``).

An :class:`~slateflow.orchestrate.AgentExecutor` like :class:`LocalExecutor`: the combinators
call ``execute_step(spec)`` and get a :class:`StepOutcome`, wherever the step ran.

- **A pool of async actors** by default: the agents are shipped to each actor once, when it
  starts, and each actor runs up to ``actor_concurrency`` steps at once on its event loop (a
  sync agent runs in a thread of its actor), so I/O-bound steps overlap. Steps go to the actor
  with the fewest in flight.
- **Tasks for CPU-bound agents** (``cpu_bound=[names]``): each step is a Ray task of its own
  (``task_options``, default one CPU), the agent shipped once to the object store.
- **Only JSON crosses back**: a step's spec goes out and its outcome comes back as JSON text;
  an answer that is not JSON is a failed outcome, as in :class:`LocalExecutor`.
- **Cancelling the awaiting task cancels the Ray work** (``ray.cancel``), then re-raises.
- **A worker or actor that dies is a failed outcome** for the steps it held (they may have run
  partly); other actors' steps are unaffected, and the dead actor is replaced for later steps.
  Ray's retries are off (``max_retries=0``): a call Ray reports as failed may have run anyway,
  so running it again is the caller's decision.
- Works on asyncio and trio: it waits on each object ref's ``future()``, not by awaiting the
  ref (which needs asyncio).

Ray must be started first (``ray.init(...)``, see docs/distributed.md on its token
authentication); the executor starts its actors on its first step and kills them on
:meth:`~RayExecutor.close`. A worker that writes into the call's State connects to it by id
with :func:`call_state` (the executor given ``call=state`` passes the call's address along with
each spec); a State object itself is never shipped into Ray.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import re
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel

from ..errors import OrchestrationError
from ..extras import require
from .local import AgentFunction, LocalExecutor, outcome_of
from .spec import AgentStepSpec, StepOutcome

if TYPE_CHECKING:
    from ..state.state import State

__all__ = ["CALL_METADATA", "RayExecutor", "call_state"]

CALL_METADATA = "slateflow.call"
"""The spec metadata entry holding the call's address (``url``, ``call_id``, ``prefix``)."""

_OPEN_CALLS = 32  # States a worker process keeps connected (least recently used closed first)


def _ray() -> Any:
    return require("ray", "ray", "slateflow.orchestrate.ray")


class _Host:
    """The actor: holds the agents and runs steps on its event loop (one per Ray actor)."""

    def __init__(self, agents: Mapping[str, AgentFunction]) -> None:
        self.runner = LocalExecutor(agents)

    async def run(self, spec_json: str) -> str:
        spec = AgentStepSpec.model_validate_json(spec_json)
        agent = self.runner.agents[spec.agent]
        if inspect.iscoroutinefunction(agent):
            outcome = await self.runner.execute_step(spec)
        else:
            # A sync agent would stop every other step of this actor while it runs.
            outcome = await asyncio.to_thread(_run, agent, spec)
        return outcome.model_dump_json()


def _run(agent: AgentFunction, spec: AgentStepSpec) -> StepOutcome:
    """``spec`` run with ``agent`` in this thread (an async agent on a loop of its own)."""
    if inspect.iscoroutinefunction(agent):
        return asyncio.run(LocalExecutor({spec.agent: agent}).execute_step(spec))
    try:
        answer = agent(spec)
        if inspect.isawaitable(answer):
            answer = asyncio.run(_awaited(answer))
    except Exception as exc:
        return StepOutcome.failed(spec, f"{type(exc).__name__}: {exc}")
    return outcome_of(spec, answer)


async def _awaited(answer: Awaitable[Any]) -> Any:
    return await answer


def _run_task(agent: AgentFunction, spec_json: str) -> str:
    """A CPU-bound step, as a Ray task."""
    return _run(agent, AgentStepSpec.model_validate_json(spec_json)).model_dump_json()


class _Slot:
    """One actor of the pool and how many steps it holds."""

    __slots__ = ("actor", "busy")

    def __init__(self, actor: Any) -> None:
        self.actor = actor
        self.busy = 0


class RayExecutor:
    """An :class:`AgentExecutor` running steps on Ray (see the module docstring).

    ``agents`` maps names to agent functions as for :class:`LocalExecutor` (they must be
    picklable by Ray's cloudpickle). ``actors`` async actors run ``actor_concurrency`` steps
    each; ``actor_options`` go to ``ActorClass.options`` (``num_cpus``, ``resources``,
    ``runtime_env``...). Agents named in ``cpu_bound`` run as tasks with ``task_options``
    (default ``{"num_cpus": 1}``). ``max_retries`` (default 0) is Ray's own retry count for
    tasks and actor calls; ``call``: a State shared on Redis whose address each spec carries,
    for :func:`call_state`. ``concurrency_hint`` is ``actors * actor_concurrency``.
    """

    def __init__(
        self,
        agents: Mapping[str, AgentFunction],
        *,
        actors: int = 2,
        actor_concurrency: int = 32,
        cpu_bound: Iterable[str] = (),
        actor_options: Mapping[str, Any] | None = None,
        task_options: Mapping[str, Any] | None = None,
        max_retries: int = 0,
        call: State | None = None,
    ) -> None:
        for name, value in (("actors", actors), ("actor_concurrency", actor_concurrency)):
            if type(value) is not int or value < 1:
                raise OrchestrationError(
                    f"RayExecutor: {name} must be a whole number >= 1, got {value!r}"
                )
        if type(max_retries) is not int or max_retries < 0:
            raise OrchestrationError(
                f"RayExecutor: max_retries must be a whole number >= 0, got {max_retries!r}"
            )
        self._local = LocalExecutor(agents)  # checks that every agent is callable
        self.agents = self._local.agents
        self.cpu_bound = frozenset(cpu_bound)
        unknown = sorted(self.cpu_bound - set(self.agents))
        if unknown:
            raise OrchestrationError(
                f"RayExecutor: cpu_bound names {', '.join(map(repr, unknown))}, which are not "
                f"agents (known: {', '.join(sorted(self.agents)) or 'none'})"
            )
        self.actors = actors
        self.actor_concurrency = actor_concurrency
        self.actor_options = dict(actor_options or {})
        self.task_options = {"num_cpus": 1, **(task_options or {})}
        self.max_retries = max_retries
        self._call = None if call is None else _address(call)
        self._ray: Any = None
        self._slots: list[_Slot] = []
        self._shipped: dict[str, Any] = {}  # cpu-bound agent -> its object ref
        self._host: Any = None
        self._actor_agents: dict[str, AgentFunction] = {}
        self._task: Any = None
        self._closed = False

    @property
    def concurrency_hint(self) -> int:
        """How many steps this executor runs at once."""
        return self.actors * self.actor_concurrency

    def _start(self) -> None:
        """Start the actors and ship the CPU-bound agents (on the first step)."""
        if self._closed:
            raise OrchestrationError("RayExecutor: closed; build a new one")
        ray = self._ray = _ray()
        if not ray.is_initialized():
            raise OrchestrationError(
                "RayExecutor: Ray is not started in this process: call ray.init(...) (a local "
                "cluster) or ray.init(address=...) (an existing one) before the first step"
            )
        host = ray.remote(_Host).options(
            max_concurrency=self.actor_concurrency,
            max_task_retries=self.max_retries,
            **self.actor_options,
        )
        actor_agents = {k: v for k, v in self.agents.items() if k not in self.cpu_bound}
        self._slots = [_Slot(host.remote(actor_agents)) for _ in range(self.actors)]
        self._task = ray.remote(_run_task).options(
            max_retries=self.max_retries, **self.task_options
        )
        self._shipped = {name: ray.put(self.agents[name]) for name in sorted(self.cpu_bound)}
        self._host = host
        self._actor_agents = actor_agents

    async def execute_step(self, spec: AgentStepSpec, /) -> StepOutcome:
        """Run ``spec`` on Ray; never raises for the step's own failure (a dead worker or
        actor, a Ray error, an agent that raised: each is a failed outcome)."""
        if spec.agent not in self.agents:
            return await self._local.execute_step(spec)  # the failed outcome naming the agents
        if self._ray is None:
            self._start()
        if self._call is not None:
            metadata = {**spec.metadata, CALL_METADATA: self._call}
            spec = spec.model_copy(update={"metadata": metadata})
        text = spec.model_dump_json()
        if spec.agent in self.cpu_bound:
            ref = self._task.remote(self._shipped[spec.agent], text)
            return await self._outcome(spec, ref, None)
        slot = min(self._slots, key=lambda s: s.busy)
        slot.busy += 1
        try:
            return await self._outcome(spec, slot.actor.run.remote(text), slot)
        finally:
            slot.busy -= 1

    async def _outcome(self, spec: AgentStepSpec, ref: Any, slot: _Slot | None) -> StepOutcome:
        ray = self._ray
        try:
            text = await _wait(ray, ref)
        except Exception as exc:
            where = "a Ray task" if slot is None else "its actor"
            if isinstance(exc, ray.exceptions.RayActorError) and slot is not None:
                self._replace(slot)
                where = "its actor, which died (replaced for later steps)"
            elif isinstance(exc, ray.exceptions.WorkerCrashedError):
                where = "a Ray worker, which died"
            return StepOutcome.failed(
                spec,
                f"step {spec.task_id!r} (agent {spec.agent!r}) failed on {where}: "
                f"{type(exc).__name__}: {_reason(exc)}; it may have run partly, and "
                "retries are off (max_retries)",
            )
        return StepOutcome.model_validate_json(text)

    def _replace(self, slot: _Slot) -> None:
        if slot.actor is not None and slot in self._slots and not self._closed:
            with contextlib.suppress(Exception):
                self._ray.kill(slot.actor)
            slot.actor = self._host.remote(self._actor_agents)

    def close(self) -> None:
        """Kill the actors (steps still running on them fail). Idempotent."""
        self._closed = True
        ray, slots, self._slots = self._ray, self._slots, []
        for slot in slots:
            with contextlib.suppress(Exception):
                ray.kill(slot.actor)
        self._shipped = {}

    def __enter__(self) -> RayExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"RayExecutor({self.actors} actors x {self.actor_concurrency}, "
            f"{len(self.agents)} agents)"
        )


async def _wait(ray: Any, ref: Any) -> Any:
    """The value of ``ref``, waited for on any anyio backend; cancelling cancels the work."""
    future = ref.future()
    done = anyio.Event()
    token = anyio.lowlevel.current_token()

    def wake(_: object) -> None:
        with contextlib.suppress(anyio.RunFinishedError, RuntimeError):
            token.backend_class.run_sync_soon(done.set, (), token.native_token)

    future.add_done_callback(wake)
    try:
        await done.wait()
    except anyio.get_cancelled_exc_class():
        with contextlib.suppress(Exception):
            ray.cancel(ref)
        raise
    return future.result()


def _reason(exc: BaseException) -> str:
    """Ray's message in one line: its first line and, when it goes on (a traceback from the
    worker), its last, which names the cause."""
    lines = [line.strip() for line in _ANSI.sub("", str(exc)).splitlines() if line.strip()]
    if not lines:
        return "no message"
    first = lines[0] if len(lines[0]) <= 300 else lines[0][:300] + "..."
    return first if len(lines) == 1 else f"{first} ... {lines[-1]}"


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _address(state: State) -> dict[str, str]:
    from ..stores.redis import RedisStore

    store = state.store
    if not isinstance(store, RedisStore):
        raise OrchestrationError(
            "RayExecutor: call= takes a State shared on Redis (State.connect(url, call_id)), "
            f"so workers can connect to it; this one's store is {store!r}"
        )
    return {"url": store.url, "call_id": store.call_id, "prefix": store.prefix}


_states: OrderedDict[tuple[str, str, str], State] = OrderedDict()
_states_lock = threading.Lock()


def call_state(spec: AgentStepSpec, **options: Any) -> State:
    """The State of the call ``spec`` belongs to, connected in this (worker) process.

    The executor that sent ``spec`` must have been given ``call=state``. One State per call is
    kept connected per process and reused by later steps (the least recently used of more
    than 32 is closed); ``options`` go to :meth:`State.connect` when it first connects
    (``policy`` and the like: a worker applies its own).
    """
    from ..state.state import State

    address = spec.metadata.get(CALL_METADATA)
    if not isinstance(address, dict) or not {"url", "call_id", "prefix"} <= address.keys():
        raise OrchestrationError(
            f"step {spec.task_id!r}: its spec carries no call address; give the executor "
            "call=state (a State shared on Redis) so its steps can connect to the call"
        )
    key = (str(address["url"]), str(address["call_id"]), str(address["prefix"]))
    with _states_lock:
        state = _states.get(key)
        if state is not None:
            _states.move_to_end(key)
            return state
        state = State.connect(key[0], key[1], prefix=key[2], **options)
        _states[key] = state
        while len(_states) > _OPEN_CALLS:
            _, old = _states.popitem(last=False)
            old.close()
        return state
