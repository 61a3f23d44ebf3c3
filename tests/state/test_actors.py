"""State.acting_as: a block's writes are stamped as one writer and fenced to its keys."""

from __future__ import annotations

import threading

import anyio
import pytest

from helpers import fingerprint
from slateflow import State
from slateflow.errors import PolicyViolation


def test_writes_inside_are_stamped_and_fenced() -> None:
    state = State()
    with state.acting_as("verify", source="agent", allow="verify:*", deny=["verify:result"]):
        state.set("verify:progress", 0.5)
        state.update({"verify:step": "lookup"})
        before = fingerprint(state)
        for write in (
            lambda: state.set("booking:date", "2026-06-14"),
            lambda: state.set("verify:result", "ok"),
            lambda: state.update({"verify:note": 1, "other": 2}),
            lambda: state.update({"verify:note": 1}, remove="other"),
            lambda: state.rename("verify:step", "elsewhere"),
        ):
            with pytest.raises(PolicyViolation, match="'verify' may not write"):
                write()
        assert fingerprint(state) == before  # nothing was written
    prov = state.provenance("verify:progress")
    assert prov is not None
    assert (prov.source, prov.writer) == ("agent", "verify")
    # An explicit provenance is kept; only the key fence applies.
    with state.acting_as("verify", source="agent", allow="verify:*"):
        state.set("verify:progress", 0.9, source="tool", writer="scanner")
    prov = state.provenance("verify:progress")
    assert prov is not None
    assert (prov.source, prov.writer) == ("tool", "scanner")


def test_the_fence_ends_with_the_block() -> None:
    state = State()
    with state.acting_as("verify", source="agent", allow="verify:*"):
        pass
    state.set("booking:date", "2026-06-14")
    assert state.provenance("booking:date").source == "user"  # type: ignore[union-attr]


def test_error_message_names_the_writer_the_key_and_what_is_allowed() -> None:
    state = State()
    with (
        state.acting_as("verify", source="agent", allow="verify:*", deny=["verify:status"]),
        pytest.raises(PolicyViolation) as info,
    ):
        state.set("verify:status", "done")
    text = str(info.value)
    assert "'verify' may not write 'verify:status'" in text
    assert "'verify:*'" in text
    assert "except 'verify:status'" in text


def test_transactions_inside_the_block_are_fenced() -> None:
    state = State()
    with state.acting_as("verify", source="agent", allow="verify:*"), state.transaction() as tx:
        tx.set("verify:a", 1)
        with pytest.raises(PolicyViolation):
            tx.set("outside", 1)
        with pytest.raises(PolicyViolation):
            state.set("outside", 1)
    assert state.get("verify:a") == 1
    assert "outside" not in state


def test_other_threads_are_not_fenced() -> None:
    state = State()
    done = []

    def writer() -> None:
        state.set("asr:transcript", "hello")
        done.append(True)

    with state.acting_as("verify", source="agent", allow="verify:*"):
        t = threading.Thread(target=writer)
        t.start()
        t.join()
    assert done == [True]
    assert state.provenance("asr:transcript").source == "user"  # type: ignore[union-attr]


@pytest.mark.anyio
async def test_tasks_started_inside_inherit_the_fence_and_others_do_not() -> None:
    state = State()
    seen: list[str] = []

    async def child() -> None:
        try:
            state.set("outside", 1)
        except PolicyViolation:
            seen.append("refused")

    async def sibling(ready: anyio.Event) -> None:
        await ready.wait()
        state.set("sibling:key", 1)  # its own context: not fenced
        seen.append("sibling wrote")

    async with anyio.create_task_group() as outer:
        ready = anyio.Event()
        outer.start_soon(sibling, ready)
        with state.acting_as("verify", source="agent", allow="verify:*"):
            async with anyio.create_task_group() as inner:
                inner.start_soon(child)
            ready.set()
            await anyio.lowlevel.checkpoint()
    assert sorted(seen) == ["refused", "sibling wrote"]
    assert "outside" not in state
