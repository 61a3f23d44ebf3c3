"""Benchmarks of the State hot path; prints a table of medians against the targets.

Run: ``python bench/state_bench.py`` (add ``--quick`` for a fast smoke run, as CI does).
Numbers are medians of several repeats, per operation, on whatever machine runs this.
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


def per_op(fn: Callable[[], object], number: int, repeat: int) -> float:
    """Median seconds per call of ``fn`` over ``repeat`` runs of ``number`` calls."""
    gc.collect()
    times = timeit.repeat(fn, number=number, repeat=repeat)
    return statistics.median(times) / number


def bench_get(n: int, r: int) -> float:
    state = State()
    state.set("caller:name", "Ada")
    get = state.get
    return per_op(lambda: get("caller:name"), n, r)


def _setter(state: State, key: str) -> Callable[[], object]:
    counter = iter(range(10**12))
    set_ = state.set

    def write() -> object:
        return set_(key, next(counter))

    return write


def bench_set(n: int, r: int) -> float:
    state = State()
    state.set("turn:count", 0)
    return per_op(_setter(state, "turn:count"), n, r)


def bench_set_with_subs(subs: int, n: int, r: int) -> float:
    state = State()
    for i in range(subs):
        state.subscribe(lambda changes: None, keys=[f"watched:{i}"])
    state.set("turn:count", 0)
    return per_op(_setter(state, "turn:count"), n, r)


def bench_update(keys: int, n: int, r: int) -> float:
    state = State()
    counter = iter(range(10**12))
    names = [f"slot:{i}" for i in range(keys)]

    def write() -> object:
        v = next(counter)
        return state.update(dict.fromkeys(names, v))

    return per_op(write, n, r)


def _chain_once(links: int) -> float:
    state = State(journal_size=0)

    def next_link(changes: tuple[Change, ...]) -> None:
        i = changes[0].version
        if i < links:
            state.set("chain", i + 1)

    state.subscribe(next_link, keys=["chain"])
    gc.collect()
    t0 = timeit.default_timer()
    state.set("chain", 1)
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
    set10 = bench_set_with_subs(10, n, r)
    set10k = bench_set_with_subs(10_000, n, r)
    chain = bench_chain(links, 3)
    rows = [
        ("get", bench_get(n, r) * us, "<= 0.3 us"),
        ("set, no subscriber", bench_set(n, r) * us, "<= 1.5 us"),
        ("set, 10 key subs on other keys", set10 * us, ""),
        ("set, 10,000 key subs on other keys", set10k * us, "<= 2 us"),
        ("  ratio 10,000 / 10 subs", set10k / set10, "<= 1.3x"),
        ("update of 100 keys", bench_update(100, max(n // 100, 20), r) * us, "<= 80 us"),
        (f"chain of {links:,} receiver writes, per link", chain * us, "<= 6 us"),
        ("  blinker alone, per link", bench_blinker_chain(links, 3) * us, "(reference)"),
        (f"memory per small key at {mem_keys:,} keys", bench_memory(mem_keys), "<= 400 B"),
    ]
    print(f"slateflow State benchmarks (Python {sys.version.split()[0]}, medians)")
    print(f"{'measure':45} {'value':>10}  target")
    print("-" * 70)
    for name, value, target in rows:
        unit = "B" if name.startswith("memory") else ("x" if "ratio" in name else "us")
        print(f"{name:45} {value:>8.2f} {unit:<2} {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
