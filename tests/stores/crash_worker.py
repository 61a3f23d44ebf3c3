"""The process the crash test kills: a 10-step durable booking flow with background resolvers.

``run_flow(db, effects, acks, kill_after, durability)`` opens (or recovers) the State in
``db``, runs the flow to completion and exits; with ``kill_after`` it SIGKILLs itself that
many seconds in, wherever it is: inside a commit, inside the store's writer thread, between
a resolver's side effect and its result. Every resolver counts its side effect in the separate
SQLite file ``effects``; every write the worker was told is durable (``state.sync()``
returned, or ``set`` returned under ``durability="sync"``) is appended to ``acks`` as
``seq key`` so the checker can prove no acknowledged write was lost.

Each run is a process forked from a forkserver with slateflow preloaded, so a run costs the
flow, not the interpreter's start-up. ``crash_and_resume`` is one kill-check-resume-check round;
``test_crash.py`` runs 50 of them and ``bench/crash_bench.py`` as many as asked.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import anyio

from slateflow import Flow, Resolver, Session, State, Step, is_true, resolved, run
from slateflow.stores import Durability

STEPS = 10
RESOLVED = [i for i in range(STEPS) if i % 2 == 0]  # steps run by a resolver
ANSWERED = [i for i in range(STEPS) if i % 2 == 1]  # steps the caller answers


def resolver_name(i: int) -> str:
    return f"r{i}"


def user_key(i: int) -> str:
    return f"answer{i}"


class Effects:
    """Counts each resolver's side effect in its own SQLite file (one row per execution)."""

    def __init__(self, path: str) -> None:
        self.conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=FULL")
        self.conn.execute("CREATE TABLE IF NOT EXISTS effects (name TEXT NOT NULL, pid INTEGER)")

    def record(self, name: str) -> None:
        self.conn.execute("INSERT INTO effects VALUES (?, ?)", (name, os.getpid()))


def counts(path: str) -> dict[str, int]:
    """How many times each resolver's side effect happened, across every process."""
    with sqlite3.connect(path) as conn:
        try:
            rows = conn.execute("SELECT name, count(*) FROM effects GROUP BY name").fetchall()
        except sqlite3.OperationalError:
            return {}
    return dict(rows)


def booking(effects: Effects) -> Flow:
    """Ten steps in a chain: even ones are resolved by a resolver (background and dispatch in
    turn, a few milliseconds of work after the side effect), odd ones by the caller."""

    def source(i: int) -> Any:
        async def fetch(state: State) -> Any:
            effects.record(resolver_name(i))
            await anyio.sleep(0.002 + 0.001 * (i % 3))
            return {"step": i, "value": i * i}

        return fetch

    steps = []
    for i in range(STEPS):
        after = [f"s{i - 1}"] if i else []
        if i in RESOLVED:
            resolver = Resolver.fetch(resolver_name(i), source(i))
            mode = "background" if i % 4 == 0 else "dispatch"
            action = (
                run(resolver, "background", deliver=lambda result: None)
                if mode == "background"
                else run(resolver)
            )
            steps.append(Step(f"s{i}", after=after, done=resolved(resolver.name), on_enter=action))
        else:
            steps.append(Step(f"s{i}", after=after, done=is_true(user_key(i))))
    return Flow("booking", steps)


def _ack(fd: int, seq: int, key: str) -> None:
    os.write(fd, f"{seq} {key}\n".encode())


