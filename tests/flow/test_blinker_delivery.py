"""Blinker drives the flows: ``state.changed`` is the one signal every reaction receives from.

What a user sees of blinker is the truth: a receiver they connect runs in the same order as the
flow runner's (connection order), ``muted()`` mutes flows too, a key given as the sender makes a
receiver sender-keyed, and a raising receiver is isolated and reported.
"""

from __future__ import annotations

import gc
from typing import Any

from blinker import Signal

from slateflow import Change, State
from slateflow.flow import Flow, FlowRunner, Step, is_set


def two_steps() -> Flow:
    return Flow(
        "f",
        [Step("ask", done=is_set("slot")), Step("confirm", after=["ask"], done=is_set("ok"))],
    )


def test_muting_the_changed_signal_stops_a_flow_from_advancing() -> None:
    state = State()
    runner = FlowRunner(two_steps(), state)
    with state.changed.muted():
        state.set("slot", "7pm")
        assert runner.active_steps == ["ask"]
    # What was written while muted is in the State; the flow was never told of it.
    assert state.get("slot") == "7pm"
    assert runner.active_steps == ["ask"]
    runner.advance()
    assert runner.active_steps == ["confirm"]


def test_muting_mutes_subscriptions_watchers_and_receivers_alike() -> None:
    state = State()
    seen: list[str] = []
    state.subscribe(lambda changes: seen.append("sub"), keys=["k"])
    state.watch("k", lambda old, new: True, lambda change: seen.append("watch"))

    def receiver(sender: Any, **kw: Any) -> None:
        seen.append("receiver")

    state.changed.connect(receiver)
    with state.changed.muted():
        state.set("k", 1)
    assert seen == []
    state.set("k", 2)
    assert seen == ["sub", "watch", "receiver"]


def test_receivers_and_the_runner_run_in_connection_order() -> None:
    state = State()
    order: list[str] = []

    def before(sender: Any, changes: tuple[Change, ...]) -> None:
        order.append("before:" + ",".join(state.get("flow:f:active")))

    def after(sender: Any, changes: tuple[Change, ...]) -> None:
        order.append("after:" + ",".join(state.get("flow:f:active")))

    state.changed.connect(before, sender="slot")
    FlowRunner(two_steps(), state)
    state.changed.connect(after, sender="slot")
    state.set("slot", "7pm")
    # The first receiver ran before the runner had advanced, the last one after.
    assert order == ["before:ask", "after:confirm"]


def test_a_key_as_sender_makes_a_receiver_sender_keyed() -> None:
    state = State()
    got: list[tuple[object, list[str]]] = []

    def receiver(sender: object, changes: tuple[Change, ...]) -> None:
        got.append((sender, [c.key for c in changes]))

    state.changed.connect(receiver, sender="booking:slot")
    state.set("other", 1)
    state.update({"booking:slot": "7pm", "other": 2})
    assert got == [(state, ["booking:slot"])]


def test_a_receiver_connected_for_two_keys_is_called_once_per_batch() -> None:
    state = State()
    calls: list[list[str]] = []

    def receiver(sender: object, changes: tuple[Change, ...]) -> None:
        calls.append([c.key for c in changes])

    state.changed.connect(receiver, sender="a")
    state.changed.connect(receiver, sender="b")
    state.update({"a": 1, "b": 2, "c": 3})
    assert calls == [["a", "b"]]


def test_disconnecting_a_sender_keyed_receiver_stops_only_that_key() -> None:
    state = State()
    calls: list[str] = []

    def receiver(sender: object, changes: tuple[Change, ...]) -> None:
        calls.extend(c.key for c in changes)

    state.changed.connect(receiver, sender="a")
    state.changed.connect(receiver, sender="b")
    state.changed.disconnect(receiver, sender="a")
    state.set("a", 1)
    state.set("b", 1)
    assert calls == ["b"]
    state.changed.disconnect(receiver)
    state.set("b", 2)
    assert calls == ["b"]


def test_connecting_the_same_receiver_twice_delivers_once() -> None:
    state = State()
    calls: list[int] = []

    def receiver(sender: object, changes: tuple[Change, ...]) -> None:
        calls.append(len(changes))

    state.changed.connect(receiver)
    state.changed.connect(receiver)
    state.set("a", 1)
    assert calls == [1]


def test_a_weakly_connected_receiver_goes_when_it_is_collected() -> None:
    state = State()
    calls: list[str] = []

    class Listener:
        def on_change(self, sender: object, changes: tuple[Change, ...]) -> None:
            calls.append("called")

    listener = Listener()
    state.changed.connect(listener.on_change, sender="a")
    state.set("a", 1)
    del listener
    gc.collect()
    state.set("a", 2)
    assert calls == ["called"]


def test_a_raising_receiver_is_reported_by_name_and_the_flow_still_advances() -> None:
    state = State()
    failures: list[tuple[object, str]] = []

    def report(sender: object, receiver: object, error: Exception, **kw: Any) -> None:
        failures.append((receiver, str(error)))

    state.receiver_failed.connect(report)

    def broken(sender: object, changes: tuple[Change, ...]) -> None:
        raise RuntimeError("boom")

    state.changed.connect(broken, sender="slot")
    runner = FlowRunner(two_steps(), state)
    state.set("slot", "7pm")
    assert failures == [(broken, "boom")]
    assert runner.active_steps == ["confirm"]


def test_a_sender_other_than_a_key_or_the_state_is_never_sent_by_the_state() -> None:
    state = State()
    calls: list[object] = []
    other = object()

    def receiver(sender: object, **kw: Any) -> None:
        calls.append(sender)

    state.changed.connect(receiver, sender=other)
    state.set("a", 1)
    assert calls == []
    state.changed.send(other)  # blinker's own send still reaches it
    assert calls == [other]


def test_changed_is_a_blinker_signal() -> None:
    assert isinstance(State().changed, Signal)


def test_a_receiver_connected_after_a_collected_one_is_called() -> None:
    """A collected receiver's route goes with it: a new receiver (which may get the same id)
    is routed afresh."""
    state = State()
    calls: list[str] = []
    for n in range(5):

        def receiver(sender: object, changes: tuple[Change, ...], n: int = n) -> None:
            calls.append(f"r{n}")

        state.changed.connect(receiver, sender="a")
        state.set("a", n)
        del receiver
        gc.collect()
    assert calls == ["r0", "r1", "r2", "r3", "r4"]
    state.changed.disconnect(print)  # any connect or disconnect removes collected routes
    assert state.engine.delivery.subscriptions.count == 0
