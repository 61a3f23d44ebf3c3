"""The commit path and the flow hot path beside Burr, LangGraph and plain blinker, in one run.

Run: ``python bench/engine_bench.py`` (``--quick`` for a smoke run, as CI does). Peers are
measured on this machine in the same run when installed (``pip install burr langgraph``);
a missing peer prints "not installed". Medians of several repeats; per-call measures subtract
the harness (the loop and the value counter) timed alone in the same repeat.

Measures (issue 19's table):

* ``get``; ``set`` with no receiver; ``set`` with one receiver minus a bare
  ``blinker.Signal.send`` to one receiver;
* a guarded flow step: a 200-step chain, each step done when its key is set, one write per step
  (Burr: the same chain of 200 actions, ``app.step()`` per step; LangGraph: a 200-node chain);
* FlowRunner start on the demo's booking flow;
* a 10,000-step chain: its per-step cost over the 200-step chain's, and the memory it holds;
* a write to an unread key with 10,000 guards over the same with 10;
* a durable step: a 3-step flow on ``State.open(path)`` (batch durability), flushed once per
  flow, per step; Burr's SQLite persister (WAL, synchronous=NORMAL) saving each step.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import timeit
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
from blinker import Signal
from flow_bench import bench_linear, linear_flow
from peers import burr_chain, burr_durable, langgraph_chain
from state_bench import per_op as state_per_op
from store_bench import bench_flow

from slateflow import Session, State
from slateflow.demo_flow import availability, booking_flow
from slateflow.flow import Flow, FlowRunner, Step, is_set
from slateflow.resolve.clock import ManualClock

US = 1e6


def per_op(
    fn: Callable[[], object], harness: Callable[[], object], number: int, repeat: int
) -> float:
    """Median seconds per call of ``fn``, less the same loop calling ``harness``."""
    return state_per_op(fn, number, repeat, harness)[0]


def _counter_setter(state: State | None, key: str) -> Callable[[], object]:
    counter = iter(range(10**12))
    if state is None:
        return lambda: (key, next(counter))
    set_ = state.set
    return lambda: set_(key, next(counter))


def bench_get(number: int, repeat: int) -> float:
    state = State()
    state.set("caller:name", "Ada")
    get = state.get
    return per_op(lambda: get("caller:name"), lambda: "caller:name", number, repeat)


def bench_set(number: int, repeat: int) -> float:
    state = State()
    state.set("turn:n", 0)
    return per_op(_counter_setter(state, "turn:n"), _counter_setter(None, "turn:n"), number, repeat)


def bench_set_one_receiver(number: int, repeat: int) -> tuple[float, float]:
    """``set`` with one receiver of the key, and a bare blinker send to one receiver."""
    state = State()
    state.set("turn:n", 0)
    seen: list[Any] = []

    def receiver(sender: object, **kw: Any) -> None:
        seen.append(sender)
        if len(seen) > 1000:
            seen.clear()

    state.changed.connect(receiver, sender="turn:n")
    with_receiver = per_op(
        _counter_setter(state, "turn:n"), _counter_setter(None, "turn:n"), number, repeat
    )
    signal = Signal()
    signal.connect(receiver)
    counter = iter(range(10**12))
    send = signal.send
    bare = per_op(
        lambda: send("turn:n", value=next(counter)),
        _counter_setter(None, "turn:n"),
        number,
        repeat,
    )
    return with_receiver, bare


def chain_memory(steps: int) -> float:
    """Bytes a completed ``steps``-step chain holds (State, journal, runner); the flow itself,
    compiled once and shared by every runner of it, is made before measuring."""
    flow = linear_flow(steps).compile()
    gc.collect()
    tracemalloc.start()
    state = State()
    runner = FlowRunner(flow, state)
    for i in range(steps):
        state.set(f"k:{i}", True)
    gc.collect()
    held = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert runner.is_complete
    return float(held)


def bench_runner_start(number: int, repeat: int) -> float:
    """FlowRunner start on the demo's booking flow (in a session, as run_flow starts it)."""
    clock = ManualClock()
    flow = booking_flow(availability(clock))
    result: list[float] = []

    async def main() -> None:
        state = State()
        async with Session(state, clock=clock) as session:
            flow.compile(flow.registry)

            def start() -> None:
                FlowRunner(flow, state, session=session).close()

            result.append(per_op(start, lambda: None, number, repeat))

    anyio.run(main)
    return result[0]


