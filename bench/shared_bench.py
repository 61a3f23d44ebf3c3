"""Benchmarks of a State shared on Redis (``State.connect``); prints a table against the issue's
targets, with the raw redis-py round trip beside it as the floor.

Run: ``python bench/shared_bench.py`` (``--quick`` for a smoke run, as CI does). It starts its
own redis-server processes on 127.0.0.1 (``apt-get install redis-server``; ``pip install
'slateflow[redis]'``) and its writer and follower processes (this script, with ``--role``).

Measured, each on loopback: a ``set`` with AOF everysec; a remote write reaching a subscriber
in another process at 2,000 writes/s; a resolver's result in one process completing a flow step
in another; a conversation turn on a shared State against one in memory; two writer processes
on distinct keys; contended ``modify`` and transaction increments from two processes; commits
whose reply is lost; a follower whose connection is killed every 100 ms; a paused replica
catching up; a process joining a call of 1,000 keys; redis-server killed with ``kill -9``
(AOF always, everysec, none); one process following 1,000 calls.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the test suite's redis-server and lossy proxy

from redis_support import RedisProcess, ReplyDropper  # noqa: E402
from slateflow import State  # noqa: E402

HERE = Path(__file__).resolve()
Row = tuple[str, str, str]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def us(seconds: float) -> str:
    return f"{seconds * 1e6:.0f} us"


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def role(name: str, *args: object) -> subprocess.Popen[str]:
    """This script in another process, playing ``name``."""
    return subprocess.Popen([sys.executable, str(HERE), "--role", name, *map(str, args)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip


def line_of(process: subprocess.Popen[str]) -> str:
    assert process.stdout is not None
    return process.stdout.readline().strip()


def tell(process: subprocess.Popen[str], text: str = "go") -> None:
    assert process.stdin is not None
    process.stdin.write(text + "\n")
    process.stdin.flush()


def wait_event(event: threading.Event, timeout: float, what: str) -> None:
    if not event.wait(timeout):
        raise TimeoutError(f"waited {timeout}s for {what}")


# -- in this process ---------------------------------------------------------------------------


def bench_set(url: str, n: int) -> tuple[list[float], list[float]]:
    """Latency of ``set`` on a shared State, and of a raw redis-py SET (the floor)."""
    import redis

    state = State.connect(url, f"set-{uuid.uuid4().hex[:8]}")
    times = []
    for i in range(n):
        t0 = time.perf_counter()
        state.set(f"k:{i % 100}", i)
        times.append(time.perf_counter() - t0)
    state.close()
    raw = redis.Redis.from_url(url)
    floor = []
    for i in range(n):
        t0 = time.perf_counter()
        raw.set(f"raw:{i % 100}", i)
        floor.append(time.perf_counter() - t0)
    return times, floor


def bench_turns(url: str, turns: int) -> tuple[float, float]:
    """Median time of a conversation turn (a 3-field extractor, a 6-step flow: the turn
    bench's workload) on a State in memory and on a shared one."""
    import anyio

    sys.path.insert(0, str(ROOT / "bench"))
    from turn_bench import bench_turns as turns_on  # type: ignore[import-not-found]

    memory: float = anyio.run(turns_on, True, turns)
    state = State.connect(url, f"turn-{uuid.uuid4().hex[:8]}")
    shared: float = anyio.run(turns_on, True, turns, state)
    state.close()
    return memory, shared


def bench_lost_replies(port: int, n: int) -> tuple[int, int, int]:
    """``n`` commits each losing its first reply: (replies lost, commits on the server, keys)."""
    proxy = ReplyDropper(port)
    call = f"lost-{uuid.uuid4().hex[:8]}"
    url = f"redis://127.0.0.1:{port}/0"
    try:
        with State.connect(proxy.url, call) as state:
            for i in range(n):
                state.set(f"k:{i}", i)
        with State.connect(url, call) as fresh:
            return proxy.dropped, fresh.journal.cursor, len(fresh)
    finally:
        proxy.close()


def bench_killed_follower(url: str, n: int) -> tuple[int, bool, int]:
    """``n`` writes while the follower's connection is killed every 100 ms: (received, in
    order, reconnects)."""
    import redis

    call = f"killed-{uuid.uuid4().hex[:8]}"
    writer = State.connect(url, call)
    reader = State.connect(url, call)
    got: list[int] = []
    done = threading.Event()

    def seen(changes: Any) -> None:
        got.extend(c.new for c in changes)
        if got and got[-1] == n:
            done.set()

    reader.subscribe(seen, keys=["n"])
    admin = redis.Redis.from_url(url)
    stop = threading.Event()

    def killer() -> None:
        while not stop.wait(0.1):
            admin.client_kill_filter(_type="pubsub")

    thread = threading.Thread(target=killer)
    thread.start()
    try:
        for i in range(1, n + 1):
            writer.set("n", i)
        wait_event(done, 30, "the reader to receive every write")
    finally:
        stop.set()
        thread.join()
    follower = reader.store.server.follower()  # type: ignore[union-attr]
    writer.close()
    reader.close()
    return len(got), got == list(range(1, n + 1)), follower.reconnects


def bench_catch_up(url: str, n: int) -> float:
    """A replica that stopped following while ``n`` commits were made: time to catch up."""
    call = f"paused-{uuid.uuid4().hex[:8]}"
    writer = State.connect(url, call)
    paused = State.connect(url, call)
    paused.store.close()  # type: ignore[union-attr]  # it stops following (and writing)
    for i in range(n):
        writer.set(f"k:{i % 50}", i)
    replica = paused.engine.shared
    assert replica is not None
    t0 = time.perf_counter()
    replica.sync()
    elapsed = time.perf_counter() - t0
    assert paused.journal.cursor == n, (paused.journal.cursor, n)
    writer.close()
    return elapsed


def bench_join(url: str, keys: int) -> float:
    """Best of 5: ``State.connect`` to a call holding ``keys`` keys."""
    call = f"join-{uuid.uuid4().hex[:8]}"
    with State.connect(url, call) as state:
        for start in range(0, keys, 100):
            state.update({f"booking:{i}": {"slot": i, "who": "caller"}
                          for i in range(start, min(start + 100, keys))})  # fmt: skip
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        joined = State.connect(url, call)
        best = min(best, time.perf_counter() - t0)
        assert len(joined) == keys
        joined.close()
    return best


def bench_kill(where: Path, mode: str, n: int) -> str:
    """Write ``n`` commits, ``kill -9`` the server, restart it: what came back."""
    appendonly = mode != "none"
    server = RedisProcess(where / mode, appendonly=appendonly,
                          appendfsync=mode if appendonly else "everysec").start()  # fmt: skip
    call = f"kill-{mode}"
    writer = State.connect(server.url, call)
    reader = State.connect(server.url, call)
    diverged = threading.Event()
    reader.receiver_failed.connect(lambda _s, **_kw: diverged.set(), weak=False)
    try:
        for i in range(n):
            writer.set(f"k:{i}", i)
        server.kill()
        server.start()
        t0 = time.monotonic()
        with State.connect(server.url, call) as after:
            kept = after.journal.cursor
        if kept < n:
            detected = diverged.wait(5)
            took = time.monotonic() - t0
            writer.set("probe", 1)  # the writer finds out with its next commit
            writer_saw = writer.engine.shared.resyncs  # type: ignore[union-attr]
            return (f"{n - kept} of {n} lost; follower detected in {took:.2f} s: {detected}; "
                    f"writer resynced: {writer_saw > 0}")  # fmt: skip
        return f"0 of {n} lost"
    finally:
        writer.close()
        reader.close()
        server.stop()


# -- across processes -----------------------------------------------------------------------------


def bench_remote_latency(url: str, rate: int, seconds: float) -> list[float]:
    """A writer process paced at ``rate``/s; this process's subscriber: write → delivery."""
    call = f"remote-{uuid.uuid4().hex[:8]}"
    state = State.connect(url, call)
    n = int(rate * seconds)
    lat: list[float] = []
    done = threading.Event()

    def seen(changes: Any) -> None:
        now = time.time_ns()
        for c in changes:
            lat.append((now - c.new) / 1e9)
        if len(lat) >= n:
            done.set()

    state.subscribe(seen, keys=["stamp"])
    writer = role("writer", url, call, rate, n)
    assert line_of(writer) == "ready"
    tell(writer)
    wait_event(done, seconds * 5 + 30, "the remote writes")
    writer.wait(30)
    state.close()
    return lat


def bench_step_latency(url: str, rounds: int) -> list[float]:
    """A resolver's result written in a worker process → the flow step it completes, done in
    this process (measured from the resolver's return). One worker process runs a resolver a
    round; the first two rounds warm both processes up and are not counted."""
    import anyio

    from slateflow import Flow, Session, Step, resolved

    async def run(call: str) -> list[float]:
        state = State.connect(url, call)
        finished = threading.Event()
        stamps: dict[str, int] = {}

        def done(changes: Any) -> None:
            for c in changes:
                if c.new and "wait" in c.new:
                    stamps[c.key] = time.time_ns()
                    finished.set()

        state.subscribe(done, pattern="flow:*:done")
        lat: list[float] = []
        worker = role("resolver", url, call, str(rounds + 2))
        async with Session(state) as session:
            for i in range(rounds + 2):
                finished.clear()
                steps = [
                    Step("wait", done=resolved(f"lookup{i}")),
                    Step("next", after=["wait"], terminal=True),
                ]
                Flow(f"bench{i}", steps).start(session)
                tell(worker)
                await anyio.to_thread.run_sync(finished.wait, 30)
                returned = int(line_of(worker))
                if i >= 2:
                    lat.append((stamps[f"flow:bench{i}:done"] - returned) / 1e9)
        worker.wait(30)
        state.close()
        return lat

    return anyio.run(run, f"step-{uuid.uuid4().hex[:8]}")


def bench_two_writers(url: str, n: int, kind: str = "flood") -> float:
    """Two writer processes, distinct keys, as fast as they go: commits per second in all
    (``kind="raw"``: plain redis-py SETs, the ceiling of two processes on this machine)."""
    call = f"two-{uuid.uuid4().hex[:8]}"
    writers = [role(kind, url, call, n, i) for i in range(2)]
    for w in writers:
        assert line_of(w) == "ready"
    t0 = time.perf_counter()
    for w in writers:
        tell(w)
    for w in writers:
        assert line_of(w) == "done"
    elapsed = time.perf_counter() - t0
    for w in writers:
        w.wait(30)
    return 2 * n / elapsed


def bench_contended(url: str, n: int) -> tuple[int, int, int]:
    """Two processes each adding 1 to a key ``n`` times with modify and ``n // 2`` times with a
    transaction: (expected, modify total, transaction total)."""
    call = f"contended-{uuid.uuid4().hex[:8]}"
    workers = [role("contend", url, call, n) for _ in range(2)]
    for w in workers:
        assert line_of(w) == "ready"
    for w in workers:
        tell(w)
    for w in workers:
        assert line_of(w) == "done"
        w.wait(60)
    with State.connect(url, call) as state:
        return 2 * n, state.get("count"), state.get("tx_count")


def bench_many_calls(url: str, calls: int, rate: int, seconds: float) -> list[float]:
    """This process follows ``calls`` calls; a writer process writes round-robin at ``rate``."""
    prefix = f"many-{uuid.uuid4().hex[:6]}"
    n = int(rate * seconds)
    lat: list[float] = []
    lock = threading.Lock()
    done = threading.Event()

    def seen(changes: Any) -> None:
        now = time.time_ns()
        with lock:
            lat.extend((now - c.new) / 1e9 for c in changes)
            if len(lat) >= n:
                done.set()

    states = []
    for i in range(calls):
        state = State.connect(url, f"{prefix}-{i}")
        state.subscribe(seen, keys=["stamp"])
        states.append(state)
    writer = role("spread", url, prefix, calls, rate, n)
    assert line_of(writer) == "ready"
    tell(writer)
    wait_event(done, seconds * 5 + 60, "the writes to every call")
    writer.wait(60)
    for state in states:
        state.close()
    return lat


# -- the roles (other processes) -------------------------------------------------------------------


def play(name: str, args: list[str]) -> None:
    if name == "writer":  # paced writes of their own time stamp
        url, call, rate, n = args[0], args[1], int(args[2]), int(args[3])
        with State.connect(url, call) as state:
            print("ready", flush=True)
            sys.stdin.readline()
            start = time.perf_counter()
            for i in range(n):
                due = start + i / rate
                while time.perf_counter() < due:
                    pass
                state.set("stamp", time.time_ns())
    elif name == "spread":
        url, prefix, calls, rate, n = args[0], args[1], int(args[2]), int(args[3]), int(args[4])
        states = [State.connect(url, f"{prefix}-{i}") for i in range(calls)]
        print("ready", flush=True)
        sys.stdin.readline()
        start = time.perf_counter()
        for i in range(n):
            due = start + i / rate
            while time.perf_counter() < due:
                pass
            states[i % calls].set("stamp", time.time_ns())
        for state in states:
            state.close()
    elif name == "resolver":
        import anyio

        from slateflow import Resolver, Session

        async def run(url: str, call: str, rounds: int) -> None:
            with State.connect(url, call) as state:
                async with Session(state) as session:
                    for i in range(rounds):
                        returned: list[int] = []

                        async def lookup(
                            state: State, returned: list[int] = returned
                        ) -> dict[str, bool]:
                            returned.append(time.time_ns())
                            return {"open": True}

                        sys.stdin.readline()
                        await session.call(Resolver.fetch(f"lookup{i}", lookup))
                        print(returned[0], flush=True)

        anyio.run(run, args[0], args[1], int(args[2]))
    elif name == "flood":
        url, call, n, who = args[0], args[1], int(args[2]), args[3]
        with State.connect(url, call) as state:
            print("ready", flush=True)
            sys.stdin.readline()
            for i in range(n):
                state.set(f"w{who}:{i % 500}", i)
            print("done", flush=True)
    elif name == "raw":
        import redis

        url, call, n, who = args[0], args[1], int(args[2]), args[3]
        client = redis.Redis.from_url(url)
        client.ping()
        print("ready", flush=True)
        sys.stdin.readline()
        for i in range(n):
            client.set(f"raw:{call}:{who}:{i % 500}", i)
        print("done", flush=True)
    elif name == "contend":
        from slateflow.errors import VersionConflictError

        url, call, n = args[0], args[1], int(args[2])
        with State.connect(url, call) as state:
            print("ready", flush=True)
            sys.stdin.readline()
            for _ in range(n):
                state.modify("count", 0, lambda v: v + 1)
            for _ in range(n // 2):
                while True:
                    try:
                        with state.transaction() as tx:
                            tx.set("tx_count", tx.get("tx_count", 0) + 1)
                        break
                    except VersionConflictError:
                        continue
            print("done", flush=True)
    else:
        raise SystemExit(f"no role {name!r}")


# -- the table -------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a fast smoke run (as in CI)")
    parser.add_argument("--role", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true", help="also print the rows as JSON")
    args = parser.parse_args(argv)
    if args.role:
        play(args.role[0], args.role[1:])
        return 0
    quick = args.quick
    rows: list[Row] = []

    def add(name: str, value: str, target: str = "") -> None:
        rows.append((name, value, target))
        print(f"  {name}: {value}", file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp)
        server = RedisProcess(where / "main", appendonly=True, appendfsync="everysec").start()
        url = server.url
        try:
            times, floor = bench_set(url, 500 if quick else 5_000)
            add("set on a shared State, AOF everysec: p50 / p99",
                f"{us(pct(times, 0.5))} / {us(pct(times, 0.99))}",
                "p50 <= 300 us, p99 <= 1.5 ms")  # fmt: skip
            add("  raw redis-py SET (the floor): p50 / p99",
                f"{us(pct(floor, 0.5))} / {us(pct(floor, 0.99))}", "(peer)")  # fmt: skip
            lat = bench_remote_latency(url, 2_000, 0.5 if quick else 5.0)
            add("remote write -> subscriber in another process, 2,000/s: p50 / p99",
                f"{us(pct(lat, 0.5))} / {ms(pct(lat, 0.99))}",
                "p50 <= 500 us, p99 <= 5 ms")  # fmt: skip
            steps = bench_step_latency(url, 5 if quick else 30)
            add("resolver result in process 1 -> step done in process 2: p50 / p99",
                f"{ms(pct(steps, 0.5))} / {ms(pct(steps, 0.99))}",
                "p50 <= 2 ms, p99 <= 20 ms")  # fmt: skip
            memory, shared = bench_turns(url, 20 if quick else 100)
            add("voice turn, shared vs in memory (median)",
                f"+{ms(shared - memory)} ({ms(shared)} vs {ms(memory)})",
                "<= +5 ms a turn")  # fmt: skip
            rate = bench_two_writers(url, 1_000 if quick else 10_000)
            add("two writer processes, distinct keys", f"{rate:,.0f} commits/s",
                ">= 3,000 commits/s")  # fmt: skip
            raw = bench_two_writers(url, 1_000 if quick else 10_000, "raw")
            add("  two processes of raw redis-py SETs (the ceiling)", f"{raw:,.0f} SETs/s",
                "(peer)")  # fmt: skip
            expected, count, tx_count = bench_contended(url, 500 if quick else 5_000)
            add("contended modify / transaction increments, two processes",
                f"{expected - count} lost of {expected} / {expected // 2 - tx_count} lost of "
                f"{expected // 2}", "0 lost of 10,000 / 5,000")  # fmt: skip
            dropped, commits, keys = bench_lost_replies(server.port, 100 if quick else 1_000)
            add("commits whose reply was lost, applied twice",
                f"{commits - keys} (of {keys}; {dropped} replies lost)",
                "0 applied twice of 1,000")  # fmt: skip
            got, ordered, reconnects = bench_killed_follower(url, 1_000 if quick else 10_000)
            add("follower killed every 100 ms: received, in order",
                f"{got:,}, {ordered} ({reconnects} reconnects)",
                "10,000 received, in order")  # fmt: skip
            add("paused replica catching up 10,000 commits",
                ms(bench_catch_up(url, 1_000 if quick else 10_000)), "<= 0.5 s")  # fmt: skip
            add("a process joining a call of 1,000 keys (best of 5)",
                ms(bench_join(url, 1_000)), "<= 50 ms")  # fmt: skip
            many = bench_many_calls(url, 100 if quick else 1_000, 1_000, 0.5 if quick else 5.0)
            add(f"one process following {100 if quick else 1_000:,} calls, 1,000 writes/s: "
                "p50 / p99", f"{us(pct(many, 0.5))} / {ms(pct(many, 0.99))}",
                "p50 <= 1 ms, p99 <= 5 ms")  # fmt: skip
        finally:
            server.stop()
        n = 200 if quick else 2_000
        for mode, target in (("always", "0 acknowledged commits lost"),
                             ("everysec", "loss bounded and detected"),
                             ("none", "loss detected within 1 s of restart")):  # fmt: skip
            add(f"kill -9 redis-server, AOF {mode}", bench_kill(where, mode, n), target)
    print(f"\nslateflow shared State on Redis (Python {sys.version.split()[0]}, loopback"
          f"{', quick' if quick else ''})")  # fmt: skip
    print(f"{'measure':68} {'value':>34}   target")
    print("-" * 130)
    for name, value, target in rows:
        print(f"{name:68} {value:>34}   {target}")
    if args.json:
        print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    raise SystemExit(main())
