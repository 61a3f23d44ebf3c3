"""Thread safety: atomic ``modify``, exactly-once ordered delivery under concurrent writers, and
optimistic transactions that never lose an update."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from helpers import THREADS, run_threads
from slateflow import Change, State
from slateflow.errors import VersionConflictError
from slateflow.state import MemorySink

pytestmark = pytest.mark.threads


def test_concurrent_modify_never_loses_an_increment() -> None:
    state = State(journal_size=0)
    per_thread = 10_000

    def work(i: int) -> None:
        for _ in range(per_thread):
            state.modify("counter", 0, lambda v: v + 1)

    run_threads(work)
    assert state.get("counter") == THREADS * per_thread
    assert state.version("counter") == THREADS * per_thread
    assert state.journal.cursor == THREADS * per_thread


def test_concurrent_modify_of_a_container() -> None:
    state = State()
    per_thread = 60

    def work(i: int) -> None:
        for j in range(per_thread):
            state.modify("log", [], lambda items, i=i, j=j: [*items, [i, j]])

    run_threads(work)
    items = state.get("log")
    assert len(items) == THREADS * per_thread
    for i in range(THREADS):
        assert [j for t, j in items if t == i] == list(range(per_thread))


def test_concurrent_sets_are_delivered_exactly_once_in_seq_order() -> None:
    per_thread = 2_000
    sink = MemorySink()
    state = State(sinks=[sink], journal_size=0)
    everything: list[Change] = []
    by_pattern: list[Change] = []
    one_key: list[Change] = []
    batches: list[int] = []
    signalled: list[Change] = []

    def everything_cb(changes: tuple[Change, ...]) -> None:
        everything.extend(changes)
        batches.append(len(changes))

    def on_signal(sender: State, changes: tuple[Change, ...]) -> None:
        signalled.extend(changes)

    state.changed.connect(on_signal)
    state.subscribe(everything_cb)
    state.subscribe(by_pattern.extend, pattern="t3:*")
    state.subscribe(one_key.extend, keys=["shared"])

    def work(i: int) -> None:
        for j in range(per_thread):
            if j % 10 == 0:
                state.update({f"t{i}:a": j, f"t{i}:b": j})
            elif j % 7 == 0:
                state.set("shared", [i, j])
            else:
                state.set(f"t{i}:{j % 5}", j)

    run_threads(work)

    committed = sink.changes
    assert committed, "nothing was committed"
    assert state.journal.cursor == committed[-1].seq

    # Every committed change reached every matching receiver exactly once, in commit order.
    def ids(changes: list[Change]) -> list[tuple[str, int, int]]:
        return [(c.key, c.seq, c.version) for c in changes]

    assert ids(everything) == ids(committed)
    assert ids(signalled) == ids(committed)
    assert ids(by_pattern) == ids([c for c in committed if c.key.startswith("t3:")])
    assert ids(one_key) == ids([c for c in committed if c.key == "shared"])
    for received in (everything, by_pattern, one_key):
        got = [c.seq for c in received]
        assert got == sorted(got)
    # Batches stayed whole: one callback per committed batch.
    assert len(batches) == len({c.seq for c in committed})
    # The last delivered value of each key is the stored one.
    last: dict[str, Any] = {}
    for c in everything:
        last[c.key] = c.new
    assert last == dict(state.items())


def test_subscriber_writes_under_concurrency_are_all_delivered() -> None:
    """Receivers that write while other threads write: nothing is lost or duplicated."""
    per_thread = 500
    state = State()
    echoes: list[Change] = []
    seen: list[Change] = []

    def echo(changes: tuple[Change, ...]) -> None:
        for c in changes:
            state.set(f"echo:{c.key}", c.new)

    state.subscribe(echo, pattern="src:*")
    state.subscribe(echoes.extend, pattern="echo:*")
    state.subscribe(seen.extend)

    def work(i: int) -> None:
        for j in range(per_thread):
            state.set(f"src:{i}", j)

    run_threads(work)
    assert len(echoes) == len({(c.key, c.seq) for c in echoes})
    for i in range(THREADS):
        assert state.get(f"echo:src:{i}") == per_thread - 1
    seqs = [c.seq for c in seen]
    assert seqs == sorted(seqs)
    assert len(seqs) == len(set(seqs)) == state.journal.cursor


def test_concurrent_transactions_commit_or_conflict_never_lose_updates() -> None:
    sink = MemorySink()
    state = State(sinks=[sink])
    per_thread = 300

    def work(i: int) -> tuple[int, int]:
        commits = conflicts = 0
        while commits < per_thread:
            try:
                with state.transaction() as tx:
                    value = tx.get("counter", 0)
                    tx.set("counter", value + 1)
                    tx.set(f"last:{i}", value + 1)
            except VersionConflictError:
                conflicts += 1
            else:
                commits += 1
        return commits, conflicts

    results = run_threads(work)
    total_commits = sum(c for c, _ in results)
    assert total_commits == THREADS * per_thread
    assert state.get("counter") == total_commits
    assert state.version("counter") == total_commits
    # Each committed transaction wrote the counter once: the journal shows a +1 chain, and
    # each commit's batch holds the counter and that thread's last:<i> with the same value.
    history = [m.new for m in sink.changes if m.key == "counter"]
    assert history == list(range(1, total_commits + 1))
    batches: dict[int, dict[str, Any]] = {}
    for m in sink.changes:
        batches.setdefault(m.seq, {})[m.key] = m.new
    assert all(len(b) == 2 for b in batches.values())
    assert all(sorted(set(b.values())) == [b["counter"]] for b in batches.values())


def test_conflicting_transaction_writes_nothing() -> None:
    state = State()
    state.set("counter", 0)
    inside = threading.Event()
    proceed = threading.Event()
    outcome: list[BaseException | None] = []

    def slow_tx() -> None:
        try:
            with state.transaction() as tx:
                value = tx.get("counter")
                tx.set("counter", value + 100)
                tx.set("other", "written")
                inside.set()
                assert proceed.wait(10)
        except BaseException as exc:
            outcome.append(exc)
        else:
            outcome.append(None)

    t = threading.Thread(target=slow_tx)
    t.start()
    assert inside.wait(10)
    state.set("counter", 1)  # another writer changes what the transaction read
    proceed.set()
    t.join()
    assert len(outcome) == 1
    assert isinstance(outcome[0], VersionConflictError)
    assert "counter" in str(outcome[0])
    assert state.get("counter") == 1
    assert "other" not in state
    assert state.journal.cursor == 2


def test_transaction_is_private_to_its_thread() -> None:
    state = State()
    inside = threading.Event()
    proceed = threading.Event()
    seen_from_other_thread: list[Any] = []

    def tx_thread() -> None:
        with state.transaction():
            state.set("a", 1)  # buffered in this thread's transaction
            inside.set()
            assert proceed.wait(10)

    t = threading.Thread(target=tx_thread)
    t.start()
    assert inside.wait(10)
    seen_from_other_thread.append(state.get("a"))
    state.set("b", 2)  # not captured by the other thread's transaction
    seen_from_other_thread.append(state.journal.cursor)
    proceed.set()
    t.join()
    assert seen_from_other_thread == [None, 1]
    assert state.get("a") == 1
    assert state.journal.cursor == 2


def test_compare_and_set_retry_loop_never_loses_updates() -> None:
    state = State()
    per_thread = 500

    def work(i: int) -> int:
        conflicts = 0
        for _ in range(per_thread):
            while True:
                version = state.version("n")
                value = state.get("n", 0)
                try:
                    state.set("n", value + 1, expected_version=version)
                except VersionConflictError:
                    conflicts += 1
                else:
                    break
        return conflicts

    run_threads(work)
    assert state.get("n") == THREADS * per_thread


@pytest.mark.parametrize("size", [0, 16])
def test_journal_under_concurrency_has_no_gaps(size: int) -> None:
    sink = MemorySink()
    state = State(journal_size=size, sinks=[sink])
    per_thread = 1_000

    def work(i: int) -> None:
        for j in range(per_thread):
            state.set(f"k{i}", j)

    run_threads(work)
    assert [m.seq for m in sink.changes] == list(range(1, THREADS * per_thread + 1))
    assert state.journal.since(state.journal.cursor) == []
    if size:
        recent = state.journal.since(state.journal.cursor - size)
        assert [m.seq for m in recent] == list(
            range(state.journal.cursor - size + 1, state.journal.cursor + 1)
        )