def _wide(guards: int) -> Flow:
    return Flow("wide", [Step(f"w{i}", done=is_set(f"watched:{i}")) for i in range(guards)])


def bench_unrelated(few: int, many: int, number: int, repeat: int) -> float:
    """A write to an unread key with ``many`` guards over ``few``, paired per repeat."""
    writers = []
    for count in (few, many):
        state = State()
        FlowRunner(_wide(count), state)
        writers.append(_counter_setter(state, "unread:key"))
    gc.collect()
    ratios = []
    for _ in range(repeat):
        a = timeit.timeit(writers[0], number=number)
        b = timeit.timeit(writers[1], number=number)
        ratios.append(b / a)
    return statistics.median(ratios)


def bench_durable(flows: int, repeat: int) -> float:
    """Per step: a 3-step flow on a durable state (batch), each step completed by one write,
    flushed once per flow: ``bench/store_bench.py``'s job, median of ``repeat`` runs."""
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(repeat):
            path = Path(tmp) / f"bench-{r}.db"
            runs.append(bench_flow(lambda path=path: State.open(path), flows) / 1e3)
    return statistics.median(runs)


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "not installed"
    return f"{value:.2f} {unit}" if unit != "x" else f"{value:.2f} x"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="few iterations (smoke test)")
    args = parser.parse_args(argv)
    q = args.quick
    repeat = 3 if q else 11
    number = 5_000 if q else 200_000
    get = bench_get(number, repeat)
    set_ = bench_set(number, repeat)
    one, bare = bench_set_one_receiver(number, repeat)
    step200 = bench_linear(200, repeat * 3)
    burr = burr_chain(200, repeat)
    langgraph = langgraph_chain(200, max(repeat // 2, 2))
    start = bench_runner_start(200 if q else 5_000, repeat)
    big = 2_000 if q else 10_000
    step_big = bench_linear(big, 3 if q else 5)
    memory = chain_memory(big)
    unrelated = bench_unrelated(10, 10_000, number // 10, repeat)
    durable = bench_durable(30 if q else 400, 3 if q else 5)
    burr_durable_s = burr_durable(30 if q else 400, 3 if q else 5)
    rows: list[tuple[str, str, str]] = [
        ("guarded flow step (200-step chain)", _fmt(step200 * US, "us"), "<= 5 us"),
        ("  Burr, the same chain", _fmt(burr and burr * US, "us"), "(peer)"),
        ("  Burr / slateflow", _fmt(burr and burr / step200, "x"), ">= 4x"),
        ("  LangGraph, a 200-node chain", _fmt(langgraph and langgraph * US, "us"), "(peer)"),
        ("set, no receiver", _fmt(set_ * US, "us"), "<= 0.4 us"),
        ("set, one receiver", _fmt(one * US, "us"), ""),
        ("  bare blinker send to one receiver", _fmt(bare * US, "us"), "(peer)"),
        ("  set with one receiver minus blinker send", _fmt((one - bare) * US, "us"), "<= 0.3 us"),
        ("FlowRunner start (booking flow)", _fmt(start * US, "us"), "<= 30 us"),
        (f"{big:,}-step chain, per step", _fmt(step_big * US, "us"), ""),
        ("  per step vs the 200-step chain", _fmt(step_big / step200, "x"), "<= 1.3x"),
        (f"  memory held by the {big:,}-step run", f"{memory / 1e6:.1f} MB", "<= 10 MB"),
        ("write, 10,000 unrelated guards vs 10", _fmt(unrelated, "x"), "<= 1.1x"),
        ("durable step, SQLite (batch, flushed per flow)", _fmt(durable * US, "us"), "<= 90 us"),
        (
            "  Burr SQLite persister (WAL, synchronous=NORMAL)",
            _fmt(burr_durable_s and burr_durable_s * US, "us"),
            "(peer: slateflow below it)",
        ),
        ("get", _fmt(get * US, "us"), "<= 0.1 us"),
    ]
    print(f"slateflow engine benchmarks (Python {sys.version.split()[0]}, medians)")
    print(f"{'measure':50} {'value':>14}   target")
    print("-" * 84)
    for name, value, target in rows:
        print(f"{name:50} {value:>14}   {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
