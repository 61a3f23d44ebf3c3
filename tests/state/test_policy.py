"""Policies: read-only keys, source/writer restrictions, size and key-count caps, secrets."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from helpers import committed_view
from slateflow import Change, Policy, State
from slateflow.errors import InvalidKeyError, PolicyViolation, ReadOnlyError
from slateflow.state import SECRET_MASK, JsonlSink, Rule

# -- helpers -------------------------------------------------------------------------------------


def json_size(value: Any) -> int:
    """Independent reference for 'bytes of compact UTF-8 JSON'."""
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))


class Recorder:
    def __init__(self, state: State) -> None:
        self.calls: list[tuple[Change, ...]] = []
        self.signals: list[tuple[Change, ...]] = []
        self.sub = state.subscribe(self.calls.append)
        state.changed.connect(self.on_signal, sender=state, weak=False)

    def on_signal(self, sender: State, *, changes: tuple[Change, ...]) -> None:
        self.signals.append(changes)


# -- read-only -----------------------------------------------------------------------------------


def test_read_only_error_is_a_policy_violation() -> None:
    assert issubclass(ReadOnlyError, PolicyViolation)


def test_read_only_key_refuses_writes_and_removes() -> None:
    state = State()
    state.set("config:model", "gpt")
    state.policy("config:model", read_only=True)
    before = committed_view(state)
    with pytest.raises(ReadOnlyError, match="'config:model'"):
        state.set("config:model", "other")
    with pytest.raises(ReadOnlyError, match="'config:model'"):
        state.remove("config:model")
    with pytest.raises(ReadOnlyError):
        state.modify("config:model", "", lambda v: v + "!")
    with pytest.raises(ReadOnlyError):
        state.set("config:model", "other", source="system", writer="admin")
    assert committed_view(state) == before
    assert state.get("config:model") == "gpt"
    # Other keys stay writable.
    state.set("config:other", 1)
    assert state.get("config:other") == 1


def test_read_only_pattern_covers_every_matching_key() -> None:
    state = State(policy=Policy([Rule("config:*", read_only=True)]))
    state.set("other", 1)
    before = committed_view(state)
    for key in ("config:a", "config:a:b"):
        with pytest.raises(ReadOnlyError, match=f"'{key}'"):
            state.set(key, 1)
    with pytest.raises(ReadOnlyError):
        state.update({"fine": 1, "config:x": 2})
    with pytest.raises(ReadOnlyError):
        state.rename("other", "config:moved")
    assert committed_view(state) == before
    state.set("configs", 1)  # does not match "config:*"
    assert state.get("configs") == 1


def test_read_only_key_blocks_clear_prefix_and_rename_entirely() -> None:
    state = State()
    state.update({"cfg:a": 1, "cfg:b": 2, "cfg:c": 3})
    state.policy("cfg:b", read_only=True)
    before = committed_view(state)
    with pytest.raises(ReadOnlyError, match="'cfg:b'"):
        state.clear_prefix("cfg:")
    with pytest.raises(ReadOnlyError, match="'cfg:b'"):
        state.clear_prefix("")
    with pytest.raises(ReadOnlyError):
        state.rename("cfg:b", "cfg:z")
    with pytest.raises(ReadOnlyError):
        state.rename("cfg:a", "cfg:b", overwrite=True)
    with pytest.raises(ReadOnlyError):
        state.update({}, remove=["cfg:a", "cfg:b"])
    assert committed_view(state) == before


def test_read_only_inside_transaction_raises_at_the_line() -> None:
    state = State()
    state.set("cfg", 1)
    state.policy("cfg", read_only=True)
    with state.transaction() as tx:
        tx.set("x", 1)
        with pytest.raises(ReadOnlyError):
            state.set("cfg", 2)
        with pytest.raises(ReadOnlyError):
            tx.remove("cfg")
    assert state.pick("cfg", "x") == {"cfg": 1, "x": 1}


# -- sources and writers -------------------------------------------------------------------------


def test_only_the_named_writer_may_write_its_keys() -> None:
    state = State()
    state.policy("verify:*", writers=["verify"])
    assert state.set("verify:result", "ok", source="agent", writer="verify") == 1
    assert state.get("verify:result") == "ok"
    before = committed_view(state)
    with pytest.raises(PolicyViolation) as info:
        state.set("verify:result", "forged")
    message = str(info.value)
    assert "'verify:result'" in message
    assert "'verify:*'" in message
    assert "writer None" in message
    with pytest.raises(PolicyViolation) as info:
        state.set("verify:result", "forged", source="agent", writer="intruder")
    message = str(info.value)
    assert "'verify:result'" in message
    assert "'intruder'" in message
    assert "'verify:*'" in message
    assert committed_view(state) == before
    assert state.get("verify:result") == "ok"


def test_writer_restriction_also_governs_removal_update_and_modify() -> None:
    state = State()
    state.policy("verify:*", writers=["verify"])
    state.set("verify:a", 1, source="agent", writer="verify")
    before = committed_view(state)
    with pytest.raises(PolicyViolation, match="'verify:a'"):
        state.remove("verify:a")
    with pytest.raises(PolicyViolation, match="'verify:b'"):
        state.update({"free": 1, "verify:b": 2})
    with pytest.raises(PolicyViolation):
        state.modify("verify:a", 0, lambda v: v + 1, writer="someone")
    with pytest.raises(PolicyViolation):
        state.clear_prefix("verify:")
    assert committed_view(state) == before
    state.update({"verify:b": 2, "free": 1}, source="agent", writer="verify")
    assert state.modify("verify:a", 0, lambda v: v + 1, writer="verify") == 2
    assert state.remove("verify:a", writer="verify") == 2
    assert state.pick("verify:a", "verify:b", "free") == {"verify:b": 2, "free": 1}


def test_only_allowed_sources_may_write() -> None:
    state = State()
    state.policy("fetch:*", sources=["fetch", "tool"])
    state.set("fetch:weather", "sunny", source="fetch")
    state.set("fetch:weather", "rain", source="tool", writer="anything")
    before = committed_view(state)
    with pytest.raises(PolicyViolation) as info:
        state.set("fetch:weather", "snow", source="llm")
    message = str(info.value)
    assert "'llm'" in message
    assert "'fetch:weather'" in message
    assert "'fetch:*'" in message
    with pytest.raises(PolicyViolation):
        state.set("fetch:weather", "snow")  # source "user"
    assert committed_view(state) == before
    assert state.get("fetch:weather") == "rain"


def test_rule_with_sources_and_writers_requires_both() -> None:
    state = State(
        policy=Policy([Rule("x:*", sources=frozenset({"agent"}), writers=frozenset({"w"}))])
    )
    state.set("x:1", 1, source="agent", writer="w")
    with pytest.raises(PolicyViolation):
        state.set("x:1", 2, source="agent", writer="other")
    with pytest.raises(PolicyViolation):
        state.set("x:1", 2, source="user", writer="w")
    assert state.get("x:1") == 1


def test_writer_restriction_inside_transaction_raises_at_the_line() -> None:
    state = State()
    state.policy("verify:*", writers=["verify"])
    with state.transaction() as tx:
        with pytest.raises(PolicyViolation, match="'verify:r'"):
            tx.set("verify:r", 1)
        tx.set("verify:r", 2, source="agent", writer="verify")
    assert state.get("verify:r") == 2
    assert state.provenance("verify:r").writer == "verify"  # type: ignore[union-attr]


# -- size caps -----------------------------------------------------------------------------------


class Small(BaseModel):
    name: str
    n: int


SIZED_VALUES = [
    pytest.param("abcde", 7, id="ascii-str"),
    pytest.param("éé", 6, id="utf8-2byte"),
    pytest.param("日本", 8, id="utf8-3byte"),
    pytest.param("😀", 6, id="utf8-4byte"),
    pytest.param('a"b', 6, id="escaped-quote"),
    pytest.param(12345, 5, id="int"),
    pytest.param(None, 4, id="null"),
    pytest.param(True, 4, id="bool"),
    pytest.param([1.5, None, True], 15, id="list"),
    pytest.param({"a": 1, "b": [1, 2]}, 17, id="dict-compact"),
    pytest.param({"k": "é"}, 10, id="dict-utf8"),
]


@pytest.mark.parametrize(("value", "size"), SIZED_VALUES)
def test_rule_max_bytes_boundary_is_exact(value: Any, size: int) -> None:
    assert json_size(value) == size
    at_cap = State()
    at_cap.policy("doc:*", max_bytes=size)
    at_cap.set("doc:x", value)
    assert at_cap.get("doc:x") == value

    under_cap = State()
    under_cap.policy("doc:*", max_bytes=size - 1)
    before = committed_view(under_cap)
    with pytest.raises(PolicyViolation, match="'doc:x'") as info:
        under_cap.set("doc:x", value)
    assert f"{size} bytes" in str(info.value)
    assert f"{size - 1}-byte cap" in str(info.value)
    assert committed_view(under_cap) == before


@pytest.mark.parametrize(("value", "size"), SIZED_VALUES)
def test_global_max_value_bytes_boundary_is_exact(value: Any, size: int) -> None:
    at_cap = State(policy=Policy(max_value_bytes=size))
    at_cap.set("k", value)
    assert at_cap.get("k") == value

    under_cap = State(policy=Policy(max_value_bytes=size - 1))
    with pytest.raises(PolicyViolation, match="'k'"):
        under_cap.set("k", value)
    assert "k" not in under_cap
    assert under_cap.journal.cursor == 0


def test_max_value_bytes_can_be_set_after_construction() -> None:
    policy = Policy()
    state = State(policy=policy)
    state.set("k", "abcdef")
    policy.max_value_bytes = 5
    with pytest.raises(PolicyViolation):
        state.set("k", "abcd!!")
    state.set("k", "abc")  # 5 bytes
    assert state.get("k") == "abc"
    policy.max_value_bytes = None
    state.set("k", "x" * 100)
    assert state.get("k") == "x" * 100


def test_size_cap_measures_the_stored_json_of_a_model() -> None:
    value = Small(name="é", n=10)
    size = json_size({"name": "é", "n": 10})
    ok = State()
    ok.policy("m", max_bytes=size)
    ok.set("m", value)
    assert ok.get("m") == {"name": "é", "n": 10}
    refused = State()
    refused.policy("m", max_bytes=size - 1)
    with pytest.raises(PolicyViolation):
        refused.set("m", value)


def test_size_cap_applies_to_update_modify_and_transactions() -> None:
    state = State()
    state.policy("doc:*", max_bytes=5)
    state.set("doc:a", "abc")
    before = committed_view(state)
    with pytest.raises(PolicyViolation, match="'doc:b'"):
        state.update({"doc:c": "ok", "doc:b": "too long"})
    with pytest.raises(PolicyViolation, match="'doc:a'"):
        state.modify("doc:a", "", lambda v: v + "defg")
    with state.transaction() as tx:
        with pytest.raises(PolicyViolation, match="'doc:a'"):
            tx.set("doc:a", "abcdef")
        tx.set("doc:z", "abc")
    assert state.keys() == ["doc:a", "doc:z"]
    assert state.get("doc:a") == "abc"
    assert state.journal.cursor == before[1] + 1


def test_removal_is_not_subject_to_size_caps() -> None:
    state = State()
    state.set("big", "x" * 50)
    state.policy("*", max_bytes=5)
    assert state.remove("big") == "x" * 50
    assert "big" not in state


@pytest.mark.parametrize("reverse", [False, True], ids=["loose-first", "strict-first"])
def test_strictest_of_several_matching_size_caps_wins(reverse: bool) -> None:
    rules = [Rule("*", max_bytes=10), Rule("doc:*", max_bytes=5), Rule("doc:big:*", max_bytes=8)]
    state = State(policy=Policy(rules[::-1] if reverse else rules))
    state.set("other", "12345678")  # 10 bytes: only "*" applies
    with pytest.raises(PolicyViolation):
        state.set("other", "123456789")  # 11 bytes
    state.set("doc:a", "abc")  # 5 bytes
    with pytest.raises(PolicyViolation, match="5-byte cap"):
        state.set("doc:a", "abcd")  # 6 bytes
    # "doc:big:x" matches all three rules: 5 bytes is still the cap.
    state.set("doc:big:x", "abc")
    with pytest.raises(PolicyViolation, match="5-byte cap"):
        state.set("doc:big:x", "abcdef")
    assert state.pick("other", "doc:a", "doc:big:x") == {
        "other": "12345678",
        "doc:a": "abc",
        "doc:big:x": "abc",
    }


def test_global_value_cap_and_rule_caps_combine_strictest_wins() -> None:
    state = State(
        policy=Policy(
            [Rule("doc:*", max_bytes=5), Rule("wide:*", max_bytes=100)], max_value_bytes=8
        )
    )
    state.set("doc:a", "abc")
    with pytest.raises(PolicyViolation):
        state.set("doc:a", "abcd")  # rule (5) is stricter than global (8)
    state.set("wide:a", "abcdef")  # 8 bytes
    with pytest.raises(PolicyViolation):
        state.set("wide:a", "abcdefg")  # global (8) is stricter than the rule (100)
    state.set("plain", "abcdef")
    with pytest.raises(PolicyViolation):
        state.set("plain", "abcdefg")
    assert state.pick("doc:a", "wide:a", "plain") == {
        "doc:a": "abc",
        "wide:a": "abcdef",
        "plain": "abcdef",
    }


def test_several_matching_rules_all_apply() -> None:
    state = State()
    state.policy("user:*", sources=["user", "agent"])
    state.policy("user:card", writers=["vault"], secret=True)
    state.policy("user:*", max_bytes=12)
    state.set("user:card", "1234", source="agent", writer="vault")
    with pytest.raises(PolicyViolation, match="'vault'"):  # the writers rule
        state.set("user:card", "5678", source="agent", writer="other")
    with pytest.raises(PolicyViolation, match="'llm'"):  # the sources rule
        state.set("user:card", "5678", source="llm", writer="vault")
    with pytest.raises(PolicyViolation, match="12-byte cap"):  # the size rule
        state.set("user:card", "x" * 20, source="agent", writer="vault")
    state.set("user:name", "Ann")  # writers rule does not match user:name
    assert state.is_secret("user:card")
    assert not state.is_secret("user:name")
    assert state.pick("user:card", "user:name") == {"user:card": "1234", "user:name": "Ann"}


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "10"])
def test_rule_rejects_bad_max_bytes(bad: Any) -> None:
    with pytest.raises(ValueError, match="max_bytes"):
        Rule("x", max_bytes=bad)


@pytest.mark.parametrize("pattern", ["", "has space", "bad\nkey"])
def test_rule_rejects_bad_patterns(pattern: str) -> None:
    with pytest.raises(InvalidKeyError):
        Rule(pattern)
    state = State()
    with pytest.raises(InvalidKeyError):
        state.policy(pattern, read_only=True)
    assert state.policy().rules == ()
    assert not state.policy().active


# -- max_keys ------------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["constructor", "state.policy"])
def test_max_keys_refuses_creating_one_key_too_many(how: str) -> None:
    state = State(policy=Policy(max_keys=2)) if how == "constructor" else State()
    if how == "state.policy":
        state.policy(max_keys=2)
    state.set("a", 1)
    state.set("b", 2)
    before = committed_view(state)
    with pytest.raises(PolicyViolation, match="'c'") as info:
        state.set("c", 3)
    assert "2 keys" in str(info.value)
    assert committed_view(state) == before
    # Overwriting existing keys at the cap is fine.
    state.set("a", 10)
    state.update({"a": 11, "b": 12})
    assert state.pick("a", "b") == {"a": 11, "b": 12}
    # Removing frees room.
    state.remove("b")
    state.set("c", 3)
    assert sorted(state.keys()) == ["a", "c"]


def test_max_keys_update_creating_too_many_fails_whole() -> None:
    state = State(policy=Policy(max_keys=3))
    state.set("a", 1)
    before = committed_view(state)
    with pytest.raises(PolicyViolation):
        state.update({"a": 2, "b": 1, "c": 1, "d": 1})
    assert committed_view(state) == before
    state.update({"a": 2, "b": 1, "c": 1})  # exactly at the cap
    assert len(state) == 3


def test_max_keys_removal_in_the_same_update_frees_room() -> None:
    state = State(policy=Policy(max_keys=2))
    state.update({"a": 1, "b": 2})
    state.update({"c": 3}, remove=["a"])
    assert sorted(state.keys()) == ["b", "c"]
    state.update({"d": 4, "e": 5}, remove=["b", "c"])
    assert sorted(state.keys()) == ["d", "e"]
    before = committed_view(state)
    # Removing an absent key frees nothing.
    with pytest.raises(PolicyViolation):
        state.update({"f": 6}, remove=["nope"])
    assert committed_view(state) == before


def test_max_keys_rename_does_not_count_twice() -> None:
    state = State(policy=Policy(max_keys=2))
    state.update({"a": 1, "b": 2})
    assert state.rename("a", "z") == 1
    assert sorted(state.keys()) == ["b", "z"]
    state.rename("z", "b", overwrite=True)
    assert state.keys() == ["b"]
    assert state.get("b") == 1


def test_max_keys_in_a_transaction_counts_the_net_result() -> None:
    state = State(policy=Policy(max_keys=2))
    state.update({"a": 1, "b": 2})
    with state.transaction():
        state.set("c", 3)  # temporarily three keys inside the buffer
        state.remove("a")
        state.rename("b", "d")
    assert sorted(state.keys()) == ["c", "d"]
    before = committed_view(state)

    def add_one() -> None:
        with state.transaction():
            state.set("e", 1)

    with pytest.raises(PolicyViolation, match="'e'"):
        add_one()
    assert committed_view(state) == before


def test_max_keys_modify_creating_a_key_is_refused() -> None:
    state = State(policy=Policy(max_keys=1))
    state.set("a", 1)
    before = committed_view(state)
    with pytest.raises(PolicyViolation):
        state.modify("b", 0, lambda v: v + 1)
    assert committed_view(state) == before
    assert state.modify("a", 0, lambda v: v + 1) == 2


# -- secrets -------------------------------------------------------------------------------------

CARD = "4111-1111-1111-1111"


def _secret_state(**kwargs: Any) -> State:
    state = State(**kwargs)
    state.policy("user:card", secret=True)
    state.set("user:name", "Ann")
    state.set("user:card", CARD, source="user", writer="form")
    return state


def test_secret_value_is_still_readable_through_the_api() -> None:
    state = _secret_state()
    assert state.is_secret("user:card")
    assert state.get("user:card") == CARD
    assert state.entry("user:card").value == CARD  # type: ignore[union-attr]
    assert state.snapshot()["entries"]["user:card"]["value"] == CARD


def test_secret_masked_in_change_repr_and_to_dict() -> None:
    state = _secret_state()
    seen: list[Change] = []
    state.subscribe(lambda changes: seen.extend(changes))
    state.set("user:card", CARD + "-2")
    state.remove("user:card")
    state.set("user:name", "Bo")
    journal = state.journal.since(0)
    card_changes = [c for c in [*journal, *seen] if c.key == "user:card"]
    assert len(card_changes) == 5
    for change in card_changes:
        assert change.secret
        assert CARD not in repr(change)
        assert CARD not in str(change)
        assert CARD not in json.dumps(change.to_dict())
        if not change.removed:
            assert repr(SECRET_MASK) in repr(change)
            assert change.to_dict()["new"] == SECRET_MASK
        # The record itself still carries the data for code that needs it.
        assert change.new in (CARD, CARD + "-2", None)
    name_change = next(c for c in seen if c.key == "user:name")
    assert "'Bo'" in repr(name_change)
    assert not name_change.secret


def test_secret_masked_in_entry_repr() -> None:
    state = _secret_state()
    entry = state.entry("user:card")
    assert entry is not None
    assert entry.secret
    assert CARD not in repr(entry)
    assert SECRET_MASK in repr(entry)
    name = state.entry("user:name")
    assert "'Ann'" in repr(name)


def test_secret_masked_in_describe() -> None:
    state = _secret_state()
    for text in (state.describe(), state.describe(provenance=False), state.describe("user:")):
        assert CARD not in text
        assert f"user:card = {SECRET_MASK}" in text
        assert "user:name = 'Ann'" in text


def test_secret_masked_in_redacted_snapshot() -> None:
    state = _secret_state()
    redacted = state.snapshot(redact=True)
    assert redacted["redacted"] is True
    assert redacted["entries"]["user:card"]["value"] == SECRET_MASK == "***"
    assert redacted["entries"]["user:name"]["value"] == "Ann"
    assert CARD not in json.dumps(redacted)
    assert state.snapshot()["entries"]["user:card"]["value"] == CARD


def test_secret_masked_in_jsonl_sink(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    with JsonlSink(path) as sink:
        state = _secret_state(sinks=[sink])
        state.set("user:card", CARD + "-new")
        state.remove("user:card")
    text = path.read_text(encoding="utf-8")
    assert CARD not in text
    lines = [json.loads(line) for line in text.splitlines()]
    card = [rec for rec in lines if rec["key"] == "user:card"]
    assert len(card) == 3
    assert card[0]["new"] == SECRET_MASK
    assert card[1]["old"] == SECRET_MASK
    assert card[1]["new"] == SECRET_MASK
    assert card[2]["removed"] is True
    assert card[2]["old"] == SECRET_MASK
    names = [rec for rec in lines if rec["key"] == "user:name"]
    assert names[0]["new"] == "Ann"


def test_secret_pattern_from_policy_constructor(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    with JsonlSink(path) as sink:
        state = State(policy=Policy([Rule("secret:*", secret=True)]), sinks=[sink])
        state.update({"secret:a": "s3cr3t-a", "secret:b:c": {"pw": "s3cr3t-b"}, "open": "x"})
    blob = "\n".join(
        [
            path.read_text(encoding="utf-8"),
            state.describe(),
            json.dumps(state.snapshot(redact=True)),
            repr(state.entry("secret:a")),
            repr(state.entry("secret:b:c")),
            *(repr(m) for m in state.journal.since(0)),
        ]
    )
    assert "s3cr3t" not in blob
    assert "'x'" in state.describe()


# -- every violation writes nothing --------------------------------------------------------------


def _governed() -> State:
    state = State(policy=Policy([Rule("fixed:*", read_only=True)], max_keys=6))
    state.policy("verify:*", writers=["verify"])
    state.policy("fetch:*", sources=["fetch"])
    state.policy("doc:*", max_bytes=6)
    state.update({"a": 1, "doc:d": "abcd", "p:x": 1, "p:y": 2})
    state.set("verify:v", True, source="agent", writer="verify")
    return state


VIOLATIONS = [
    pytest.param(lambda s: s.set("fixed:x", 1), id="read-only-set"),
    pytest.param(lambda s: s.update({"a": 2, "fixed:x": 1}), id="read-only-update"),
    pytest.param(lambda s: s.set("verify:v", False), id="writer-set"),
    pytest.param(lambda s: s.remove("verify:v"), id="writer-remove"),
    pytest.param(lambda s: s.clear_prefix("v"), id="writer-clear-prefix"),
    pytest.param(lambda s: s.rename("a", "verify:a"), id="writer-rename-target"),
    pytest.param(lambda s: s.rename("verify:v", "b", writer="other"), id="writer-rename-source"),
    pytest.param(lambda s: s.set("fetch:x", 1, source="agent"), id="source-set"),
    pytest.param(lambda s: s.update({"a": 5, "fetch:x": 1}), id="source-update"),
    pytest.param(lambda s: s.set("doc:d", "abcde"), id="size-set"),
    pytest.param(lambda s: s.modify("doc:d", "", lambda v: v + "!!!"), id="size-modify"),
    pytest.param(lambda s: s.update({"a": 2, "doc:e": "abcdefgh"}), id="size-update"),
    pytest.param(lambda s: s.update({"n1": 1, "n2": 2}), id="max-keys-update"),
    pytest.param(lambda s: s.update({"n1": 1, "n2": 2}, remove=["nope"]), id="max-keys-remove"),
    pytest.param(lambda s: s.set("n1", 1), id="max-keys-set"),
    pytest.param(lambda s: s.rename("a", "fixed:a"), id="read-only-rename-target"),
]


@pytest.mark.parametrize("violate", VIOLATIONS)
def test_every_violation_writes_nothing(violate: Callable[[State], Any]) -> None:
    state = _governed()
    state.set("pre", 0)  # five -> six keys: at the cap
    rec = Recorder(state)
    before = committed_view(state)
    with pytest.raises(PolicyViolation):
        violate(state)
    assert committed_view(state) == before
    assert rec.calls == []
    assert rec.signals == []


@pytest.mark.parametrize("violate", VIOLATIONS)
def test_every_violation_inside_a_transaction_writes_nothing(
    violate: Callable[[State], Any],
) -> None:
    state = _governed()
    state.set("pre", 0)
    rec = Recorder(state)
    before = committed_view(state)

    def body() -> None:
        with state.transaction():
            state.set("a", "changed in tx")
            violate(state)

    with pytest.raises(PolicyViolation):
        body()
    assert committed_view(state) == before
    assert rec.calls == []
    assert rec.signals == []


@pytest.mark.parametrize(
    "rule",
    [{"read_only": True}, {"secret": True}, {"writers": ["x"]}, {"max_bytes": 10}],
    ids=["read_only", "secret", "writers", "max_bytes"],
)
def test_a_rule_that_names_no_key_is_refused_instead_of_doing_nothing(rule: dict[str, Any]) -> None:
    from slateflow.errors import UsageError

    state = State()
    with pytest.raises(UsageError, match="names no key"):
        state.policy(**rule)
    state.set("booking:date", "Saturday")  # nothing was governed
    state.policy(max_keys=100)  # a limit of the whole State needs no key
