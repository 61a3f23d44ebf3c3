"""A State shared on a real redis-server: replicas in one process, each with its own commit
path and replica (as two processes would have), the server deciding order and versions."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from redis_support import wait_for_state
from slateflow import State
from slateflow.errors import (
    PolicyViolation,
    StoreClosedError,
    StoreUnavailableError,
    VersionConflictError,
)


@pytest.fixture
def pair(redis_url: str, call_id: str) -> Iterator[tuple[State, State]]:
    first = State.connect(redis_url, call_id)
    second = State.connect(redis_url, call_id)
    yield first, second
    first.close()
    second.close()


def test_a_write_in_one_replica_reaches_the_subscribers_of_the_other(
    pair: tuple[State, State],
) -> None:
    first, second = pair
    seen: list[tuple[str, Any, int]] = []
    second.subscribe(lambda changes: seen.extend((c.key, c.new, c.seq) for c in changes))
    first.set("booking:date", "Saturday")
    first.update({"booking:time": "19:00", "booking:party_size": 4})
    wait_for_state(second, lambda s: s.get("booking:party_size") == 4)
    assert seen == [
        ("booking:date", "Saturday", 1),
        ("booking:time", "19:00", 2),
        ("booking:party_size", 4, 2),
    ]
    assert second.snapshot() == first.snapshot()
    assert second.provenance("booking:date") == first.provenance("booking:date")


def test_the_server_decides_seq_and_versions_across_replicas(pair: tuple[State, State]) -> None:
    first, second = pair
    assert first.set("k", 1) == 1
    assert second.set("k", 2) == 2  # the second replica had not seen version 1: the server had
    wait_for_state(first, lambda s: s.get("k") == 2)
    assert first.version("k") == second.version("k") == 2
    assert first.journal.cursor == second.journal.cursor == 2


def test_an_equal_value_is_no_change_even_written_as_a_reordered_dict(
    pair: tuple[State, State],
) -> None:
    first, _ = pair
    first.set("x", {"b": 1, "a": [1.0, True]})
    seq = first.journal.cursor
    assert first.set("x", {"a": [1.0, True], "b": 1}) == 1
    assert first.journal.cursor == seq
    assert first.set("x", {"a": [1, True], "b": 1}) == 2  # 1.0 and 1 differ, as locally


def test_a_conditional_write_against_a_stale_replica_conflicts_and_changes_nothing(
    pair: tuple[State, State],
) -> None:
    first, second = pair
    first.set("k", "a")
    wait_for_state(second, lambda s: s.get("k") == "a")
    second.set("k", "b")
    with pytest.raises(VersionConflictError, match="'k' is at version 2, not the expected 1"):
        first.set("k", "c", expected_version=1)
    # The conflict left the replica up to date (the other's commit, nothing of its own).
    assert (first.get("k"), first.version("k"), first.journal.cursor) == ("b", 2, 2)
    assert first.set("k", "c", expected_version=2) == 3


def test_modify_from_two_replicas_in_threads_loses_no_update(pair: tuple[State, State]) -> None:
    first, second = pair
    calls = [0, 0]

    def bump(state: State, slot: int) -> None:
        for _ in range(200):

            def add(value: int) -> int:
                calls[slot] += 1
                return value + 1

            state.modify("count", 0, add)

    threads = [threading.Thread(target=bump, args=(s, i)) for i, s in enumerate(pair)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    first.sync()
    second.sync()
    assert first.get("count") == second.get("count") == 400
    assert sum(calls) >= 400  # a function may run again after a conflict, never lose one


def test_a_transaction_whose_read_changed_elsewhere_conflicts_and_writes_nothing(
    pair: tuple[State, State],
) -> None:
    first, second = pair
    first.set("balance", 10)
    wait_for_state(second, lambda s: s.get("balance") == 10)
    tx = second.transaction()
    with tx:
        seen = tx.get("balance")
        first.set("balance", 20)  # another process, between the read and the commit
        tx.set("balance", seen - 5)
        tx.set("audit", "spent 5")
        with pytest.raises(VersionConflictError, match=r"'balance'.*run the transaction again"):
            tx.commit()
    second.sync()
    assert second.get("balance") == 20
    assert "audit" not in second
    with second.transaction() as tx:
        tx.set("balance", tx.get("balance") - 5)
    assert second.get("balance") == 15


def test_remove_rename_and_clear_prefix_act_on_the_servers_version(
    pair: tuple[State, State],
) -> None:
    first, second = pair
    first.update({"slot:a": 1, "slot:b": 2, "keep": 3})
    second.sync()
    assert second.remove("slot:a") == 1
    first.set("slot:c", 4)  # made after second's last catch-up
    assert second.rename("keep", "kept") == 1
    assert second.clear_prefix("slot:") == 2  # slot:b, and slot:c it had not seen yet
    first.sync()
    assert sorted(first.keys()) == ["kept"]


def test_a_new_replica_joins_with_every_key_version_and_provenance(
    redis_url: str, call_id: str
) -> None:
    with State.connect(redis_url, call_id) as first:
        for i in range(50):
            first.set(f"k:{i}", {"n": i}, source="tool", writer="w", confidence=0.5)
        first.remove("k:0")
        with State.connect(redis_url, call_id) as joined:
            assert joined.snapshot() == first.snapshot()
            assert joined.journal.cursor == first.journal.cursor


def test_a_replica_reports_a_commit_its_policy_would_refuse_and_applies_it(
    redis_url: str, call_id: str
) -> None:
    guarded = State.connect(redis_url, call_id)
    guarded.policy("booking:*", writers=["booker"])
    lax = State.connect(redis_url, call_id)
    failures: list[Exception] = []
    guarded.receiver_failed.connect(lambda _s, **kw: failures.append(kw["error"]), weak=False)
    try:
        with pytest.raises(PolicyViolation):
            guarded.set("booking:time", "19:00")  # refused here, nothing sent
        lax.set("booking:time", "19:00")  # this process has no such rule
        wait_for_state(guarded, lambda s: s.get("booking:time") == "19:00")
        assert len(failures) == 1
        assert isinstance(failures[0], PolicyViolation)
        assert "booking:time" in str(failures[0])
    finally:
        guarded.close()
        lax.close()


def test_an_unreachable_server_refuses_writes_and_keeps_serving_reads(call_id: str) -> None:
    from redis_support import free_port

    with pytest.raises(StoreUnavailableError, match="cannot be reached"):
        State.connect(f"redis://127.0.0.1:{free_port()}/0", call_id)


def test_writes_after_close_are_refused(redis_url: str, call_id: str) -> None:
    state = State.connect(redis_url, call_id)
    state.set("a", 1)
    state.close()
    with pytest.raises(StoreClosedError, match=r"State\.connect again"):
        state.set("a", 2)
    assert state.get("a") == 1


@pytest.mark.anyio
async def test_a_process_connecting_later_resumes_the_calls_flow_where_it_stands(
    redis_url: str, call_id: str
) -> None:
    from slateflow import Flow, Session, Step, is_set

    def plan() -> Flow:
        return Flow(
            "booking",
            [
                Step("slot", done=is_set("booking:time")),
                Step("confirm", after=["slot"], done=is_set("booking:confirmed")),
                Step("goodbye", after=["confirm"], terminal=True),
            ],
        )

    with State.connect(redis_url, call_id) as first:
        async with Session(first) as session:
            runner = plan().start(session)
            first.set("booking:time", "19:30")
            await first.wait_until(lambda _s: "confirm" in runner.active_steps, timeout=10)
    # The first process is gone; a second one connects to the call and runs the same flow.
    with State.connect(redis_url, call_id) as second:
        async with Session(second) as session:
            runner = plan().start(session)
            assert runner.done_steps == ["slot"]
            assert runner.active_steps == ["confirm"]
            second.set("booking:confirmed", True)
            await second.wait_until(lambda _s: runner.is_complete, timeout=10)
