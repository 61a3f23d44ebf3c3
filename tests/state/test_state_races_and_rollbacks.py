"""The State under races and failed writes: a failed write inside a transaction buffers nothing,
a failed declaration declares nothing and leaks no secret, one-string arguments mean one key,
the journal ring keeps exactly what it documents, and rules, declarations and subscriptions
added while another thread reads, updates or closes are never lost. No sleeps: interleavings
are forced with ``threading.Event`` and small instrumentation of caches the library reads
twice."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Annotated, Any

import pytest
from pydantic import AfterValidator

from helpers import fingerprint
from slateflow import Key, SlateError, State
from slateflow.conversation import end_turn
from slateflow.errors import ReadOnlyError, SchemaError, VersionConflictError
from slateflow.state import ScopedView
from slateflow.state.subscriptions import SubscriptionIndex

WAIT = 5.0  # generous upper bound for Event waits; never reached when the code is right


def _in_thread(
    target: Callable[[], Any], name: str | None = None
) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            target()
        except BaseException as exc:  # pragma: no cover - reported by the test
            errors.append(exc)

    t = threading.Thread(target=run, name=name)
    t.start()
    return t, errors


# -- atomicity inside transactions ------------------------------------------------------------


@pytest.mark.parametrize(
    "clear",
    [
        pytest.param(lambda s: s.clear_prefix("turn:"), id="clear_prefix"),
        pytest.param(lambda s: end_turn(s), id="end_turn"),
        pytest.param(lambda s: ScopedView(s, "turn").clear(), id="scope_clear"),
    ],
)
def test_failed_clear_inside_transaction_buffers_nothing(clear: Callable[[State], Any]) -> None:
    """Outside a transaction a refused clear_prefix/end_turn removes nothing; inside one it must
    not leave half of its removals buffered (a caught error must not commit a partial clear)."""
    state = State()
    state.set("turn:a", 1)
    state.set("turn:b", 2)
    state.policy("turn:b", read_only=True)
    before = fingerprint(state)
    with state.transaction():
        with pytest.raises(ReadOnlyError):
            clear(state)
        # The failed call wrote nothing, so the block still sees both keys ...
        assert state.keys("turn:") == ["turn:a", "turn:b"]
    # ... and committing the (empty) transaction changes nothing.
    assert fingerprint(state) == before


def test_failed_tx_update_leaves_no_expectation_behind() -> None:
    """tx.update(expected_versions=...) that raises must record none of its expectations; today
    the ones before the conflicting key stick and make the later commit fail."""
    state = State()
    state.set("a", 1)
    state.set("b", 1)
    with state.transaction() as tx:
        tx.set("b", 2, expected_version=1)
        with pytest.raises(VersionConflictError):
            tx.update({"c": 1}, expected_versions={"a": 99, "b": 3})
        tx.set("d", 4)
    assert state.get("d") == 4
    assert state.get("b") == 2


def test_failed_declare_declares_nothing_whatever_the_validator_raises() -> None:
    """declare() over a stored value its validator rejects must declare nothing, also when the
    validator raises something other than a ValueError (pydantic lets TypeError through)."""

    def no_bad(v: str) -> str:
        if v == "bad":
            raise TypeError("bad value")
        return v

    state = State()
    state.set("k", "bad")
    with pytest.raises(SlateError):
        state.declare("k", Annotated[str, AfterValidator(no_bad)])
    # Nothing was declared: the same write as before is still accepted.
    state.set("k", "good")
    state.set("k", "bad")
    assert state.get("k") == "bad"


# -- a lone string is one key, not a set of characters ----------------------------------------


def test_update_remove_with_a_lone_string_does_not_remove_its_characters() -> None:
    state = State()
    for key in ["t", "u", "r", "n", "turn"]:
        state.set(key, 1)
    with contextlib.suppress(SlateError):  # refusing it is fine too
        state.update({}, remove="turn")  # type: ignore[arg-type]
    assert {"t", "u", "r", "n"} <= set(state.keys()), "single-character keys were deleted"


def test_subscribe_keys_with_a_lone_string_watches_that_key() -> None:
    state = State()
    seen: list[list[str]] = []
    try:
        # type: ignore[arg-type]
        state.subscribe(lambda cs: seen.append([c.key for c in cs]), keys="done")
    except SlateError:
        return  # refusing it is fine too
    state.set("d", 1)
    state.set("done", True)
    assert seen == [["done"]]


# -- typed keys --------------------------------------------------------------------------------


def test_tx_pick_with_a_typed_key_is_keyed_by_name() -> None:
    state = State()
    count = Key("count", int)
    state.set(count, 1)
    assert state.pick(count) == {"count": 1}
    with state.transaction() as tx:
        assert tx.pick(count) == {"count": 1}  # type: ignore[arg-type]


def test_update_naming_one_key_twice_is_one_change() -> None:
    """A Key and its name in one update() are the same key: one change, one version bump (as a
    transaction does), not two changes of one key inside one batch."""
    state = State()
    batches: list[list[tuple[str, Any, int]]] = []
    state.subscribe(lambda cs: batches.append([(c.key, c.new, c.version) for c in cs]))
    try:
        state.update({Key("x", int): 1, "x": 2})
    except SlateError:
        assert state.journal.cursor == 0
        assert batches == []
        return
    assert state.version("x") == 1
    assert len(batches) == 1
    assert len(batches[0]) == 1


def test_expected_versions_accept_a_typed_key_as_its_name() -> None:
    """docs/state.md: "A Key object counts as its name" (update's remove= already does)."""
    state = State()
    count = Key("count", int)
    state.set(count, 1)
    state.update({count: 2}, expected_versions={count: 1})  # type: ignore[dict-item]
    assert state.get(count) == 2
    with state.transaction() as tx:
        tx.update({count: 3}, expected_versions={count: 2})  # type: ignore[dict-item]
    assert state.get(count) == 3


# -- secrets -----------------------------------------------------------------------------------


def test_schema_error_does_not_leak_a_secret_value() -> None:
    """A refused write to a secret key raises an error that ends up in logs; the value must be
    masked there like everywhere else the state formats it."""
    state = State()
    state.policy("user:card", secret=True)
    state.declare("user:card", int)
    with pytest.raises(SchemaError) as info:
        state.set("user:card", "4929 1234 5678 9012")
    assert "4929" not in str(info.value)


def test_failed_declare_does_not_leak_stored_secret_values() -> None:
    state = State()
    state.policy("user:card", secret=True)
    state.set("user:card", "4929 1234 5678 9012")
    with pytest.raises(SchemaError) as info:
        state.declare("user:card", int)
    assert "4929" not in str(info.value)


# -- journal -----------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 1, 3])
def test_ring_holds_no_more_than_documented_after_single_sets(size: int) -> None:
    """docs/state.md: between trims the ring holds at most journal_size + 64 records, and
    nothing at all when journal_size is 0 (so overwritten values, secrets included, are not
    kept alive)."""
    state = State(journal_size=size)
    for n in range(200):
        state.set("user:card", f"card-{n}")
        assert len(state.engine.ring.records) <= (size + 64 if size else 0)


@pytest.mark.parametrize("size", [1, 2, 3])
def test_mutations_since_is_exact_around_trims_with_mixed_batches(size: int) -> None:
    """Risky area kept as coverage: cursor expiry must be exact whatever the mix of single sets
    (trimmed every 64th seq) and batches (trimmed past the limit)."""
    state = State(journal_size=size)
    history: list[tuple[int, str]] = []  # (seq, key) of every record, in order
    for n in range(150):
        if n % 3 == 0:
            state.update({f"b{n}:x": n, f"b{n}:y": n})
            history += [(state.journal.cursor, f"b{n}:x"), (state.journal.cursor, f"b{n}:y")]
        else:
            state.set("s", n)
            history.append((state.journal.cursor, "s"))
        kept = history[-size:]
        for cursor in range(max(0, state.journal.cursor - 4), state.journal.cursor + 1):
            wanted = [h for h in history if h[0] > cursor]
            if all(h in kept for h in wanted):
                got = [(m.seq, m.key) for m in state.journal.since(cursor)]
                assert got == wanted
            else:
                with pytest.raises(SlateError):
                    state.journal.since(cursor)


def test_batches_reach_subscribers_in_commit_order_when_a_sink_writes() -> None:
    """A sink that records an audit key in the state (sinks run inside the commit, under the
    re-entrant lock) makes its own later batch reach subscribers before the batch it was fed."""
    state = State()

    class AuditSink:
        def record(self, mutations: Any) -> None:
            if mutations[0].key == "a":
                state.set("audit:last", "a")

    state.journal.add_sink(AuditSink())
    seqs: list[int] = []
    state.subscribe(lambda cs: seqs.append(cs[0].seq))
    state.set("a", 1)
    assert seqs == sorted(seqs) == [1, 2]


# -- concurrency: caches filled from stale reads --------------------------------------------------


class _HoldingDict(dict):  # type: ignore[type-arg]
    """A cache dict whose len() (read between computing a cache entry and storing it) pauses
    the given thread once, so another thread can act in that window."""

    def __init__(self, thread_name: str) -> None:
        super().__init__()
        self.thread_name = thread_name
        self.entered = threading.Event()
        self.release = threading.Event()

    def __len__(self) -> int:
        if threading.current_thread().name == self.thread_name and not self.entered.is_set():
            self.entered.set()
            self.release.wait(WAIT)
        return super().__len__()


def test_policy_rule_added_during_a_concurrent_read_is_not_lost() -> None:
    """Policy.for_key computes a key's rules, then stores them in ``self._cache`` read again: if
    state.policy() replaced the cache in between, the stale (rule-less) entry lands in the new
    cache and the rule is ignored for that key forever: here a read-only secret key becomes
    writable and shown unmasked."""
    state = State()
    state.policy("other:*", max_bytes=100)  # some rule, so the policy is active
    hold = _HoldingDict("reader")
    state._policy._cache = hold

    reader = threading.Thread(target=state.is_secret, args=("app:card",), name="reader")
    reader.start()
    assert hold.entered.wait(WAIT)
    state.policy("app:*", read_only=True, secret=True)
    hold.release.set()
    reader.join()

    assert state.is_secret("app:card")
    with pytest.raises(ReadOnlyError):
        state.set("app:card", "4929 1234 5678 9012")


def test_declaration_added_during_a_concurrent_update_is_not_lost() -> None:
    """Same stale-cache store in Schemas.find, reached by update() (which validates before taking
    the lock): a declaration made while an update validates is ignored for that key forever."""
    state = State()
    state.declare("other:*", int)
    hold = _HoldingDict("writer")
    state.engine.schemas._cache = hold

    writer, errors = _in_thread(lambda: state.update({"n": "early"}), name="writer")
    assert hold.entered.wait(WAIT)
    state.declare("n", int)
    hold.release.set()
    writer.join()
    assert not errors
    # Whatever happened to the racing update, a write made after declare() returned is checked.
    with pytest.raises(SchemaError):
        state.set("n", "later, not an int")


# -- concurrency: the listening flag --------------------------------------------------------------


class _PausingIndex(SubscriptionIndex):
    """A SubscriptionIndex whose ``count`` read pauses one thread when it reads 0, i.e. inside
    State._refresh_listening right after that thread's close() dropped the count to 0."""

    def __init__(self) -> None:
        self.pause_thread: str | None = None
        self.entered = threading.Event()
        self.release = threading.Event()
        self.made = threading.Event()
        super().__init__()

    def make(self, *args: Any, **kwargs: Any) -> Any:
        sub = super().make(*args, **kwargs)
        self.made.set()
        return sub

    @property  # type: ignore[override]
    def count(self) -> int:
        value = self._count
        if (
            value == 0
            and threading.current_thread().name == self.pause_thread
            and not self.entered.is_set()
        ):
            self.entered.set()
            self.release.wait(WAIT)
        return value

    @count.setter
    def count(self, value: int) -> None:
        self._count = value


def test_subscribe_racing_a_close_never_leaves_the_new_subscription_deaf() -> None:
    """_refresh_listening reads the subscription count and stores the flag without a lock: a
    close() in one thread and a subscribe() in another can leave ``_listening`` False while a
    subscription is live, and every later write then skips delivery."""
    state = State()
    index = _PausingIndex()
    state.engine.delivery.subscriptions = index
    state.engine.delivery.wants = index.watched
    old = state.subscribe(lambda cs: None, keys=["k"])
    index.pause_thread = "closer"

    closer = threading.Thread(target=old.close, name="closer")
    closer.start()
    assert index.entered.wait(WAIT)
    # The closer has read a count of 0 and is about to store the flag; now a subscription is
    # made in another thread, and only then may the closer go on.
    index.made.clear()
    seen: list[Any] = []
    subscriber = threading.Thread(
        target=state.subscribe, args=(lambda cs: seen.append(cs[0].new),), kwargs={"keys": ["k"]}
    )
    subscriber.start()
    assert index.made.wait(WAIT)
    index.release.set()
    closer.join()
    subscriber.join()

    state.set("k", 1)
    assert seen == [1]
