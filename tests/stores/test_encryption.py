"""Encryption at rest: with an encryption key, the values of secret keys never reach the file in
clear; they come back exactly with the key, the file refuses to open without it, and replay
shows them as ***."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slateflow import State
from slateflow.errors import StoreError
from slateflow.replay import replay
from slateflow.state.policy import Policy
from slateflow.state.sealing import SealedStore, new_key

CARD = "4111111111111111"


def secret_policy() -> Policy:
    policy = Policy()
    state = State(policy=policy)
    state.policy("card:*", secret=True)
    return policy


def on_disk(path: Path) -> bytes:
    """Every byte of the store: the main file and its -wal."""
    data = b""
    for suffix in ("", "-wal"):
        part = Path(f"{path}{suffix}")
        if part.exists():
            data += part.read_bytes()
    return data


def write_call(path: Path, key: str) -> None:
    with State.open(path, policy=secret_policy(), encryption_key=key) as state:
        state.set("card:number", CARD)
        state.set("card:meta", {"brand": "visa", "last4": [1, 1, 1, 1]})
        state.set("booking:size", 4)
        state.sync()
        assert CARD.encode() not in on_disk(path)  # not even in the WAL while open


def test_secret_values_never_reach_the_file_in_clear(tmp_path: Path) -> None:
    path = tmp_path / "call.db"
    write_call(path, new_key())
    data = on_disk(path)
    assert CARD.encode() not in data
    assert b"visa" not in data
    assert b"booking:size" in data  # other keys are stored as they were


def test_the_key_opens_them_exactly(tmp_path: Path) -> None:
    path = tmp_path / "call.db"
    key = new_key()
    write_call(path, key)
    with State.open(path, policy=secret_policy(), encryption_key=key) as state:
        assert state.get("card:number") == CARD
        assert state.get("card:meta") == {"brand": "visa", "last4": [1, 1, 1, 1]}
        assert state.get("booking:size") == 4
        assert isinstance(state.store, SealedStore)
        assert state.journal.at(2).get("card:number") == CARD  # history (1: the secrets)


def test_without_the_key_the_file_refuses_to_open_naming_the_key(tmp_path: Path) -> None:
    path = tmp_path / "call.db"
    write_call(path, new_key())
    with pytest.raises(StoreError, match=r"call\.db.*encrypted secret values.*'card:"):
        State.open(path)
    with pytest.raises(StoreError, match="cannot be decrypted with the encryption_key"):
        State.open(path, encryption_key=new_key())  # another key


def test_replay_without_the_key_shows_stars(tmp_path: Path) -> None:
    path = tmp_path / "call.db"
    write_call(path, new_key())
    lines = "\n".join(replay(path))
    assert "card:number  (new) -> ***" in lines
    assert CARD not in lines
    assert "booking:size  (new) -> 4" in lines
    records = [json.loads(line) for line in replay(path, as_json_lines=True)]
    values = [c["new"] for r in records for c in r.get("changes", []) if c["key"] == "card:number"]
    assert values == ["***"]


def test_a_rotated_key_opens_old_values_and_seals_new_ones(tmp_path: Path) -> None:
    path = tmp_path / "call.db"
    old, new = new_key(), new_key()
    write_call(path, old)
    with State.open(path, policy=secret_policy(), encryption_key=[new, old]) as state:
        assert state.get("card:number") == CARD
        state.set("card:number", "5555444433331111")
        state.journal.compact()  # every value now sealed with the new key
    with State.open(path, policy=secret_policy(), encryption_key=new) as state:
        assert state.get("card:number") == "5555444433331111"
        assert state.get("card:meta")["brand"] == "visa"


def test_a_value_that_looks_like_a_seal_is_not_taken_for_one(tmp_path: Path) -> None:
    path = tmp_path / "call.db"
    key = new_key()
    lookalikes = [{"$sealed": "not a token"}, {"$sealed-escaped": 1}, {"$sealed": 5}]
    with State.open(path, policy=secret_policy(), encryption_key=key) as state:
        for n, value in enumerate(lookalikes):
            state.set(f"notes:{n}", value)
            state.set(f"card:{n}", value)
        state.journal.compact()
        state.set("notes:after", lookalikes[0])
    with State.open(path, policy=secret_policy(), encryption_key=key) as state:
        for n, value in enumerate(lookalikes):
            assert state.get(f"notes:{n}") == value
            assert state.get(f"card:{n}") == value
        assert state.get("notes:after") == lookalikes[0]


@pytest.mark.parametrize("bad", ["not a key", b"short", [], 5])
def test_a_bad_key_is_refused_before_the_file_is_touched(tmp_path: Path, bad: Any) -> None:
    path = tmp_path / "call.db"
    with pytest.raises(StoreError, match="encryption_key"):
        State.open(path, encryption_key=bad)
    assert not path.exists()


def test_a_secret_policy_on_a_file_without_a_key_warns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with (
        caplog.at_level(logging.WARNING, logger="slateflow.state"),
        State.open(tmp_path / "clear.db") as state,
    ):
        state.policy("card:*", secret=True)
    assert "will be stored in clear" in caplog.text
    caplog.clear()
    with (
        caplog.at_level(logging.WARNING, logger="slateflow.state"),
        State.open(tmp_path / "sealed.db", encryption_key=new_key()) as state,
    ):
        state.policy("card:*", secret=True)
    assert "in clear" not in caplog.text


def test_checkpoints_pass_through_a_sealed_store(tmp_path: Path) -> None:
    with State.open(tmp_path / "call.db", encryption_key=new_key()) as state:
        store = state.store
        assert isinstance(store, SealedStore)
        store.save_checkpoint("wf", '{"x": 1}')
        assert store.load_checkpoint("wf") == '{"x": 1}'
        store.delete_checkpoint("wf")
        assert store.load_checkpoint("wf") is None
        assert store.path == tmp_path / "call.db"


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)

KEY = new_key()


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(value=JSON)
def test_any_value_round_trips_sealed(tmp_path: Path, value: Any) -> None:
    path = tmp_path / "round.db"
    path.unlink(missing_ok=True)
    with State.open(path, policy=secret_policy(), encryption_key=KEY) as state:
        state.set("card:x", value)
    with State.open(path, policy=secret_policy(), encryption_key=KEY) as again:
        stored = again.get("card:x")
    assert json.dumps(stored, sort_keys=True) == json.dumps(value, sort_keys=True)


def test_a_file_written_without_a_key_may_hold_seal_look_alikes(tmp_path: Path) -> None:
    path = tmp_path / "clear.db"
    with State.open(path) as state:
        state.set("notes:odd", {"$sealed": "not a token"})
    with State.open(path) as again:  # not taken for an encrypted value
        assert again.get("notes:odd") == {"$sealed": "not a token"}


# -- a secret declared late ------------------------------------------------------------------


def test_a_secret_declared_late_is_sealed_on_disk_at_once_history_and_all(tmp_path: Path) -> None:
    path = tmp_path / "call.db"
    key = new_key()
    with State.open(path, encryption_key=key) as state:
        state.set("card:number", CARD)  # not secret yet: stored in clear
        state.set("booking:size", 4)
        state.sync()
        assert CARD.encode() in on_disk(path)
        state.policy("card:*", secret=True)
        assert CARD.encode() not in on_disk(path)  # sealed as it was declared
        state.set("card:number", "4000000000000002")  # written again: sealed too
        state.sync()
        assert CARD.encode() not in on_disk(path)
        assert b"4000000000000002" not in on_disk(path)
        assert state.journal.at(1).get("card:number") == CARD  # history kept, opened by the key
    with State.open(path, encryption_key=key) as again:  # digests re-chained: it opens
        assert again.get("card:number") == "4000000000000002"
        assert again.journal.at(1).get("card:number") == CARD
        assert again.get("booking:size") == 4


def test_a_secret_declared_late_after_compaction_seals_the_base(tmp_path: Path) -> None:
    path = tmp_path / "call.db"
    key = new_key()
    with State.open(path, encryption_key=key) as state:
        state.set("card:number", CARD)
        state.set("booking:size", 4)
        state.journal.compact()
        state.set("booking:size", 5)
        state.policy("card:*", secret=True)
        assert CARD.encode() not in on_disk(path)
    with State.open(path, encryption_key=key) as again:
        assert again.get("card:number") == CARD
        assert again.get("booking:size") == 5


def test_declaring_the_same_secret_again_after_a_restart_rewrites_nothing(tmp_path: Path) -> None:
    path = tmp_path / "call.db"
    key = new_key()
    with State.open(path, encryption_key=key) as state:
        state.policy("card:*", secret=True)
        state.set("card:number", CARD)
    before = path.read_bytes()
    with State.open(path, encryption_key=key) as again:
        store = again.store
        assert isinstance(store, SealedStore)
        again.policy("card:*", secret=True)
        assert store.reseal() == 0
        assert again.get("card:number") == CARD
    assert CARD.encode() not in before


def test_a_compacted_clear_value_leaves_the_file(tmp_path: Path) -> None:
    path = tmp_path / "call.db"
    with State.open(path) as state:
        state.set("note", "call me at 555-0199")
        state.set("note", "done")
        state.journal.compact()
        assert b"555-0199" not in on_disk(path)


@pytest.mark.parametrize(
    ("key", "pattern"),
    [("card:number", "*:number"), ("carte:numéro", "carte:*"), ("карта:номер", "карта:*")],
)
def test_a_late_secret_is_sealed_whatever_its_pattern_or_alphabet(
    tmp_path: Path, key: str, pattern: str
) -> None:
    path = tmp_path / "call.db"
    with State.open(path, encryption_key=new_key()) as state:
        state.set(key, CARD)
        state.sync()
        state.policy(pattern, secret=True)
        assert CARD.encode() not in on_disk(path)
