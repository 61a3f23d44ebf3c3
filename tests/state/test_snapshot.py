"""Snapshots: JSON-ready dumps of the whole state, and exact restores."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from typing import Any

import pytest

from slateflow import State
from slateflow.errors import SnapshotError
from slateflow.state import SECRET_MASK, SNAPSHOT_FORMAT, Provenance

T0 = 1_700_000_000.0


def sample_state() -> State:
    """A state with history: versions above 1, removals, rich provenance, odd values."""
    ticks = iter(range(1000))
    state = State(clock=lambda: T0 + next(ticks))
    state.set("booking:date", "2024-05-01", source="llm", writer="extract", confidence=0.8)
    state.set("booking:date", "2024-05-02", source="user", meta={"turn": 3, "ok": True})
    state.set("booking:party_size", 4)
    state.update({"flags": [1, 1.0, True, None, -0.0], "nested": {"a": {"b": [{}]}}}, writer="w")
    state.set("gone", 1)
    state.remove("gone")
    state.set("user:card", "4111", source="user")
    state.set("score", 0.1 + 0.2, confidence=1)
    state.set("big", 2**80)
    return state


def as_json(snapshot: dict[str, Any]) -> str:
    return json.dumps(snapshot, allow_nan=False)


def test_snapshot_shape() -> None:
    state = sample_state()
    snap = state.snapshot()
    assert snap["format"] == SNAPSHOT_FORMAT
    assert snap["seq"] == state.journal.cursor == 9
    assert snap["redacted"] is False
    assert list(snap["entries"]) == state.keys()
    entry = snap["entries"]["booking:date"]
    assert entry["value"] == "2024-05-02"
    assert entry["version"] == 2
    assert entry["seq"] == 2
    assert entry["provenance"]["source"] == "user"
    assert entry["provenance"]["meta"] == {"turn": 3, "ok": True}
    assert Provenance.model_validate(entry["provenance"]) == state.provenance("booking:date")
    assert "gone" not in snap["entries"]


def test_snapshot_of_empty_state() -> None:
    snap = State().snapshot()
    assert snap == {"format": SNAPSHOT_FORMAT, "seq": 0, "redacted": False, "entries": {}}
    restored = State.restore(snap)
    assert len(restored) == 0
    assert restored.journal.cursor == 0


def test_snapshot_is_json_ready() -> None:
    snap = sample_state().snapshot()
    text = as_json(snap)
    assert json.loads(text) == snap


def test_snapshot_is_a_private_copy() -> None:
    state = sample_state()
    snap = state.snapshot()
    snap["entries"]["nested"]["value"]["a"]["b"].append("leak")
    snap["entries"]["booking:date"]["provenance"]["meta"]["turn"] = 99
    snap["entries"].clear()
    assert state.get("nested") == {"a": {"b": [{}]}}
    assert state.provenance("booking:date").meta == {"turn": 3, "ok": True}


def assert_same_state(a: State, b: State) -> None:
    assert as_json(a.snapshot()) == as_json(b.snapshot())
    assert a.journal.cursor == b.journal.cursor
    keys = a.keys()
    assert keys == b.keys()
    for key in keys:
        assert a.entry(key) == b.entry(key)
        assert as_json(a.get(key)) == as_json(b.get(key))


@pytest.mark.parametrize("through_json", [False, True])
def test_restore_round_trips_exactly(through_json: bool) -> None:
    state = sample_state()
    snap = state.snapshot()
    if through_json:
        snap = json.loads(as_json(snap))
    restored = State.restore(snap)
    assert_same_state(state, restored)
    assert restored.get("flags") == [1, 1.0, True, None, -0.0]
    assert [type(v) for v in restored.get("flags")] == [int, float, bool, type(None), float]
    assert str(restored.get("flags")[-1]) == "-0.0"
    assert restored.get("big") == 2**80
    assert restored.get("score") == 0.1 + 0.2
    prov = restored.provenance("score")
    assert prov.confidence == 1.0
    assert prov.at == datetime.fromtimestamp(T0 + 7, tz=UTC)  # the 8th commit


def test_restored_state_continues_the_sequence() -> None:
    state = sample_state()
    restored = State.restore(json.loads(as_json(state.snapshot())))
    for s in (state, restored):
        assert s.set("booking:date", "2024-06-01") == 3
        assert s.journal.cursor == 10
        assert s.set("gone", 1) == 1
        assert s.entry("gone").seq == 11
        assert s.set("booking:party_size", 4) == 1  # equal value: no-op
        assert s.journal.cursor == 11
    assert [m.key for m in restored.journal.since(9)] == ["booking:date", "gone"]
    assert restored.journal.since(restored.journal.cursor) == []


def test_restored_state_is_independent() -> None:
    state = sample_state()
    snap = state.snapshot()
    restored = State.restore(snap)
    snap["entries"]["nested"]["value"]["a"]["b"].append("leak")
    snap["entries"]["booking:date"]["provenance"]["meta"]["turn"] = 99
    restored.set("booking:party_size", 5)
    state.remove("big")
    assert restored.get("nested") == {"a": {"b": [{}]}}
    assert restored.provenance("booking:date").meta == {"turn": 3, "ok": True}
    assert state.get("booking:party_size") == 4
    assert restored.get("big") == 2**80


def test_snapshot_restore_snapshot_is_stable() -> None:
    snap = sample_state().snapshot()
    again = State.restore(snap).snapshot()
    assert as_json(again) == as_json(snap)
    assert as_json(State.restore(again).snapshot()) == as_json(snap)


def test_redacted_snapshot_masks_secrets_and_cannot_be_restored() -> None:
    state = sample_state()
    state.policy("user:card", secret=True)
    redacted = state.snapshot(redact=True)
    assert redacted["redacted"] is True
    assert redacted["entries"]["user:card"]["value"] == SECRET_MASK
    assert "4111" not in as_json(redacted)
    assert redacted["entries"]["booking:party_size"]["value"] == 4
    with pytest.raises(SnapshotError, match="redacted"):
        State.restore(redacted)
    full = state.snapshot()
    assert full["entries"]["user:card"]["value"] == "4111"
    assert State.restore(full).get("user:card") == "4111"


def test_redacted_snapshot_without_secrets_still_cannot_be_restored() -> None:
    with pytest.raises(SnapshotError):
        State.restore(sample_state().snapshot(redact=True))


def good_snapshot() -> dict[str, Any]:
    return json.loads(as_json(sample_state().snapshot()))


def breaking(change: Any) -> dict[str, Any]:
    snap = good_snapshot()
    change(snap)
    return snap


def entry(snap: dict[str, Any], key: str = "booking:date") -> dict[str, Any]:
    result: dict[str, Any] = snap["entries"][key]
    return result


def rename_entry(snap: dict[str, Any], new: str) -> None:
    snap["entries"][new] = snap["entries"].pop("booking:date")


GARBAGE: dict[str, Any] = {
    "none": None,
    "string": "slateflow.snapshot/1",
    "list": [],
    "empty_dict": {},
    "json_text": '{"format": "slateflow.snapshot/1"}',
    "wrong_format": breaking(lambda s: s.update(format="slateflow.snapshot/2")),
    "no_format": breaking(lambda s: s.pop("format")),
    "no_seq": breaking(lambda s: s.pop("seq")),
    "negative_seq": breaking(lambda s: s.update(seq=-1)),
    "str_seq": breaking(lambda s: s.update(seq="8")),
    "bool_seq": breaking(lambda s: s.update(seq=True)),
    "no_entries": breaking(lambda s: s.pop("entries")),
    "entries_list": breaking(lambda s: s.update(entries=[])),
    "redacted": breaking(lambda s: s.update(redacted=True)),
    "entry_not_a_dict": breaking(lambda s: s["entries"].update({"booking:date": 5})),
    "no_value": breaking(lambda s: entry(s).pop("value")),
    "nan_value": breaking(lambda s: entry(s).update(value=float("nan"))),
    "tuple_value": breaking(lambda s: entry(s).update(value=(1, 2))),
    "no_version": breaking(lambda s: entry(s).pop("version")),
    "zero_version": breaking(lambda s: entry(s).update(version=0)),
    "str_version": breaking(lambda s: entry(s).update(version="2")),
    "no_entry_seq": breaking(lambda s: entry(s).pop("seq")),
    "zero_entry_seq": breaking(lambda s: entry(s).update(seq=0)),
    "entry_seq_after_cursor": breaking(lambda s: entry(s).update(seq=999)),
    "no_provenance": breaking(lambda s: entry(s).pop("provenance")),
    "provenance_not_dict": breaking(lambda s: entry(s).update(provenance="user")),
    "empty_source": breaking(lambda s: entry(s)["provenance"].update(source="")),
    "bad_confidence": breaking(lambda s: entry(s)["provenance"].update(confidence=2)),
    "bad_time": breaking(lambda s: entry(s)["provenance"].update(at="yesterday")),
    "no_time": breaking(lambda s: entry(s)["provenance"].pop("at")),
    "extra_provenance_field": breaking(lambda s: entry(s)["provenance"].update(x=1)),
    "invalid_key": breaking(lambda s: rename_entry(s, "booking date")),
    "empty_key": breaking(lambda s: rename_entry(s, "")),
    "reserved_key": breaking(lambda s: rename_entry(s, "state_meta:booking:date")),
}


@pytest.mark.parametrize("snapshot", GARBAGE.values(), ids=GARBAGE.keys())
def test_restoring_garbage_raises_snapshot_error(snapshot: Any) -> None:
    original = copy.deepcopy(snapshot)
    with pytest.raises(SnapshotError):
        State.restore(snapshot)
    assert snapshot == original or snapshot is None


def test_snapshot_error_names_the_bad_entry() -> None:
    snap = breaking(lambda s: entry(s, "nested").update(version=-3))
    with pytest.raises(SnapshotError, match="'nested'"):
        State.restore(snap)


def test_snapshot_error_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="snapshot"):
        State.restore({"format": "nope"})


def test_the_undamaged_snapshot_restores() -> None:
    # Guards the table above: the undamaged snapshot restores fine.
    assert State.restore(good_snapshot()).keys() == sample_state().keys()
