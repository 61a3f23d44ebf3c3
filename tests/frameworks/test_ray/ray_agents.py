"""Agents the Ray tests run: imported by Ray's workers as a user's own module would be."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import ray
from pydantic import BaseModel

from slateflow.orchestrate import AgentStepSpec
from slateflow.orchestrate.ray import call_state


@ray.remote
class Meeting:
    """Where agents running in different places meet: ``arrive`` returns once ``size`` have
    arrived (so it proves they ran at the same time); ``mark``/``marked`` pass a word along."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.arrived = 0
        self.all_here = asyncio.Event()
        self.words: dict[str, asyncio.Event] = {}

    async def arrive(self) -> int:
        self.arrived += 1
        if self.arrived >= self.size:
            self.all_here.set()
        await self.all_here.wait()
        return self.arrived

    def _word(self, word: str) -> asyncio.Event:
        return self.words.setdefault(word, asyncio.Event())

    async def mark(self, word: str) -> None:
        self._word(word).set()

    async def marked(self, word: str) -> bool:
        await self._word(word).wait()
        return True


def meeting(spec: AgentStepSpec) -> Any:
    return ray.get_actor(str(spec.metadata["meeting"]))


async def meet(spec: AgentStepSpec) -> dict[str, Any]:
    """Waits until every step of the meeting is running, then answers its input doubled."""
    await meeting(spec).arrive.remote()
    return {"n": spec.input * 2 if isinstance(spec.input, int) else None, "pid": os.getpid()}


def meet_sync(spec: AgentStepSpec) -> dict[str, Any]:
    """``meet`` as a blocking function."""
    ray.get(meeting(spec).arrive.remote())
    return {"n": spec.input}


async def double(spec: AgentStepSpec) -> dict[str, Any]:
    assert isinstance(spec.input, int)
    return {"n": spec.input * 2}


def text(spec: AgentStepSpec) -> str:
    return f"hello {spec.input}"


class Booking(BaseModel):
    table: int


async def model(spec: AgentStepSpec) -> Booking:
    return Booking(table=4)


async def not_json(spec: AgentStepSpec) -> Any:
    return {1, 2}


async def broken(spec: AgentStepSpec) -> Any:
    raise ValueError(f"no table for {spec.input}")


async def die(spec: AgentStepSpec) -> Any:
    os._exit(1)


def die_sync(spec: AgentStepSpec) -> Any:
    os._exit(1)


def burn(spec: AgentStepSpec) -> dict[str, int]:
    """A CPU-bound step: a sum done the slow way."""
    assert isinstance(spec.input, int)
    return {"sum": sum(range(spec.input)), "pid": os.getpid()}


async def hang(spec: AgentStepSpec) -> Any:
    """Marks 'started', then waits for a word that never comes; marks 'cancelled' when the
    wait is cancelled."""
    where = meeting(spec)
    try:  # the cancellation may land while 'started' is still being marked
        await where.mark.remote("started")
        await where.marked.remote("never")
    except asyncio.CancelledError:
        await where.mark.remote("cancelled")
        raise


async def write(spec: AgentStepSpec) -> dict[str, Any]:
    """Writes its result into the call's State, connected here by the call's id."""
    state = call_state(spec)
    state.set(f"{spec.task_id}:seen", {"by": os.getpid(), "input": spec.input})
    return {"wrote": f"{spec.task_id}:seen"}
