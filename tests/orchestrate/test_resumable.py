"""Resumable fan-out: each success journaled at its step boundary, a resume runs only what did
not succeed, a changed spec runs again, an untrustworthy checkpoint runs nothing (fail closed),
and a store that cannot save does not fail the live run. Executors are controlled by counters
and events, never by sleeps."""

from __future__ import annotations

import hashlib
import json
import logging
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slateflow import State
from slateflow.errors import CheckpointError, OrchestrationError, StoreError
from slateflow.orchestrate import AgentStepSpec, StepOutcome, execute_parallel
from slateflow.orchestrate import checkpoint as checkpoint_module
from slateflow.orchestrate.checkpoint import (
    WORKFLOW_CHECKPOINT_SCHEMA_VERSION,
    WorkflowCheckpoint,
    WorkflowStepRecord,
    spec_digest,
)
from slateflow.orchestrate.resumable import execute_parallel_resumable
from slateflow.stores.memory import MemoryStore

try:
    from slateflow.stores.sqlite import SQLiteStore
except ImportError:  # pragma: no cover - the SQLite store is optional here
    SQLiteStore = None  # type: ignore[assignment,misc]

pytestmark = pytest.mark.anyio

WF = "wf-1"


class Fake:
    """A fake executor: counts calls and successes per task id and the peak running at once;
    a step fails while its task id is in ``fail``, waits on ``gates[task_id]`` when there is
    one, and calls ``after_success(task_id)`` just before returning a success."""

    def __init__(self, hint: int = 8, fail: set[str] | None = None) -> None:
        self.hint = hint
        self.fail = set(fail or ())
        self.calls: Counter[str] = Counter()
        self.successes: Counter[str] = Counter()
        self.running = 0
        self.peak = 0
        self.gates: dict[str, anyio.Event] = {}
        self.after_success: Callable[[str], None] | None = None

    @property
    def concurrency_hint(self) -> int:
        return self.hint

    async def execute_step(self, spec: AgentStepSpec) -> StepOutcome:
        self.calls[spec.task_id] += 1
        self.running += 1
        self.peak = max(self.peak, self.running)
        try:
            for _ in range(3):
                await anyio.lowlevel.checkpoint()  # let the other branches interleave
            gate = self.gates.get(spec.task_id)
            if gate is not None:
                await gate.wait()
            if spec.task_id in self.fail:
                return StepOutcome.failed(spec, "said no")
            self.successes[spec.task_id] += 1
            if self.after_success is not None:
                self.after_success(spec.task_id)
            return StepOutcome.ok(
                spec, f"{spec.task_id} did {spec.prompt!r}", structured={"len": len(spec.prompt)}
            )
        finally:
            self.running -= 1


