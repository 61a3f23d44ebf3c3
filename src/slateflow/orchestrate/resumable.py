"""A fan-out that survives a crash: each successful step is journaled in a checkpoint store, and
running the same workflow id again runs only what did not succeed."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import anyio

from ..errors import CheckpointError, OrchestrationError, WorkflowBusyError
from ..state import State
from ..stores.base import CheckpointStore
from .checkpoint import WorkflowCheckpoint, WorkflowStepRecord, spec_digest
from .combinators import check_specs, check_unique_ids, run_step, step_limiter
from .spec import AgentExecutor, AgentStepSpec, StepOutcome

__all__ = ["execute_parallel_resumable"]

log = logging.getLogger("slateflow.orchestrate")

_WHERE = "execute_parallel_resumable"


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


async def execute_parallel_resumable(
    executor: AgentExecutor,
    specs: Iterable[AgentStepSpec],
    workflow_id: str,
    store: CheckpointStore,
    *,
    state: State | None = None,
    rerun_changed: bool = False,
) -> list[StepOutcome]:
    """Run ``specs`` like ``execute_parallel``, journaling each success in ``store`` under
    ``workflow_id`` so that running it again after a crash runs only what had not succeeded.

    - Exactly once for journaled steps: a step whose success was saved is not run again while
      its spec (agent, prompt, input, options) is unchanged; its saved outcome is returned in
      its place.
    - A step that succeeded under another spec (same task id, changed agent, prompt, input or
      options) is refused with ``CheckpointError`` naming it, and nothing runs: running it again
      could repeat its side effect (a payment twice). Pass ``rerun_changed=True`` to run such
      steps again, or give the changed work a new task id. Records of task ids no longer in
      ``specs`` are dropped.
    - At least once for steps in flight at a crash: a step that finished but was not yet
      journaled runs again, so executors should tolerate a repeat.
    - Failed steps are not journaled: the next run retries them. When every step has
      succeeded the checkpoint is deleted; otherwise it stays for the next run.
    - The checkpoint is JSON only (never pickle). A checkpoint that cannot be trusted
      (damaged, a saved outcome that does not match its check, from a newer slateflow, for
      another workflow) raises ``CheckpointError`` and nothing runs (fail closed); delete it to
      start afresh.
    - A checkpoint that cannot be saved does not fail the run: a warning is logged and the
      steps it missed run again on resume.
    - One run of a workflow at a time: a second run of the same ``workflow_id`` on the same
      store (or file) while one is in flight in this process raises ``WorkflowBusyError`` and
      runs nothing (a retry racing the original would repeat every unfinished step). Across
      processes, a SQLite store has one writer per file, so two cannot run on one file.

    At most ``executor.concurrency_hint`` steps run at once; ``state`` records the steps that
    run (not the reused ones) as ``execute_parallel`` does. Outcomes come back in input order.
    """
    checked = check_specs(specs, _WHERE)
    check_unique_ids(checked, _WHERE, "a checkpoint keeps steps by task id")
    if not isinstance(workflow_id, str) or not workflow_id:
        raise OrchestrationError(
            f"{_WHERE}: workflow_id must be a non-empty string naming the run to resume, "
            f"got {workflow_id!r}"
        )
    if not isinstance(store, CheckpointStore):
        raise OrchestrationError(
            f"{_WHERE}: store {type(store).__name__} does not keep checkpoints; pass one with "
            "load_checkpoint, save_checkpoint and delete_checkpoint (MemoryStore, SQLiteStore)"
        )
    with _claimed(store, workflow_id):
        return await _resume(executor, checked, workflow_id, store, state, rerun_changed)


# The runs in flight in this process, by store and workflow id: a second run of one workflow
# while the first is running would run every step the first has not journaled yet again.
_running: set[tuple[object, str]] = set()
_running_lock = threading.Lock()


@contextmanager
def _claimed(store: CheckpointStore, workflow_id: str) -> Iterator[None]:
    path = getattr(store, "path", None)
    where: object = str(path) if path is not None else id(store)
    key = (where, workflow_id)
    with _running_lock:
        if key in _running:
            raise WorkflowBusyError(
                f"workflow {workflow_id!r} is already running on this checkpoint store; a "
                "second run at once would repeat the steps the first has not finished: wait "
                "for it to end (its outcomes are then reused, or the workflow is done)"
            )
        _running.add(key)
    try:
        yield
    finally:
        with _running_lock:
            _running.discard(key)


async def _resume(
    executor: AgentExecutor,
    checked: list[AgentStepSpec],
    workflow_id: str,
    store: CheckpointStore,
    state: State | None,
    rerun_changed: bool,
) -> list[StepOutcome]:
    limiter: anyio.CapacityLimiter | None = step_limiter(executor)
    digests = {s.task_id: spec_digest(s) for s in checked}
    try:
        text = await anyio.to_thread.run_sync(store.load_checkpoint, workflow_id)
    except CheckpointError:
        raise
    except Exception as exc:
        raise CheckpointError(
            f"the checkpoint of workflow {workflow_id!r} could not be read from "
            f"{type(store).__name__}: {exc}"
        ) from exc
    records: dict[str, WorkflowStepRecord] = {}
    dropped = False
    changed: list[str] = []
    if text is not None:
        for task, record in WorkflowCheckpoint.from_json(text, workflow_id).steps.items():
            if digests.get(task) == record.digest:
                records[task] = record
            else:
                dropped = True
                if task in digests:
                    changed.append(task)
    if changed and not rerun_changed:
        names = ", ".join(repr(t) for t in changed)
        raise CheckpointError(
            f"workflow {workflow_id!r}: step(s) {names} already succeeded with another spec "
            "(its agent, prompt, input or options changed since); running them again could "
            "repeat their side effects, so nothing ran: pass rerun_changed=True to run them "
            "again, or give the changed work a new task id"
        )

    outcomes: list[StepOutcome | None] = [
        records[s.task_id].outcome if s.task_id in records else None for s in checked
    ]
    pending = [(i, s) for i, s in enumerate(checked) if s.task_id not in records]
    lock = anyio.Lock()

    async def save() -> None:
        # Called under ``lock``: saves are whole-checkpoint replacements, so two at once could
        # let an older snapshot land last and forget a step.
        data = WorkflowCheckpoint(
            workflow_id=workflow_id, steps=dict(records), updated_at_ms=_now_ms()
        ).to_json()
        try:
            await anyio.to_thread.run_sync(store.save_checkpoint, workflow_id, data)
        except Exception as exc:
            log.warning(
                "workflow %r: the checkpoint could not be saved (the run goes on; steps it "
                "missed will run again on resume): %r",
                workflow_id,
                exc,
            )

    async def branch(i: int, spec: AgentStepSpec) -> None:
        outcome = await run_step(executor, spec, state=state, limiter=limiter)
        outcomes[i] = outcome
        if outcome.success:
            async with lock:
                records[spec.task_id] = WorkflowStepRecord(
                    task_id=spec.task_id,
                    digest=digests[spec.task_id],
                    outcome=outcome,
                    completed_at_ms=_now_ms(),
                )
                await save()

    if pending:
        if dropped:
            # Stale records (changed specs, task ids no longer run) must not outlive this run
            # even if no step succeeds now.
            async with lock:
                await save()
        assert limiter is not None
        if limiter.total_tokens >= len(pending):
            limiter = None  # every branch fits: no slot to wait for
        async with anyio.create_task_group() as tg:
            for i, spec in pending:
                tg.start_soon(branch, i, spec)

    done = [o for o in outcomes if o is not None]
    if all(o.success for o in done):
        try:
            await anyio.to_thread.run_sync(store.delete_checkpoint, workflow_id)
        except Exception as exc:
            log.warning(
                "workflow %r finished but its checkpoint could not be deleted (a rerun "
                "reuses its outcomes): %r",
                workflow_id,
                exc,
            )
    return done
