"""The Redis store under faults: lost replies, an unreachable or restarted server, a follower
whose connection is killed, compaction; on real redis-server processes on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from redis_support import RedisProcess, ReplyDropper, redis_process, wait_for_state
from slateflow import State
from slateflow.errors import (
    CommitUnknownError,
    HistoryError,
    StoreDivergedError,
    StoreUnavailableError,
)
from slateflow.stores.redis import RedisStore


def _client(url: str) -> Any:
    import redis

    return redis.Redis.from_url(url, protocol=2)


def test_a_commit_whose_reply_is_lost_is_applied_once(redis_url: str, call_id: str) -> None:
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    proxy = ReplyDropper(port)
    try:
        with State.connect(proxy.url, call_id) as state:
            for i in range(200):
                assert state.set(f"k:{i}", i) == 1  # each reply lost once, then replayed
            assert proxy.dropped >= 200
        with State.connect(redis_url, call_id) as fresh:
            assert fresh.journal.cursor == 200  # one commit each: none applied twice
            assert len(fresh) == 200
            assert [c[0] for c in fresh.store.commits()] == list(range(1, 201))  # type: ignore[union-attr]
    finally:
        proxy.close()


def test_a_commit_that_never_gets_a_reply_is_reported_unknown_and_arrives_later(
    redis_url: str, call_id: str
) -> None:
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    proxy = ReplyDropper(port, every=1)
    try:
        with State.connect(proxy.url, call_id, commit_attempts=2) as state:
            with pytest.raises(CommitUnknownError, match="may have been applied"):
                state.set("k", "v")
            # The server answers reads: the replica caught up, and the commit did run (once).
            assert state.get("k") == "v"
            assert (state.version("k"), state.journal.cursor) == (1, 1)
    finally:
        proxy.close()


def test_a_server_gone_refuses_writes_and_the_replica_keeps_serving(tmp_path: Path) -> None:
    server = RedisProcess(tmp_path).start()
    state = State.connect(server.url, "gone")
    try:
        state.set("k", 1)
        server.kill()
        with pytest.raises(StoreUnavailableError, match="nothing was written"):
            state.set("k", 2)
        assert state.get("k") == 1
        assert state.version("k") == 1
    finally:
        state.close()
        server.stop()


def test_a_follower_whose_connection_is_killed_again_and_again_misses_nothing(
    redis_url: str, call_id: str
) -> None:
    writer = State.connect(redis_url, call_id)
    reader = State.connect(redis_url, call_id)
    got: list[int] = []
    reader.subscribe(lambda changes: got.extend(c.new for c in changes), keys=["n"])
    admin = _client(redis_url)
    try:
        for i in range(1, 501):
            writer.set("n", i)
            if i % 50 == 0:
                admin.client_kill_filter(_type="pubsub")
        wait_for_state(reader, lambda s: s.get("n") == 500, timeout=20)
        assert got == list(range(1, 501))
    finally:
        writer.close()
        reader.close()


def test_a_server_restarted_without_its_data_is_detected_by_every_replica(
    tmp_path: Path,
) -> None:
    server = RedisProcess(tmp_path).start()
    writer = State.connect(server.url, "lost")
    reader = State.connect(server.url, "lost")
    errors: list[Exception] = []
    reader.receiver_failed.connect(lambda _s, **kw: errors.append(kw["error"]), weak=False)
    try:
        writer.update({"a": 1, "b": 2})
        wait_for_state(reader, lambda s: s.get("b") == 2)
        server.kill()
        server.start()  # same port, no persistence: the call is gone
        wait_for_state(reader, lambda s: "a" not in s, timeout=5, what="the reader to resync")
        assert isinstance(errors[0], StoreDivergedError)
        assert "applied up to seq 1" in str(errors[0])
        writer.set("c", 3)  # the writer finds out with its next commit
        assert writer.keys() == ["c"]
        assert writer.journal.cursor == 1
    finally:
        writer.close()
        reader.close()
        server.stop()


@pytest.mark.parametrize("fsync", ["always", "everysec"])
def test_acknowledged_commits_survive_a_killed_server_with_aof(tmp_path: Path, fsync: str) -> None:
    server = RedisProcess(tmp_path, appendonly=True, appendfsync=fsync).start()
    writer = State.connect(server.url, "aof")
    try:
        for i in range(300):
            writer.set(f"k:{i}", i)
        server.kill()
        server.start()
        with State.connect(server.url, "aof") as after:
            if fsync == "always":
                assert after.journal.cursor == 300  # every acknowledged commit is there
            else:  # the last second may be lost: then the writer finds out, not silently
                assert after.journal.cursor <= 300
            writer.sync()
            assert writer.snapshot() == after.snapshot()
    finally:
        writer.close()
        server.stop()


def test_history_reads_and_compaction(redis_url: str, call_id: str) -> None:
    with State.connect(redis_url, call_id) as state:
        for i in range(1, 6):
            state.set("n", i)
        assert state.journal.at(3).get("n") == 3
        state.journal.compact()
        with pytest.raises(HistoryError, match="before the last compaction"):
            state.journal.at(3)
        state.set("n", 6)
        assert state.journal.at(6).get("n") == 6
        with State.connect(redis_url, call_id) as joined:
            assert joined.get("n") == 6


def test_a_replica_behind_a_compaction_resyncs_and_says_so(redis_url: str, call_id: str) -> None:
    first = State.connect(redis_url, call_id)
    store = first.store
    assert isinstance(store, RedisStore)
    second = State.connect(redis_url, call_id)
    errors: list[Exception] = []
    second.receiver_failed.connect(lambda _s, **kw: errors.append(kw["error"]), weak=False)
    try:
        second.store.close()  # type: ignore[union-attr]  # stop following: it falls behind
        for i in range(10):
            first.set("n", i)
        first.journal.compact()
        replica = second.engine.shared
        assert replica is not None
        replica.sync()
        assert second.get("n") == 9
        assert replica.resyncs == 1
        assert "compacted past this replica" in str(errors[0])
    finally:
        first.close()
        second.close()


def test_checkpoints_live_on_the_call(redis_url: str, call_id: str) -> None:
    store = RedisStore(redis_url, call_id)
    assert store.load_checkpoint("w") is None
    store.save_checkpoint("w", '{"done": 1}')
    assert RedisStore(redis_url, call_id).load_checkpoint("w") == '{"done": 1}'
    store.delete_checkpoint("w")
    assert store.load_checkpoint("w") is None


def test_call_ids_that_cannot_be_a_hash_tag_are_refused(redis_url: str) -> None:
    for bad in ["", "a{b", "a b", "x}"]:
        with pytest.raises(ValueError, match="call id"):
            State.connect(redis_url, bad)


@pytest.fixture
def aof_server(tmp_path: Path) -> Iterator[RedisProcess]:
    with redis_process(tmp_path, appendonly=True, appendfsync="always") as server:
        yield server


def test_replay_reads_a_call_from_redis_as_from_a_file(
    redis_url: str, call_id: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from slateflow.__main__ import main

    with State.connect(redis_url, call_id) as state:
        state.policy("user:card", secret=True)
        state.set("booking:time", "19:00", source="extraction", writer="slots")
        state.set("user:card", "4111 1111")
        state.set("booking:time", "19:30")
    assert main(["replay", redis_url, "--call", call_id]) == 0
    out = capsys.readouterr().out
    assert f"{redis_url} call {call_id}: seq 1 to 4" in out
    assert "booking:time  (new) -> \"19:00\"  v1  extraction/slots" in out
    assert "\"19:00\" -> \"19:30\"  v2" in out
    assert "4111" not in out  # a secret key stays masked
    assert main(["replay", redis_url, "--call", "no-such-call"]) == 2
    assert "no call 'no-such-call'" in capsys.readouterr().err
    assert main(["replay", redis_url]) == 2
    assert "--call" in capsys.readouterr().err


def test_a_commit_brings_back_the_commits_its_proposer_had_not_applied(
    redis_url: str, call_id: str
) -> None:
    from slateflow.stores.shared import Committed, Proposal, ProposedChange

    def proposal(commit_id: str, key: str, after: int) -> Proposal:
        change = ProposedChange(key, 1, False, "user", None, None, None)
        return Proposal(commit_id, 1, "set", [change], {}, after)

    first, second = RedisStore(redis_url, call_id), RedisStore(redis_url, call_id)
    try:
        for i in range(3):
            assert isinstance(first.propose(proposal(f"a{i}", f"a{i}", i)), Committed)
        outcome = second.propose(proposal("b0", "b", 1))  # it has applied seq 1 only
        assert isinstance(outcome, Committed)
        assert outcome.seq == 4
        assert [(m.seq, m.commit_id) for m in outcome.missed] == [(2, "a1"), (3, "a2")]
        assert outcome.missed[1].prev == "a1"
        up_to_date = second.propose(proposal("b1", "c", 4))
        assert isinstance(up_to_date, Committed)
        assert up_to_date.missed == ()
    finally:
        first.close()
        second.close()
