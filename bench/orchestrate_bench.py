"""Fan-out overhead of ``execute_parallel``; prints a table of medians against the target.

Run: ``python bench/orchestrate_bench.py`` (add ``--quick`` for a fast smoke run, as CI does).

1,000 branches of a step that does nothing but yield once, with a concurrency hint of 1,000:
the time per branch of ``execute_parallel`` minus the time per branch of the ideal, an anyio
task group starting the same 1,000 coroutines and collecting their results in order. Also the
same with every outcome recorded in a State (``state=``: status, result, provenance).
Target (issue 7): <= 30 µs per branch over the ideal; LangGraph's Send measured about 280 µs
per branch on the issue's machine.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time

import anyio
import anyio.lowlevel

from slateflow import State
from slateflow.orchestrate import AgentStepSpec, StepOutcome, execute_parallel

BRANCHES = 1000


class Instant:
    """An executor whose steps yield once and succeed."""

    concurrency_hint = BRANCHES

    async def execute_step(self, spec: AgentStepSpec) -> StepOutcome:
        await anyio.lowlevel.checkpoint()
        return StepOutcome.ok(spec, "ok")


async def ideal(specs: list[AgentStepSpec]) -> float:
    executor = Instant()
    results: list[StepOutcome | None] = [None] * len(specs)

    async def branch(i: int, spec: AgentStepSpec) -> None:
        results[i] = await executor.execute_step(spec)

    start = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for i, spec in enumerate(specs):
            tg.start_soon(branch, i, spec)
    return time.perf_counter() - start


async def ours(specs: list[AgentStepSpec], record: bool) -> float:
    state = State() if record else None
    start = time.perf_counter()
    outcomes = await execute_parallel(Instant(), specs, state=state)
    spent = time.perf_counter() - start
    assert len(outcomes) == len(specs)
    assert all(o.success for o in outcomes)
    return spent


def measure(repeat: int, backend: str) -> dict[str, float]:
    specs = [AgentStepSpec(task_id=f"t{i}", agent="a") for i in range(BRANCHES)]
    base: list[float] = []
    plain: list[float] = []
    recorded: list[float] = []
    for _ in range(repeat):
        gc.collect()
        base.append(anyio.run(ideal, specs, backend=backend) / BRANCHES)
        gc.collect()
        plain.append(anyio.run(ours, specs, False, backend=backend) / BRANCHES)
        gc.collect()
        recorded.append(anyio.run(ours, specs, True, backend=backend) / BRANCHES)
    ideal_t = statistics.median(base)
    return {
        "ideal": ideal_t,
        "plain": statistics.median(plain),
        "recorded": statistics.median(recorded),
        "plain_over": statistics.median(p - b for p, b in zip(plain, base, strict=True)),
        "recorded_over": statistics.median(r - b for r, b in zip(recorded, base, strict=True)),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a fast smoke run (as in CI)")
    args = parser.parse_args(argv)
    repeat = 3 if args.quick else 15
    print(f"slateflow orchestration benchmarks (Python {sys.version.split()[0]}, medians)")
    print(f"{'measure (1,000 branches, per branch)':<52}{'value':>10}   target")
    print("-" * 76)
    for backend in ("asyncio", "trio"):
        m = measure(repeat, backend)
        rows = [
            (f"{backend}: ideal anyio task group", m["ideal"], ""),
            (f"{backend}: execute_parallel", m["plain"], ""),
            ("  overhead over the ideal", m["plain_over"], "<= 30 us"),
            (f"{backend}: execute_parallel, recorded in a State", m["recorded"], ""),
            ("  overhead over the ideal", m["recorded_over"], "(reference)"),
        ]
        for name, seconds, target in rows:
            print(f"{name:<52}{seconds * 1e6:>7.1f} us   {target}")
    print("peer on the same job (from the issue): LangGraph Send ~280 us per branch")


if __name__ == "__main__":
    main()
