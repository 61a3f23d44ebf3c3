"""Benchmarks of the State hot path; prints a table of medians against the targets.

Run: ``python bench/state_bench.py`` (add ``--quick`` for a fast smoke run, as CI does).
Numbers are medians of several repeats, per operation, on whatever machine runs this. For the
per-call measures the harness (the timing loop, the closure and the counter producing fresh
values) is timed alone in the same repeat and subtracted; the raw figure is printed beside it.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import timeit
import tracemalloc
from collections import deque
from collections.abc import Callable

from blinker import Signal

from slateflow import Change, State
from slateflow.state.chains import MAX_CHAIN

Timing = tuple[float, float]
"""(net, raw) seconds per operation."""


def per_op(
    fn: Callable[[], object], number: int, repeat: int, harness: Callable[[], object]
) -> Timing:
    """Median seconds per call of ``fn``, less the same loop calling ``harness`` instead."""
    gc.collect()
    raw, net = [], []
    for _ in range(repeat):
        base = timeit.timeit(harness, number=number)
        spent = timeit.timeit(fn, number=number)
        raw.append(spent / number)
        net.append(max(spent - base, 0.0) / number)
    return statistics.median(net), statistics.median(raw)


def bench_get(n: int, r: int) -> Timing:
    state = State()
    state.set("caller:name", "Ada")
    get = state.get
    return per_op(lambda: get("caller:name"), n, r, lambda: "caller:name")


def _setter(state: State | None, key: str) -> Callable[[], object]:
    """A closure writing a fresh value each call (``state=None``: the harness alone)."""
    counter = iter(range(10**12))
    if state is None:
        return lambda: (key, next(counter))
    set_ = state.set
    return lambda: set_(key, next(counter))


def bench_set(n: int, r: int) -> Timing:
    state = State()
    state.set("turn:count", 0)
    return per_op(_setter(state, "turn:count"), n, r, _setter(None, "turn:count"))


def _watched_state(subs: int) -> State:
    state = State()
    for i in range(subs):
        state.subscribe(lambda changes: None, keys=[f"watched:{i}"])
    state.set("turn:count", 0)
    return state


def bench_set_with_subs(few: int, many: int, n: int, r: int) -> tuple[Timing, Timing, float]:
    """Set with ``few`` and with ``many`` subscriptions on other keys, timed in alternation in
    every repeat so that the ratio compares like with like on a machine whose speed drifts."""
    harness = _setter(None, "turn:count")
    writers = [_setter(_watched_state(count), "turn:count") for count in (few, many)]
    gc.collect()
    raw: list[list[float]] = [[], []]
    net: list[list[float]] = [[], []]
    for _ in range(r):
        base = timeit.timeit(harness, number=n)
        for i, write in enumerate(writers):
            spent = timeit.timeit(write, number=n)
            raw[i].append(spent / n)
            net[i].append(max(spent - base, 0.0) / n)
    ratio = statistics.median(m / f for f, m in zip(net[0], net[1], strict=True))
    timings = [(statistics.median(net[i]), statistics.median(raw[i])) for i in (0, 1)]
    return timings[0], timings[1], ratio


def bench_update(keys: int, n: int, r: int) -> Timing:
    state = State()
    counter = iter(range(10**12))
    names = [f"slot:{i}" for i in range(keys)]
    update = state.update
    update(dict.fromkeys(names, -1))  # the keys exist: this measures updating them
    return per_op(
        lambda: update(dict.fromkeys(names, next(counter))),
        n,
        r,
        lambda: dict.fromkeys(names, next(counter)),
    )


def _chain_once(links: int) -> float:
    state = State(journal_size=0)
    # The State stops a chain past MAX_CHAIN deliveries (a receiver looping on its own key), so
    # the links run as chains of at most half that, each started by a fresh write.
    chain = min(links, MAX_CHAIN // 2)

    def next_link(changes: tuple[Change, ...]) -> None:
        value = changes[0].new
        if value % chain:
            state.set("chain", value + 1)

    state.subscribe(next_link, keys=["chain"])
    gc.collect()
    t0 = timeit.default_timer()
    for start in range(0, links, chain):
        state.set("chain", start + 1)
    elapsed = timeit.default_timer() - t0
    assert state.get("chain") == links
    return elapsed / links


def bench_chain(links: int, r: int) -> float:
    """A receiver that writes the next key: every link is a set, a signal and a delivery."""
    return statistics.median(_chain_once(links) for _ in range(r))


def _blinker_chain_once(links: int) -> float:
    signal = Signal()
    store: dict[str, int] = {}
    queue: deque[int] = deque()

    def receiver(sender: object, value: int) -> None:
        store["chain"] = value
        if value < links:
            queue.append(value + 1)

    signal.connect(receiver)
    gc.collect()
    t0 = timeit.default_timer()
    queue.append(1)
    while queue:
        signal.send(None, value=queue.popleft())
    return (timeit.default_timer() - t0) / links


def bench_blinker_chain(links: int, r: int) -> float:
    """The same chain with blinker alone (a send per link, queued to avoid recursion)."""
    return statistics.median(_blinker_chain_once(links) for _ in range(r))


def bench_memory(keys: int) -> float:
    """Bytes per key for ``keys`` small keys written one set at a time (tracemalloc)."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    state = State()
    set_ = state.set
    for i in range(keys):
        set_(f"caller:{i}", i)
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert len(state) == keys
    return (after - before) / keys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="few iterations (smoke test)")
    args = parser.parse_args(argv)
    q = args.quick
    n, r = (2_000, 3) if q else (200_000, 7)
    links = 2_000 if q else 100_000
    mem_keys = 10_000 if q else 1_000_000

    us = 1e6
    get = bench_get(n, r)
    set_ = bench_set(n, r)
    set10, set10k, ratio = bench_set_with_subs(10, 10_000, n, r)
    update = bench_update(100, max(n // 100, 20), r)
    chain = bench_chain(links, 3)
    blinker = bench_blinker_chain(links, 3)
    memory = bench_memory(mem_keys)
    rows = [
        ("get", get[0] * us, get[1] * us, "us", "<= 0.3 us"),
        ("set, no subscriber", set_[0] * us, set_[1] * us, "us", "<= 1.5 us"),
        ("set, 10 key subs on other keys", set10[0] * us, set10[1] * us, "us", ""),
        ("set, 10,000 key subs on other keys", set10k[0] * us, set10k[1] * us, "us", "<= 2 us"),
        ("  ratio 10,000 / 10 subs (paired)", ratio, None, "x", "<= 1.3x"),
        ("update of 100 existing keys", update[0] * us, update[1] * us, "us", "<= 80 us"),
        (f"chain of {links:,} receiver writes, per link", chain * us, None, "us", "<= 6 us"),
        ("  blinker alone, per link", blinker * us, None, "us", "(reference)"),
        (f"memory per small key at {mem_keys:,} keys", memory, None, "B", "<= 400 B"),
    ]
    print(f"slateflow State benchmarks (Python {sys.version.split()[0]}, medians)")
    print(f"{'measure':45} {'value':>10}  {'raw':>8}   target")
    print("-" * 80)
    for name, value, raw, unit, target in rows:
        raw_text = f"{raw:8.2f}" if raw is not None else " " * 8
        print(f"{name:45} {value:>8.2f} {unit:<2} {raw_text}   {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
