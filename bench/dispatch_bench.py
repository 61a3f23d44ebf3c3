"""Session.dispatch of many concurrent fetches against a bare anyio task group doing the same.

Run: ``python bench/dispatch_bench.py`` (``--quick`` for a smoke run, as CI does).

10,000 fetch resolvers (distinct names), each awaiting a 10 ms sleep and returning a small JSON
value, dispatched at once; the time until every result is in the State (``wait_idle``). The
bare peer: an anyio task group starting the same 10,000 coroutines, each sleeping 10 ms and
writing its result with ``state.set``. Memory per in-flight run: the same, with each fetch
waiting on a gate instead of a timer, measured (tracemalloc) once every one of them is
waiting, over the count. Both on asyncio and on trio, in the same run.
Targets (issue 20): <= 1.25x the bare time and <= 1.15x its memory per in-flight run.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
import tracemalloc
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from slateflow import Resolver, Session, State

SLEEP = 0.01


class Gate:
    """What a fetch waits on: a 10 ms timer, or (to measure memory) a gate opened once every
    fetch is waiting."""

    def __init__(self, n: int, measure: Callable[[], None] | None) -> None:
        self.n = n
        self.measure = measure
        self.waiting = 0
        self.open = anyio.Event()

    async def wait(self) -> None:
        if self.measure is None:
            await anyio.sleep(SLEEP)
            return
        self.waiting += 1
        if self.waiting == self.n:
            self.measure()
            self.open.set()
        await self.open.wait()


_gate: list[Gate] = []  # the gate of the run in progress
_resolvers: dict[int, list[Resolver]] = {}


async def fetch(state: State) -> dict[str, Any]:
    await _gate[0].wait()
    return {"ok": True}


def resolvers(n: int, gate: Gate) -> list[Resolver]:
    """``n`` fetch resolvers (built once, outside what is measured) waiting on ``gate``."""
    _gate[:] = [gate]
    if n not in _resolvers:
        _resolvers[n] = [Resolver.fetch(f"r{i}", fetch) for i in range(n)]
    return _resolvers[n]


async def bare(n: int, measure: Callable[[], None] | None = None) -> float:
    state = State()
    gate = Gate(n, measure)

    async def one(i: int) -> None:
        await gate.wait()
        state.set(f"r{i}:result", {"ok": True})

    start = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(one, i)
    return time.perf_counter() - start


async def dispatched(n: int, measure: Callable[[], None] | None = None) -> float:
    state = State()
    rs = resolvers(n, Gate(n, measure))
    async with Session(state) as session:
        start = time.perf_counter()
        for r in rs:
            session.dispatch(r)
        await session.wait_idle()
        spent = time.perf_counter() - start
    assert state.get(f"r{n - 1}:result") == {"ok": True}
    return spent


def timed(fn: Callable[[int], Awaitable[float]], n: int, backend: str, repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        gc.collect()
        samples.append(anyio.run(fn, n, backend=backend))
    return statistics.median(samples)


def memory(fn: Callable[..., Awaitable[float]], n: int, backend: str) -> float:
    """Bytes held per in-flight run, measured while all of them are in flight."""
    peak: list[int] = []

    def measure() -> None:
        peak.append(tracemalloc.get_traced_memory()[0])

    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    anyio.run(fn, n, measure, backend=backend)
    tracemalloc.stop()
    return (peak[0] - base) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a fast smoke run")
    args = parser.parse_args()
    n, repeat = (1000, 1) if args.quick else (10_000, 5)
    resolvers(n, Gate(n, None))
    rows = []
    for backend in ("asyncio", "trio"):
        ours_t = timed(dispatched, n, backend, repeat)
        bare_t = timed(bare, n, backend, repeat)
        ours_m = memory(dispatched, n, backend)
        bare_m = memory(bare, n, backend)
        rows.append((f"{backend}: Session.dispatch, {n:,} fetches", f"{ours_t:.3f} s", ""))
        rows.append((f"{backend}: bare task group + state.set", f"{bare_t:.3f} s", "(peer)"))
        rows.append((f"{backend}: time, dispatch / bare", f"{ours_t / bare_t:.2f}x", "<= 1.25x"))
        rows.append((f"{backend}: memory per in-flight run", f"{ours_m / 1024:.2f} KB", ""))
        rows.append((f"{backend}: memory per in-flight, bare", f"{bare_m / 1024:.2f} KB", "(peer)"))
        rows.append((f"{backend}: memory, dispatch / bare", f"{ours_m / bare_m:.2f}x", "<= 1.15x"))
    width = max(len(r[0]) for r in rows)
    print(f"{'measure':<{width}}  {'value':>10}  target")
    for name, value, target in rows:
        print(f"{name:<{width}}  {value:>10}  {target}")


if __name__ == "__main__":
    main()