async def _drive(db: str, effects_path: str, acks_path: str, durability: Durability) -> None:
    effects = Effects(effects_path)
    fd = os.open(acks_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    state = State.open(db, durability=durability)
    try:
        async with Session(state) as session:
            runner = booking(effects).start(session)
            for i in ANSWERED:
                await runner.wait_for_step(f"s{i}")
                key = user_key(i)
                if state.get(key) is None:
                    state.set(key, True)
                    if durability != "sync":
                        state.sync()
                    _ack(fd, state.journal.cursor, key)
            await runner.wait_complete()
            await session.wait_idle()
        state.sync()
    finally:
        state.close()
        os.close(fd)


def run_flow(
    db: str,
    effects: str,
    acks: str,
    kill_after: float | None = None,
    durability: Durability = "batch",
    backend: str = "asyncio",
) -> None:
    """Run (or resume) the flow in ``db`` on ``backend``; with ``kill_after``, die by SIGKILL
    that soon."""
    if kill_after is not None:
        timer = threading.Timer(kill_after, os.kill, (os.getpid(), signal.SIGKILL))
        timer.daemon = True
        timer.start()
    anyio.run(_drive, db, effects, acks, durability, backend=backend)


def final_values(db: str) -> dict[str, Any]:
    """The values a user reads back from ``db`` (timestamps and durations vary by run)."""
    state = State.open(db)
    try:
        return {
            key: state.get(key)
            for key in state.keys(prefix="")
            if not key.endswith((":started_at", ":finished_at", ":elapsed", ":marking"))
        }
    finally:
        state.close()


# -- the checker (runs in the parent) ------------------------------------------------------------

_ctx = multiprocessing.get_context("forkserver")
_ctx.set_forkserver_preload(["slateflow", "crash_worker", "trio"])


def process(*args: Any, timeout: float = 60.0) -> int | None:
    """Run ``run_flow(*args)`` in a forked worker and return its exit code (-9: killed)."""
    worker = _ctx.Process(target=run_flow, args=args)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():  # a hung worker is a failure, not a stuck run
        worker.kill()
        worker.join()
        raise AssertionError(f"the crash worker hung with {args}")
    return worker.exitcode


def acknowledged(path: Path) -> list[tuple[int, str]]:
    """The writes a worker was told are durable, as (seq, key)."""
    if not path.exists():
        return []
    return [
        (int(seq), key)
        for seq, key in (line.split() for line in path.read_text().split("\n") if line)
    ]


def check_crashed(db: Path, acks: Path, effects: Path) -> set[str]:
    """Check what a kill left in ``db`` and return the resolvers whose results it holds.

    No acknowledged write is missing, every resolver marked done has its result from the same
    commit (no half-applied batch), and each of those ran exactly once."""
    if not db.exists():
        assert not acknowledged(acks), "writes were acknowledged but there is no file"
        return set()
    state = State.open(db)
    try:
        for seq, key in acknowledged(acks):
            assert state.journal.cursor >= seq, f"acknowledged commit {seq} ({key}) was lost"
            assert state.get(key) is True, f"acknowledged write of {key!r} was lost"
        finished = set()
        for i in RESOLVED:
            name = resolver_name(i)
            status = state.entry(f"{name}:status")
            if status is not None and status.value == "done":
                result = state.entry(f"{name}:result")
                assert result is not None, f"{name} is done without a result"
                assert result.seq == status.seq, f"{name}: half a batch"
                finished.add(name)
    finally:
        state.close()
    ran = counts(str(effects))
    for name in finished:
        assert ran.get(name) == 1, f"{name} finished but its side effect happened {ran.get(name)}x"
    return finished


def uninterrupted(where: Path) -> tuple[dict[str, Any], float]:
    """Run the flow once without a kill: its final values and how long a run took."""
    db, effects, acks = where / "run.db", where / "effects.db", where / "acks"
    started = time.perf_counter()
    assert process(str(db), str(effects), str(acks)) == 0
    seconds = time.perf_counter() - started
    assert counts(str(effects)) == {resolver_name(i): 1 for i in RESOLVED}
    return final_values(str(db)), seconds


def crash_and_resume(
    where: Path, seed: int, seconds: float, expected: dict[str, Any]
) -> dict[str, int]:
    """Kill a run a random time (up to ``seconds``) in, check the file, resume, check the end.

    Returns what happened: killed (0/1), killed mid-flow (0/1), resolvers run twice."""
    rng = random.Random(seed)
    durability: Durability = "sync" if seed % 5 == 0 else "batch"
    # Killed on one event loop, resumed on the other: the file is all that carries over.
    first, then = ("trio", "asyncio") if seed % 2 else ("asyncio", "trio")
    db, effects, acks = where / "run.db", where / "effects.db", where / "acks"
    kill_after = rng.uniform(0.0, seconds)
    code = process(str(db), str(effects), str(acks), kill_after, durability, first)
    assert code in (0, -signal.SIGKILL), f"worker exited with {code}"
    finished = check_crashed(db, acks, effects)

    assert process(str(db), str(effects), str(acks), None, durability, then) == 0
    assert final_values(str(db)) == expected, f"seed {seed}: the resumed run ended elsewhere"
    ran = counts(str(effects))
    for i in RESOLVED:
        name = resolver_name(i)
        assert 1 <= ran.get(name, 0) <= (1 if name in finished else 2), (seed, name, ran)
    killed = code == -signal.SIGKILL
    return {
        "killed": int(killed),
        "killed mid-flow": int(killed and len(finished) < len(RESOLVED)),
        "resolvers run twice": sum(n == 2 for n in ran.values()),
    }


# -- the batch-loss window: a CPU-bound writer killed mid-stream --------------------------------

_SLOTS = 1 << 20  # acknowledgement times of up to a million writes (8 MB, shared by mmap)


def tight_writer(db: str, acks: str, kill_after: float) -> None:
    """Write ``n`` = 1, 2, 3 ... as fast as one thread can under ``durability="batch"``, noting
    when each ``set`` returned (slot n of the mmapped ``acks``, ``CLOCK_MONOTONIC`` ns); slot 0
    takes the time of the SIGKILL this process sends itself ``kill_after`` seconds in."""
    import mmap

    fd = os.open(acks, os.O_RDWR | os.O_CREAT, 0o644)
    os.ftruncate(fd, 8 * _SLOTS)
    slots = memoryview(mmap.mmap(fd, 8 * _SLOTS)).cast("q")

    def kill() -> None:
        slots[0] = time.monotonic_ns()
        os.kill(os.getpid(), signal.SIGKILL)

    state = State.open(db)
    timer = threading.Timer(kill_after, kill)
    timer.daemon = True
    timer.start()
    clock = time.monotonic_ns
    for n in range(1, _SLOTS):
        state.set("n", n)
        slots[n] = clock()
    raise SystemExit(3)  # not killed: kill_after was too long


def loss_window(where: Path, kill_after: float) -> tuple[float, int]:
    """Kill a tight writer ``kill_after`` seconds in; return how long before the kill the oldest
    acknowledged-but-lost write was acknowledged (ms, 0 if none was lost) and how many were."""
    import array

    db, acks = where / "tight.db", where / "tight.acks"
    worker = _ctx.Process(target=tight_writer, args=(str(db), str(acks), kill_after))
    worker.start()
    worker.join(60)
    assert worker.exitcode == -signal.SIGKILL, f"the tight writer exited with {worker.exitcode}"
    slots = array.array("q")
    slots.frombytes(acks.read_bytes())
    killed_at = slots[0]
    acked = next((n - 1 for n in range(1, len(slots)) if slots[n] == 0), len(slots) - 1)
    state = State.open(db)
    try:
        durable = state.get("n") or 0
    finally:
        state.close()
    assert durable <= acked + 1, f"the file holds n={durable}, beyond what was written"
    if durable >= acked:
        return 0.0, 0
    return (killed_at - slots[durable + 1]) / 1e6, acked - durable
