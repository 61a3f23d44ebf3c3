"""One call, two processes: ``python examples/two_process_call.py`` (``--trio`` for trio).

The voice process runs the call's flow; a worker process, started here, runs the availability
lookup. They share nothing but the call's State on Redis (``State.connect(url, call_id)``):
the caller's slot captured in the voice process activates the flow's ``check`` step, the worker
sees it and runs the lookup, its result lands in the State, and the voice process's flow moves
on to offer another time, as if the lookup had run beside it.

``--redis redis://host:port/0`` uses that server; without it the example starts a private
``redis-server`` on 127.0.0.1 (Debian: ``apt-get install redis-server``) and stops it after.
Needs ``pip install 'slateflow[redis]'``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from typing import Any

import anyio

from slateflow import (
    Flow,
    Resolver,
    Session,
    State,
    Step,
    any_,
    captured,
    edge,
    eq,
    failed,
    is_true,
    resolved,
)

BACKEND = "trio" if "--trio" in sys.argv else "asyncio"


def availability() -> Resolver:
    """The booking system (in the worker): 7 pm is taken, 7:30 pm is free."""

    async def check(state: State) -> dict[str, Any]:
        await anyio.sleep(0.05)  # the reservation system's latency
        if state["booking:time"] == "19:00":
            return {"open": False, "alternative": "19:30", "worker": os.getpid()}
        return {"open": True, "worker": os.getpid()}

    return Resolver.fetch("availability", check, reads=["booking:time"])


def booking_flow() -> Flow:
    """The voice process's plan: no step runs the lookup itself, the worker does."""
    return Flow(
        "booking",
        [
            Step("slot", done=captured("booking:date", "booking:time"),
                 posture="Ask which day and time the caller would like."),
            Step("check", after=["slot"], done=any_(resolved("availability"),
                                                    failed("availability")),
                 posture="Say you are checking the book."),
            Step("offer", after=[edge("check", when=eq("availability:result.open", False))],
                 done=is_true("booking:alternative_accepted"),
                 posture="That time is taken: offer {availability:result.alternative}."),
            Step("confirm", after=[edge("check", when=eq("availability:result.open", True)),
                                   "offer"], join="any", terminal=True,
                 posture="Confirm the booking."),
        ],
    )  # fmt: skip


async def worker(url: str, call_id: str) -> None:
    """The worker process: wait for the flow to reach ``check``, then run the lookup."""
    with State.connect(url, call_id) as state:
        async with Session(state) as session:
            await state.wait_until(lambda s: "check" in s.get("flow:booking:active", []),
                                   keys=["flow:booking:active"], timeout=30)  # fmt: skip
            await session.call(availability())


async def voice(url: str, call_id: str, say: Any = print) -> State:
    """The voice process: the call's flow, advanced by what either process writes."""
    state = State.connect(url, call_id)
    steps: list[str] = []

    def moved(changes: Any) -> None:
        for change in changes:
            steps.append(", ".join(change.new or []) or "-")
            say(f"voice: active steps now {steps[-1]}")

    state.subscribe(moved, keys=["flow:booking:active"])
    async with Session(state) as session:
        runner = booking_flow().start(session)
        worker_args = [sys.executable, __file__, "--worker", url, call_id]
        if BACKEND == "trio":
            worker_args.append("--trio")
        process = await anyio.open_process(worker_args, stdout=None, stderr=None)
        try:
            say("caller: Saturday at seven, please.")
            state.update({"booking:date": "Saturday", "booking:time": "19:00"}, source="user")
            await state.wait_until(lambda s: "offer" in s.get("flow:booking:active", []),
                                   keys=["flow:booking:active"], timeout=30)  # fmt: skip
            result = state["availability:result"]
            who = state.provenance("availability:result")
            assert who is not None
            say(f"voice: the lookup ran in process {result['worker']} (this is {os.getpid()}), "
                f"written by {who.writer!r}: {result['alternative']} is free instead")  # fmt: skip
            say("caller: Half seven is fine.")
            state.set("booking:alternative_accepted", True)
            await state.wait_until(lambda _s: runner.is_complete, keys=["flow:booking:active"],
                                   timeout=30)  # fmt: skip
            say(f"voice: done: {', '.join(runner.done_steps)}")
        finally:
            with anyio.move_on_after(30):
                await process.wait()
    state.close()
    return state


@contextlib.contextmanager
def private_redis() -> Iterator[str]:
    """A redis-server on a free port of 127.0.0.1, in a temporary directory, for this run."""
    binary = shutil.which("redis-server")
    if binary is None:
        sys.exit("no redis-server here: pass --redis URL, or apt-get install redis-server")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with tempfile.TemporaryDirectory() as directory:
        server = subprocess.Popen(
            [binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly",
             "no", "--dir", directory, "--logfile", "", "--daemonize", "no"],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert server.stdout is not None
            for line in server.stdout:  # its log says when it accepts connections
                if "Ready to accept connections" in line:
                    break
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            server.terminate()
            server.wait(10)
            server.stdout.close()  # type: ignore[union-attr]


def main() -> None:
    if "--worker" in sys.argv:
        url, call_id = sys.argv[sys.argv.index("--worker") + 1:][:2]  # fmt: skip
        anyio.run(worker, url, call_id, backend=BACKEND)
        return
    call_id = f"call-{uuid.uuid4().hex[:8]}"
    if "--redis" in sys.argv:
        anyio.run(voice, sys.argv[sys.argv.index("--redis") + 1], call_id, backend=BACKEND)
        return
    with private_redis() as url:
        anyio.run(voice, url, call_id, backend=BACKEND)


if __name__ == "__main__":
    main()
