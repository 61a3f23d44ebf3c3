"""A shared State written by several real processes at once, and random interleavings of
``modify`` and transactions between two replicas checked against a model."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slateflow import State
from slateflow.errors import VersionConflictError

WORKER = Path(__file__).with_name("shared_worker.py")


def test_contended_increments_from_two_processes_lose_nothing(
    redis_url: str, call_id: str
) -> None:
    n = 300
    workers = [
        subprocess.Popen([sys.executable, str(WORKER), redis_url, call_id, str(n)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]  # fmt: skip
    try:
        for worker in workers:
            assert worker.stdout is not None
            assert worker.stdout.readline().strip() == "ready"
        for worker in workers:
            assert worker.stdin is not None
            worker.stdin.write("go\n")
            worker.stdin.flush()
        outputs = [worker.communicate(timeout=120)[0] for worker in workers]
    finally:
        for worker in workers:
            worker.kill() if worker.poll() is None else None
    assert all(w.returncode == 0 for w in workers), outputs
    with State.connect(redis_url, call_id) as state:
        assert state.get("count") == 2 * n
        assert state.get("tx_count") == 2 * n
        assert state.version("count") == 2 * n  # one commit per increment, none twice


ops = st.lists(
    st.tuples(st.sampled_from([0, 1]), st.sampled_from(["modify", "tx", "set", "sync"]),
              st.integers(1, 5)),
    max_size=30,
)  # fmt: skip


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
          HealthCheck.function_scoped_fixture])  # fmt: skip
@given(sequence=ops)
def test_modify_and_transactions_from_two_replicas_agree_with_a_model(
    redis_url: str, sequence: list[tuple[int, str, int]]
) -> None:
    import uuid

    call_id = f"model-{uuid.uuid4().hex}"
    replicas = [State.connect(redis_url, call_id), State.connect(redis_url, call_id)]
    total = 0  # the model: the value every replica must reach
    try:
        for who, op, amount in sequence:
            state = replicas[who]
            if op == "modify":
                state.modify("n", 0, lambda v, a=amount: v + a)  # type: ignore[misc]
                total += amount
            elif op == "tx":
                while True:  # the replica may be stale: the read check decides
                    try:
                        with state.transaction() as tx:
                            tx.set("n", tx.get("n", 0) + amount)
                        break
                    except VersionConflictError:
                        continue
                total += amount
            elif op == "set":
                state.set("n", amount * 100)  # a blind write wins over everything before it
                total = amount * 100
            else:
                state.sync()
        for state in replicas:
            state.sync()
            assert state.get("n", 0) == total
        assert replicas[0].snapshot() == replicas[1].snapshot()
    finally:
        for state in replicas:
            state.close()
