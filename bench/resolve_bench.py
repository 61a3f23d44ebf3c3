"""Benchmarks of resolvers in a Session; prints a table of medians against the targets.

Run: ``python bench/resolve_bench.py`` (``--quick`` for a smoke run, ``--backend trio`` for trio).

- dispatch: ``session.dispatch(resolver)`` of a no-op fetch resolver, per call, in a burst;
- completion: from the burst's end until every run has written its result, per run;
- 10,000 concurrent resolvers that each await 10 ms: wall time until all have landed;
- memory per in-flight dispatch: traced allocations of runs parked inside their source,
  including the run's state keys.

Beside each figure the same work done with bare anyio tasks (``start_soon`` of an empty task, or
of a task sleeping 10 ms) is printed: on a slow machine, or with an anyio release whose task
spawning is slower, that baseline shows how much of the cost is the task itself.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
import tracemalloc
from collections.abc import Awaitable, Callable
from importlib.metadata import version

import anyio

from slateflow import Resolver, Session, State


async def _noop(state: State) -> int:
    return 1


async def _empty() -> None:
    return None


async def dispatch_and_complete(n: int, *, again: bool = False) -> tuple[float, float]:
    """Seconds per dispatch and per completion of ``n`` no-op resolvers.

    With ``again``, the same resolvers have run once before, so their keys exist (the steady
    state of a conversation, where the same lookups run turn after turn).
    """
    resolvers = [Resolver.fetch(f"noop{i}", _noop) for i in range(n)]
    state = State()
    async with Session(state) as session:
        if again:
            for resolver in resolvers:
                session.dispatch(resolver)
            await session.wait_idle()
        gc.collect()
        t0 = time.perf_counter()
        for resolver in resolvers:
            session.dispatch(resolver)
        t1 = time.perf_counter()
        await session.wait_idle()
        t2 = time.perf_counter()
    assert state.get(f"noop{n - 1}:status") == "done"
    return (t1 - t0) / n, (t2 - t1) / n


async def bare_tasks(n: int) -> tuple[float, float]:
    """Seconds per ``start_soon`` and per run of ``n`` empty anyio tasks (the baseline)."""
    async with anyio.create_task_group() as tg:
        gc.collect()
        t0 = time.perf_counter()
        for _ in range(n):
            tg.start_soon(_empty)
        t1 = time.perf_counter()
    t2 = time.perf_counter()
    return (t1 - t0) / n, (t2 - t1) / n


async def concurrent_sleepers(n: int, delay: float) -> float:
    """Wall seconds for ``n`` resolvers that each await ``delay`` to all land."""

    async def sleeper(state: State) -> int:
        await anyio.sleep(delay)
        return 1

    resolvers = [Resolver.fetch(f"sleep{i}", sleeper) for i in range(n)]
    state = State()
    async with Session(state) as session:
        gc.collect()
        t0 = time.perf_counter()
        for resolver in resolvers:
            session.dispatch(resolver)
        await session.wait_idle()
        elapsed = time.perf_counter() - t0
    assert all(state.get(f"sleep{i}:status") == "done" for i in range(n))
    return elapsed


async def traced_bytes_per(n: int, start: Callable[[int], object]) -> float:
    """Traced bytes per task after ``start(i)`` for ``i`` in ``range(n)``, once every task has
    run up to the await it parks on (so each holds its whole stack)."""
    await anyio.lowlevel.checkpoint()
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for i in range(n):
        start(i)
    for _ in range(5):
        await anyio.lowlevel.checkpoint()
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return (after - before) / n


async def bare_memory(n: int) -> float:
    """Traced bytes per bare anyio task parked on an event (the baseline)."""
    release = anyio.Event()
    async with anyio.create_task_group() as tg:
        per = await traced_bytes_per(n, lambda i: tg.start_soon(release.wait))
        release.set()
    return per


async def bare_sleepers(n: int, delay: float) -> float:
    """Wall seconds for ``n`` bare anyio tasks that each sleep ``delay`` (the baseline)."""
    gc.collect()
    t0 = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(n):
            tg.start_soon(anyio.sleep, delay)
    return time.perf_counter() - t0


async def memory_per_dispatch(n: int) -> float:
    """Traced bytes per run parked inside its source (run, task, state keys)."""
    release = anyio.Event()

    async def parked(state: State) -> int:
        await release.wait()
        return 1

    resolvers = [Resolver.fetch(f"park{i}", parked) for i in range(n)]
    async with Session(State()) as session:
        per = await traced_bytes_per(n, lambda i: session.dispatch(resolvers[i]))
        release.set()
    return per


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, one repeat")
    parser.add_argument("--backend", default="asyncio", choices=["asyncio", "trio"])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    repeat = 1 if args.quick else args.repeat
    n = 500 if args.quick else 5000
    sleepers = 1000 if args.quick else 10_000
    backend = args.backend

    def pair(fn: Callable[[], Awaitable[tuple[float, float]]]) -> tuple[float, float]:
        got = [anyio.run(fn, backend=backend) for _ in range(repeat)]
        return statistics.median(g[0] for g in got), statistics.median(g[1] for g in got)

    def one(fn: Callable[[], Awaitable[float]]) -> float:
        return statistics.median(anyio.run(fn, backend=backend) for _ in range(repeat))

    d, c = pair(lambda: dispatch_and_complete(n))
    d2, c2 = pair(lambda: dispatch_and_complete(n, again=True))
    bd, bc = pair(lambda: bare_tasks(n))
    wall = one(lambda: concurrent_sleepers(sleepers, 0.01))
    bwall = one(lambda: bare_sleepers(sleepers, 0.01))
    mem = one(lambda: memory_per_dispatch(min(n, 2000)))
    bmem = one(lambda: bare_memory(min(n, 2000)))

    print(
        f"resolve bench ({backend}, anyio {version('anyio')}, Python {sys.version.split()[0]}, "
        f"median of {repeat})"
    )
    rows = [
        ("measure", "slateflow", "target", "bare anyio tasks"),
        ("dispatch a no-op resolver", f"{d * 1e6:.1f} us", "<= 25 us", f"{bd * 1e6:.1f} us"),
        ("completion of a no-op resolver", f"{c * 1e6:.1f} us", "<= 25 us", f"{bc * 1e6:.1f} us"),
        ("  the same names again: dispatch", f"{d2 * 1e6:.1f} us", "", ""),
        ("  the same names again: completion", f"{c2 * 1e6:.1f} us", "", ""),
        (
            f"{sleepers:,} concurrent x 10 ms, all landed",
            f"{wall:.3f} s",
            "<= 0.4 s",
            f"{bwall:.3f} s",
        ),
        (
            "memory per in-flight dispatch",
            f"{mem / 1024:.2f} KB",
            "<= 4 KB",
            f"{bmem / 1024:.2f} KB",
        ),
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