class Watched:
    """Wraps a checkpoint store: keeps every saved text, can refuse loads, saves or deletes,
    and sets an event once a saved checkpoint holds a given set of steps."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.saved: list[str] = []
        self.loads = 0
        self.deletes = 0
        self.fail_load = False
        self.fail_save = False
        self.fail_delete = False
        self._waiters: list[tuple[set[str], anyio.Event]] = []

    def expect(self, *tasks: str) -> anyio.Event:
        """An event set once a saved checkpoint holds ``tasks`` (register before the run)."""
        event = anyio.Event()
        self._waiters.append((set(tasks), event))
        return event

    def load_checkpoint(self, workflow_id: str) -> str | None:
        self.loads += 1
        if self.fail_load:
            raise StoreError("the disk is on fire")
        text: str | None = self.inner.load_checkpoint(workflow_id)
        return text

    def save_checkpoint(self, workflow_id: str, data: str) -> None:
        if self.fail_save:
            raise StoreError("disk full")
        self.inner.save_checkpoint(workflow_id, data)
        self.saved.append(data)
        steps = set(json.loads(data)["steps"])
        for want, event in self._waiters:
            if want <= steps:
                # Saves run in a worker thread; the event belongs to the event loop.
                anyio.from_thread.run_sync(event.set)

    def delete_checkpoint(self, workflow_id: str) -> None:
        self.deletes += 1
        if self.fail_delete:
            raise StoreError("read-only file system")
        self.inner.delete_checkpoint(workflow_id)

    def steps(self, workflow_id: str = WF) -> set[str] | None:
        text = self.inner.load_checkpoint(workflow_id)
        return None if text is None else set(json.loads(text)["steps"])


STORES = ["memory", "sqlite"] if SQLiteStore is not None else ["memory"]


@pytest.fixture(params=STORES)
def inner(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    if request.param == "memory":
        yield MemoryStore()
        return
    store = SQLiteStore(tmp_path / "cp.db")
    try:
        yield store
    finally:
        store.close()


@pytest.fixture
def store(inner: Any) -> Watched:
    return Watched(inner)


def spec(task: str, prompt: str = "go", agent: str = "worker") -> AgentStepSpec:
    return AgentStepSpec(task_id=task, agent=agent, prompt=prompt)


def specs(*tasks: str) -> list[AgentStepSpec]:
    return [spec(t) for t in tasks]


# -- journaling and resuming -------------------------------------------------------------------


async def test_a_fresh_run_journals_each_success_and_deletes_the_checkpoint_at_the_end(
    store: Watched,
) -> None:
    ex = Fake()
    work = specs("a", "b", "c")
    outcomes = await execute_parallel_resumable(ex, work, WF, store)
    assert [o.task_id for o in outcomes] == ["a", "b", "c"]
    assert all(o.success for o in outcomes)
    # One save per success, each a whole checkpoint holding one more step than the last.
    assert [len(json.loads(t)["steps"]) for t in store.saved] == [1, 2, 3]
    last = WorkflowCheckpoint.from_json(store.saved[-1], WF)
    assert last.completed() == {o.task_id: o for o in outcomes}
    assert store.steps() is None
    assert store.deletes == 1


async def test_a_failed_step_is_left_for_the_resume_which_runs_only_it(store: Watched) -> None:
    ex = Fake(fail={"b"})
    work = specs("a", "b", "c")
    first = await execute_parallel_resumable(ex, work, WF, store)
    assert [o.success for o in first] == [True, False, True]
    assert store.steps() == {"a", "c"}  # failures are not journaled
    assert store.deletes == 0

    ex.fail.clear()
    resumed = await execute_parallel_resumable(ex, work, WF, store)
    assert ex.calls == {"a": 1, "b": 2, "c": 1}
    assert [o.task_id for o in resumed] == ["a", "b", "c"]
    assert all(o.success for o in resumed)
    assert resumed[0] == first[0]
    assert resumed[2] == first[2]
    assert store.steps() is None


async def test_after_a_crash_the_journaled_steps_never_run_again(store: Watched) -> None:
    ex = Fake()
    work = specs("a", "b", "c", "d")
    # c and d hang until released; the run is killed once a and b are on disk.
    ex.gates = {"c": anyio.Event(), "d": anyio.Event()}
    journaled = store.expect("a", "b")
    # A guard, not a pacing sleep: if a and b are never journaled the test fails, not hangs.
    with anyio.fail_after(10), anyio.CancelScope() as crash:

        async def kill_when_journaled() -> None:
            await journaled.wait()
            crash.cancel()

        async with anyio.create_task_group() as tg:
            tg.start_soon(kill_when_journaled)
            await execute_parallel_resumable(ex, work, WF, store)
    assert crash.cancelled_caught
    assert store.steps() == {"a", "b"}

    ex.gates = {}
    resumed = await execute_parallel_resumable(ex, work, WF, store)
    assert ex.calls == {"a": 1, "b": 1, "c": 2, "d": 2}
    assert ex.successes == {"a": 1, "b": 1, "c": 1, "d": 1}
    assert [o.task_id for o in resumed] == ["a", "b", "c", "d"]
    assert all(o.success for o in resumed)
    assert store.steps() is None


async def test_a_completed_step_whose_spec_changed_is_refused_and_nothing_runs(
    store: Watched,
) -> None:
    ex = Fake()
    await execute_parallel_resumable(ex, specs("pay", "mail"), WF, store)
    store.inner.save_checkpoint(
        WF,
        WorkflowCheckpoint(
            workflow_id=WF,
            steps={
                "pay": WorkflowStepRecord(
                    task_id="pay",
                    digest=spec_digest(spec("pay")),
                    outcome=StepOutcome.ok(spec("pay"), "charged"),
                    completed_at_ms=1,
                )
            },
            updated_at_ms=1,
        ).to_json(),
    )
    before = store.inner.load_checkpoint(WF)
    with pytest.raises(CheckpointError, match=r"'pay' already succeeded with another spec"):
        await execute_parallel_resumable(ex, [spec("pay", "charge 20"), spec("x")], WF, store)
    assert ex.calls == {"pay": 1, "mail": 1}  # nothing ran: not the changed step, not x
    assert store.inner.load_checkpoint(WF) == before  # and the checkpoint is kept


async def test_a_changed_spec_under_the_same_task_id_runs_again_when_asked(
    store: Watched,
) -> None:
    ex = Fake(fail={"b"})
    await execute_parallel_resumable(ex, specs("a", "b", "c"), WF, store)
    assert store.steps() == {"a", "c"}

    # a's prompt changed, c is no longer part of the workflow, b still fails.
    changed = [spec("a", "go faster"), spec("b")]
    outcomes = await execute_parallel_resumable(ex, changed, WF, store, rerun_changed=True)
    assert ex.calls == {"a": 2, "b": 2, "c": 1}
    assert outcomes[0].output == "a did 'go faster'"
    text = store.inner.load_checkpoint(WF)
    kept = WorkflowCheckpoint.from_json(text, WF)
    assert set(kept.steps) == {"a"}  # c's record dropped, a's replaced
    assert kept.steps["a"].digest == spec_digest(changed[0])

    # Unchanged since: a is reused, only b runs.
    ex.fail.clear()
    again = await execute_parallel_resumable(ex, changed, WF, store)
    assert ex.calls == {"a": 2, "b": 3, "c": 1}
    assert again[0] == outcomes[0]
    assert store.steps() is None


async def test_every_step_reused_runs_nothing_and_clears_the_checkpoint(store: Watched) -> None:
    ex = Fake()
    work = specs("a", "b")
    done = WorkflowCheckpoint(
        workflow_id=WF,
        steps={
            s.task_id: WorkflowStepRecord(
                task_id=s.task_id,
                digest=spec_digest(s),
                outcome=StepOutcome.ok(s, "earlier"),
                completed_at_ms=1,
            )
            for s in work
        },
        updated_at_ms=1,
    )
    store.inner.save_checkpoint(WF, done.to_json())
    outcomes = await execute_parallel_resumable(ex, work, WF, store)
    assert ex.calls == {}
    assert [o.output for o in outcomes] == ["earlier", "earlier"]
    assert store.steps() is None


# -- fail closed -------------------------------------------------------------------------------


def _record_json(task: str, prompt: str = "go", **outcome: Any) -> dict[str, Any]:
    s = spec(task, prompt)
    out = {"task_id": task, "agent": "worker", "output": "old", "success": True} | outcome
    return {"task_id": task, "digest": spec_digest(s), "outcome": out, "completed_at_ms": 5}


def _checkpoint_json(**fields: Any) -> str:
    doc: dict[str, Any] = {
        "schema_version": 1,
        "workflow_id": WF,
        "steps": {"a": _record_json("a")},
        "updated_at_ms": 5,
    }
    doc.update(fields)
    return json.dumps(doc)


BAD_CHECKPOINTS = {
    "garbage bytes": ("\x00\xff\xfe\x89PNG not json at all", "not valid JSON"),
    "truncated": (_checkpoint_json()[:40], "not valid JSON"),
    "empty": ("", "not valid JSON"),
    "json array": ("[1, 2, 3]", "not an object"),
    "json string": ('"hello"', "not an object"),
    "nan": (_checkpoint_json(updated_at_ms=float("nan")), "not valid JSON"),
    "no version": (_checkpoint_json(schema_version=None), "schema_version"),
    "version zero": (_checkpoint_json(schema_version=0), "versions start at 1"),
    "future version": (
        _checkpoint_json(schema_version=WORKFLOW_CHECKPOINT_SCHEMA_VERSION + 1),
        "upgrade slateflow",
    ),
    "other workflow": (_checkpoint_json(workflow_id="wf-other"), "'wf-other'"),
    "key mismatch": (_checkpoint_json(steps={"b": _record_json("a")}), "under 'b'"),
    "missing field": (
        json.dumps({"schema_version": 1, "workflow_id": WF, "steps": {}}),
        "does not validate",
    ),
    "unknown field": (_checkpoint_json(pickle="gASVAAAAAAAAAAA="), "does not validate"),
    "bad digest": (
        _checkpoint_json(steps={"a": _record_json("a") | {"digest": "xyz"}}),
        "does not validate",
    ),
    "failed outcome": (
        _checkpoint_json(steps={"a": _record_json("a", success=False, error="no")}),
        "does not validate",
    ),
    "outcome of another task": (
        _checkpoint_json(steps={"a": _record_json("a", task_id="b")}),
        "does not validate",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_CHECKPOINTS))
async def test_an_untrustworthy_checkpoint_raises_and_nothing_runs(
    store: Watched, case: str
) -> None:
    text, problem = BAD_CHECKPOINTS[case]
    store.inner.save_checkpoint(WF, text)
    ex = Fake()
    state = State()
    with pytest.raises(CheckpointError, match=repr(WF)) as caught:
        await execute_parallel_resumable(ex, specs("a", "b"), WF, store, state=state)
    assert problem in str(caught.value)
    assert ex.calls == {}
    assert state.keys() == []
    # Left exactly as found, for a person to look at or delete.
    assert store.inner.load_checkpoint(WF) == text
    assert store.saved == []
    assert store.deletes == 0


async def test_a_future_schema_version_names_both_versions(store: Watched) -> None:
    store.inner.save_checkpoint(WF, _checkpoint_json(schema_version=7))
    ex = Fake()
    with pytest.raises(CheckpointError) as caught:
        await execute_parallel_resumable(ex, specs("a"), WF, store)
    message = str(caught.value)
    assert "schema version 7" in message
    assert f"the {WORKFLOW_CHECKPOINT_SCHEMA_VERSION} this slateflow reads" in message
    assert "delete the checkpoint" in message
    assert ex.calls == {}


async def test_a_store_that_cannot_load_fails_closed(store: Watched) -> None:
    store.fail_load = True
    ex = Fake()
    with pytest.raises(CheckpointError, match="the disk is on fire") as caught:
        await execute_parallel_resumable(ex, specs("a"), WF, store)
    assert isinstance(caught.value.__cause__, StoreError)
    assert ex.calls == {}


async def test_a_hand_written_version_1_checkpoint_loads(store: Watched) -> None:
    digest = spec_digest(spec("a"))
    text = (
        '{"schema_version": 1, "workflow_id": "wf-1", "updated_at_ms": 1700000000000,\n'
        ' "steps": {"a": {"task_id": "a", "digest": "' + digest + '", "completed_at_ms": 1,\n'
        '   "outcome": {"task_id": "a", "agent": "worker", "output": "by hand",'
        ' "success": true, "structured": {"x": [1, 2.5, null]}}}}}'
    )
    store.inner.save_checkpoint(WF, text)
    ex = Fake(fail={"b"})
    outcomes = await execute_parallel_resumable(ex, specs("a", "b"), WF, store)
    assert ex.calls == {"b": 1}
    assert outcomes[0].output == "by hand"
    assert outcomes[0].structured == {"x": [1, 2.5, None]}
    assert store.steps() == {"a"}


# -- a live run is not failed by its journal ---------------------------------------------------


async def test_a_store_that_cannot_save_does_not_fail_the_run(
    store: Watched, caplog: pytest.LogCaptureFixture
) -> None:
    store.fail_save = True
    ex = Fake(fail={"b"})
    with caplog.at_level(logging.WARNING, logger="slateflow.orchestrate"):
        outcomes = await execute_parallel_resumable(ex, specs("a", "b", "c"), WF, store)
    assert [o.success for o in outcomes] == [True, False, True]
    warnings = [r for r in caplog.records if r.name == "slateflow.orchestrate"]
    assert len(warnings) == 2
    assert all("could not be saved" in r.getMessage() and WF in r.getMessage() for r in warnings)
    assert store.steps() is None  # nothing journaled: a resume runs everything again


async def test_a_store_that_cannot_delete_does_not_fail_the_run(
    store: Watched, caplog: pytest.LogCaptureFixture
) -> None:
    store.fail_delete = True
    with caplog.at_level(logging.WARNING, logger="slateflow.orchestrate"):
        outcomes = await execute_parallel_resumable(Fake(), specs("a"), WF, store)
    assert outcomes[0].success
    assert any("could not be deleted" in r.getMessage() for r in caplog.records)


# -- like execute_parallel ---------------------------------------------------------------------


@pytest.mark.parametrize(("hint", "bound"), [(0, 1), (1, 1), (3, 3)])
async def test_concurrency_is_bounded_by_the_hint(store: Watched, hint: int, bound: int) -> None:
    ex = Fake(hint=hint, fail={"t0", "t1"})
    work = specs(*(f"t{i}" for i in range(10)))
    await execute_parallel_resumable(ex, work, WF, store)
    assert ex.peak == bound
    # On resume only the two failed steps are pending: still bounded.
    ex.peak = 0
    await execute_parallel_resumable(ex, work, WF, store)
    assert ex.peak == min(bound, 2)
    assert sum(ex.calls.values()) == 12


async def test_the_state_records_the_steps_that_ran(store: Watched) -> None:
    ex = Fake(fail={"b"})
    work = specs("a", "b", "c")
    first = State()
    await execute_parallel_resumable(ex, work, WF, store, state=first)
    assert first.get("a:status") == "done"
    assert first.get("a:result") == {"len": 2}
    assert first.get("b:status") == "error"
    assert first.get("b:error") == "said no"

    ex.fail.clear()
    second = State()
    await execute_parallel_resumable(ex, work, WF, store, state=second)
    assert second.get("b:status") == "done"
    assert second.get("b:result") == {"len": 2}
    assert sorted(second.keys()) == ["b:result", "b:status"]  # a and c reused, not run


async def test_outcomes_match_execute_parallel(store: Watched) -> None:
    work = [spec("x", "one"), spec("y", "two"), spec("z", "three")]
    plain = await execute_parallel(Fake(fail={"y"}), work)
    resumable = await execute_parallel_resumable(Fake(fail={"y"}), work, WF, store)
    assert resumable == plain


class NoCheckpoints:
    def load_checkpoint(self, workflow_id: str) -> str | None:
        return None


@pytest.mark.parametrize(
    ("work", "workflow_id", "make_store", "message"),
    [
        ([spec("a"), spec("a")], WF, MemoryStore, "repeated: a"),
        ([spec("a"), "b"], WF, MemoryStore, r"specs\[1\]"),
        ([spec("a")], "", MemoryStore, "workflow_id"),
        ([spec("a")], 7, MemoryStore, "workflow_id"),
        ([spec("a")], WF, NoCheckpoints, "does not keep checkpoints"),
        ([spec("a")], WF, dict, "does not keep checkpoints"),
    ],
)
async def test_bad_arguments_are_refused_before_anything_runs(
    work: list[Any], workflow_id: Any, make_store: Callable[[], Any], message: str
) -> None:
    ex = Fake()
    target = make_store()
    with pytest.raises(OrchestrationError, match=message):
        await execute_parallel_resumable(ex, work, workflow_id, target)
    assert ex.calls == {}


async def test_a_bad_concurrency_hint_is_refused_before_loading(store: Watched) -> None:
    ex = Fake(hint=-1)
    with pytest.raises(OrchestrationError, match="concurrency_hint"):
        await execute_parallel_resumable(ex, specs("a"), WF, store)
    assert store.loads == 0


# -- the checkpoint format ---------------------------------------------------------------------


def test_the_digest_is_sha256_of_the_canonical_json_of_the_spec() -> None:
    s = AgentStepSpec(task_id="a", agent="w", prompt="héllo", input={"b": 1, "a": [1, 2]})
    canonical = json.dumps(s.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    assert spec_digest(s) == hashlib.sha256(canonical.encode()).hexdigest()
    assert spec_digest(s) == spec_digest(s.model_copy())
    for changed in (
        s.model_copy(update={"prompt": "hello"}),
        s.model_copy(update={"agent": "v"}),
        s.model_copy(update={"input": {"b": 1, "a": [2, 1]}}),
        s.model_copy(update={"model": "m"}),
    ):
        assert spec_digest(changed) != spec_digest(s)


def test_a_checkpoint_round_trips_through_json() -> None:
    s = spec("a")
    record = WorkflowStepRecord(
        task_id="a",
        digest=spec_digest(s),
        outcome=StepOutcome.ok(s, "out", structured={"k": [1, "v", None]}),
        completed_at_ms=3,
    )
    cp = WorkflowCheckpoint(workflow_id=WF, steps={"a": record}, updated_at_ms=4)
    back = WorkflowCheckpoint.from_json(cp.to_json(), WF)
    assert back == cp
    assert back.schema_version == WORKFLOW_CHECKPOINT_SCHEMA_VERSION == 2
    assert back.completed() == {"a": record.outcome}
    with pytest.raises(CheckpointError, match="'other'"):
        WorkflowCheckpoint.from_json(cp.to_json(), "other")


def test_ensure_loadable_refuses_versions_it_cannot_read() -> None:
    for version, problem in ((3, "upgrade slateflow"), (0, "versions start at 1")):
        cp = WorkflowCheckpoint(workflow_id=WF, schema_version=version, updated_at_ms=0)
        with pytest.raises(CheckpointError, match=problem):
            cp.ensure_loadable()
    WorkflowCheckpoint(workflow_id=WF, updated_at_ms=0).ensure_loadable()


def test_an_older_version_is_migrated_a_version_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Pretend this slateflow writes version 3, so today's version-1 format is "older".
    seen: list[int] = []

    def one_to_two(doc: dict[str, Any]) -> dict[str, Any]:
        seen.append(doc["schema_version"])
        doc["steps"] = doc.pop("old_steps")
        return doc

    def two_to_three(doc: dict[str, Any]) -> dict[str, Any]:
        seen.append(doc["schema_version"])
        return doc

    monkeypatch.setattr(checkpoint_module, "WORKFLOW_CHECKPOINT_SCHEMA_VERSION", 3)
    monkeypatch.setattr(checkpoint_module, "_MIGRATIONS", {1: one_to_two, 2: two_to_three})
    old = json.dumps(
        {
            "schema_version": 1,
            "workflow_id": WF,
            "old_steps": {"a": _record_json("a")},
            "updated_at_ms": 5,
        }
    )
    cp = WorkflowCheckpoint.from_json(old, WF)
    assert seen == [1, 2]
    assert cp.schema_version == 3
    assert set(cp.steps) == {"a"}

    # A version with no way forward, or a migration that breaks, is refused.
    monkeypatch.setattr(checkpoint_module, "_MIGRATIONS", {1: one_to_two})
    with pytest.raises(CheckpointError, match="cannot migrate"):
        WorkflowCheckpoint.from_json(old, WF)
    monkeypatch.setattr(checkpoint_module, "_MIGRATIONS", {1: two_to_three, 2: two_to_three})
    with pytest.raises(CheckpointError, match="does not validate"):
        WorkflowCheckpoint.from_json(old, WF)
    monkeypatch.setattr(checkpoint_module, "_MIGRATIONS", {1: one_to_two, 2: two_to_three})
    broken = json.dumps({"schema_version": 1, "workflow_id": WF, "updated_at_ms": 5})
    with pytest.raises(CheckpointError, match="could not be migrated from schema version 1"):
        WorkflowCheckpoint.from_json(broken, WF)


def test_only_text_is_read() -> None:
    data = _checkpoint_json().encode()
    with pytest.raises(CheckpointError, match="bytes, not JSON text"):
        WorkflowCheckpoint.from_json(data, WF)  # type: ignore[arg-type]


# -- property: crash anywhere, resume, and it is as if nothing happened ------------------------


@settings(deadline=None, max_examples=40)
@given(
    work=st.lists(st.booleans(), min_size=1, max_size=12),
    crash_after=st.integers(0, 12),
    hint=st.integers(0, 5),
)
def test_a_crash_at_any_point_then_a_resume_equals_an_uninterrupted_run(
    work: list[bool], crash_after: int, hint: int
) -> None:
    """``work[i]`` says whether step ``t{i}`` succeeds; the run is killed once ``crash_after``
    steps have succeeded (before the first step when 0; never if fewer succeed)."""
    failing = {f"t{i}" for i, ok in enumerate(work) if not ok}
    todo = [spec(f"t{i}", f"p{i}") for i in range(len(work))]

    async def main() -> None:
        expected = await execute_parallel(Fake(hint, failing), todo)

        store = MemoryStore()
        ex = Fake(hint, failing)
        with anyio.CancelScope() as crash:
            successes = 0

            def count(task: str) -> None:
                nonlocal successes
                successes += 1
                if successes == crash_after:
                    crash.cancel()

            ex.after_success = count
            if crash_after == 0:
                crash.cancel()
            await execute_parallel_resumable(ex, todo, WF, store)
        text = store.load_checkpoint(WF)
        journaled = set() if text is None else set(WorkflowCheckpoint.from_json(text, WF).steps)
        assert journaled.isdisjoint(failing)

        first_calls = Counter(ex.calls)
        ex.after_success = None
        outcomes = await execute_parallel_resumable(ex, todo, WF, store)
        assert outcomes == expected
        for task in journaled:
            assert ex.successes[task] == 1  # exactly once
            assert ex.calls[task] == first_calls[task]  # not even called on resume
        for s in todo:
            if s.task_id not in failing:
                assert ex.successes[s.task_id] >= 1
        if not failing:
            assert store.load_checkpoint(WF) is None
        else:
            assert (store.load_checkpoint(WF) is None) == (len(failing) == len(todo))

    for backend in ("asyncio", "trio"):
        anyio.run(main, backend=backend)


# -- a tampered outcome is never served ------------------------------------------------------


def _saved_checkpoint() -> dict[str, Any]:
    s = spec("pay")
    record = WorkflowStepRecord(
        task_id="pay",
        digest=spec_digest(s),
        outcome=StepOutcome.ok(s, "charged 10", structured={"amount": 10, "ok": True}),
        completed_at_ms=7,
    )
    doc: dict[str, Any] = json.loads(
        WorkflowCheckpoint(workflow_id=WF, steps={"pay": record}, updated_at_ms=8).to_json()
    )
    return doc


def _tamper(value: Any, rng: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + rng.randint(1, 9)
    if isinstance(value, str) and len(value) == 64:  # a hex digest: another valid one
        return hashlib.sha256(value.encode()).hexdigest()
    if isinstance(value, str):
        return value + rng.choice([" ", "0", "x", "!"])
    if value is None:
        return "something"
    return value


def _leaves(doc: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    if isinstance(doc, dict):
        for key, value in doc.items():
            yield from _leaves(value, (*path, key))
    else:
        yield path


@given(st.data())
@settings(max_examples=150, deadline=None)
def test_a_tampered_step_record_is_refused_never_served(data: st.DataObject) -> None:
    doc = _saved_checkpoint()
    record = doc["steps"]["pay"]
    paths = [p for p in _leaves(record) if p not in (("task_id",), ("outcome", "task_id"))]
    path = data.draw(st.sampled_from(paths))
    rng = data.draw(st.randoms(use_true_random=False))
    target = record
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = _tamper(target[path[-1]], rng)
    with pytest.raises(CheckpointError, match=r"'pay'|does not validate"):
        WorkflowCheckpoint.from_json(json.dumps(doc), WF)


def test_a_step_record_without_its_check_is_refused() -> None:
    doc = _saved_checkpoint()
    del doc["steps"]["pay"]["check"]
    doc["steps"]["pay"]["outcome"]["output"] = "charged 0"
    with pytest.raises(CheckpointError, match="'pay' has no check"):
        WorkflowCheckpoint.from_json(json.dumps(doc), WF)


async def test_a_tampered_outcome_runs_nothing_on_resume(store: Watched) -> None:
    doc = _saved_checkpoint()
    doc["steps"]["pay"]["outcome"]["structured"]["amount"] = 0
    store.inner.save_checkpoint(WF, json.dumps(doc))
    ex = Fake()
    with pytest.raises(CheckpointError, match="saved outcome of step 'pay' does not match"):
        await execute_parallel_resumable(ex, [spec("pay")], WF, store)
    assert ex.calls == {}


def test_a_version_1_checkpoint_is_migrated_with_checks() -> None:
    doc = _saved_checkpoint()
    del doc["steps"]["pay"]["check"]
    doc["schema_version"] = 1
    back = WorkflowCheckpoint.from_json(json.dumps(doc), WF)
    assert back.schema_version == 2
    assert back.steps["pay"].matches()
    assert back.steps["pay"].outcome.output == "charged 10"


async def test_a_second_run_of_a_workflow_in_flight_is_refused_and_repeats_nothing() -> None:
    from slateflow.errors import WorkflowBusyError

    ex = Fake()
    ex.gates["b"] = anyio.Event()
    store = MemoryStore()
    work = specs("a", "b")
    first: list[StepOutcome] = []

    async def original() -> None:
        first.extend(await execute_parallel_resumable(ex, work, WF, store))

    async with anyio.create_task_group() as tg:
        tg.start_soon(original)
        while ex.calls["b"] == 0:
            await anyio.lowlevel.checkpoint()
        with pytest.raises(WorkflowBusyError, match=f"'{WF}' is already running"):
            await execute_parallel_resumable(ex, work, WF, store)  # a retry racing it
        ex.gates["b"].set()
    assert ex.calls == {"a": 1, "b": 1}  # every step ran once
    assert all(o.success for o in first)
    # Once it ended, the same workflow id may run again.
    again = await execute_parallel_resumable(ex, specs("c"), WF, store)
    assert [o.task_id for o in again] == ["c"]


async def test_the_same_workflow_id_on_another_store_is_another_workflow() -> None:
    ex = Fake()
    ex.gates["a"] = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(execute_parallel_resumable, ex, specs("a"), WF, MemoryStore())
        while ex.calls["a"] == 0:
            await anyio.lowlevel.checkpoint()
        ex.gates["a"].set()
        await execute_parallel_resumable(ex, specs("a"), WF, MemoryStore())
    assert ex.calls["a"] == 2
