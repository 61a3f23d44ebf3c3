"""Workflow checkpoints: which steps of a resumable fan-out already succeeded, as JSON text.

A checkpoint is written by :func:`~slateflow.orchestrate.resumable.execute_parallel_resumable`
after each successful step and read back when the same workflow id runs again. It is only ever
JSON (never pickle: a checkpoint file must not be able to run code), carries a schema version,
and is refused (:class:`~slateflow.errors.CheckpointError`) rather than guessed at when it is
damaged, from a newer slateflow, or for another workflow.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ..errors import CheckpointError
from .spec import AgentStepSpec, StepOutcome

__all__ = [
    "WORKFLOW_CHECKPOINT_SCHEMA_VERSION",
    "WorkflowCheckpoint",
    "WorkflowStepRecord",
    "record_check",
    "spec_digest",
]

WORKFLOW_CHECKPOINT_SCHEMA_VERSION = 2
"""The checkpoint format this slateflow writes; it reads this one and older ones.

2: every step record carries ``check``, the digest of the record itself (:func:`record_check`).
"""


def spec_digest(spec: AgentStepSpec) -> str:
    """The sha256 (hex) of ``spec``'s canonical JSON (sorted keys, no spaces).

    Two specs have the same digest exactly when they describe the same work, so a checkpointed
    step is reused only while its task id still names the same agent, prompt, input and options.
    """
    canonical = json.dumps(spec.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def record_check(task_id: str, digest: str, outcome: StepOutcome, completed_at_ms: int) -> str:
    """The sha256 (hex) of a step record's canonical JSON: what its ``check`` must be.

    A checkpoint whose saved outcome was edited or damaged no longer matches it and is refused
    (``CheckpointError``) instead of being served on resume.
    """
    canonical = json.dumps(
        {
            "task_id": task_id,
            "digest": digest,
            "outcome": outcome.model_dump(mode="json"),
            "completed_at_ms": completed_at_ms,
        },
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=True,
    )
    return hashlib.sha256(canonical.encode("ascii")).hexdigest()


class WorkflowStepRecord(BaseModel):
    """One successful step in a checkpoint: its task id, the digest of the spec it ran
    (:func:`spec_digest`), its outcome, and when it completed (ms since the epoch).

    Only successes are recorded (a failed step runs again on resume), so ``outcome`` must be a
    success for this task id. ``check`` (:func:`record_check`) is computed when a record is
    made; a checkpoint read back must carry it, and it must match.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    task_id: str = Field(min_length=1)
    digest: str = Field(pattern=r"^[0-9a-f]{64}$")
    outcome: StepOutcome
    completed_at_ms: int = Field(ge=0)
    check: str = Field(default="", pattern=r"^([0-9a-f]{64})?$")

    @model_validator(mode="after")
    def _a_success_of_this_task(self) -> WorkflowStepRecord:
        if self.outcome.task_id != self.task_id:
            raise ValueError(
                f"the outcome is for task {self.outcome.task_id!r}, not {self.task_id!r}"
            )
        if not self.outcome.success:
            raise ValueError(f"the outcome of {self.task_id!r} is a failure; only successes")
        if not self.check:
            expected = record_check(self.task_id, self.digest, self.outcome, self.completed_at_ms)
            object.__setattr__(self, "check", expected)  # frozen: set once, as it is made
        return self

    def matches(self) -> bool:
        """Whether ``check`` is the digest of this record as it stands."""
        expected = record_check(self.task_id, self.digest, self.outcome, self.completed_at_ms)
        return self.check == expected


def _v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
    """Version 1 had no record checks: compute them from the records as they are."""
    steps = data.get("steps")
    if isinstance(steps, dict):
        data["steps"] = {key: _with_check(record) for key, record in steps.items()}
    return data


def _with_check(record: Any) -> Any:
    try:
        return WorkflowStepRecord.model_validate(record).model_dump(mode="json")
    except ValidationError:
        return record  # left as it is: validating the checkpoint says what is wrong


# Version n -> a function turning a version-n checkpoint (parsed JSON) into version n + 1.
_MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {1: _v1_to_v2}


class WorkflowCheckpoint(BaseModel):
    """The successful steps of one workflow run so far, by task id.

    Read one with :meth:`from_json`, which refuses (``CheckpointError``) anything it cannot
    trust; write one with :meth:`to_json`. ``updated_at_ms`` is when it was last saved.
    """

    model_config = ConfigDict(extra="forbid")

    schema_version: int = WORKFLOW_CHECKPOINT_SCHEMA_VERSION
    workflow_id: str = Field(min_length=1)
    steps: dict[str, WorkflowStepRecord] = Field(default_factory=dict)
    updated_at_ms: int = Field(ge=0)

    def ensure_loadable(self) -> None:
        """Raise ``CheckpointError`` unless this slateflow can read this checkpoint's version
        (1 up to :data:`WORKFLOW_CHECKPOINT_SCHEMA_VERSION`)."""
        _check_version(self.schema_version, self.workflow_id)

    def completed(self) -> dict[str, StepOutcome]:
        """The outcome of each recorded step, by task id."""
        return {task: record.outcome for task, record in self.steps.items()}

    def to_json(self) -> str:
        """This checkpoint as JSON text (what a ``CheckpointStore`` saves)."""
        return self.model_dump_json()

    @classmethod
    def from_json(cls, text: str, workflow_id: str) -> WorkflowCheckpoint:
        """Read the checkpoint of ``workflow_id`` from JSON ``text``.

        Raises ``CheckpointError`` (naming the workflow and the problem) when ``text`` is not a
        JSON object, does not validate, comes from a newer schema version, belongs to another
        workflow, or files a step under a key that is not its task id. Older versions are
        migrated. Only JSON is parsed: nothing in a checkpoint can run code.
        """
        where = f"the checkpoint of workflow {workflow_id!r}"
        if not isinstance(text, str):
            raise CheckpointError(f"{where} is {type(text).__name__}, not JSON text")
        try:
            data = json.loads(text, parse_constant=_no_constants)
        except (ValueError, RecursionError) as exc:
            raise CheckpointError(
                f"{where} is not valid JSON (damaged or truncated: {exc}); delete it to start "
                "the workflow afresh"
            ) from None
        if not isinstance(data, dict):
            raise CheckpointError(
                f"{where} is a JSON {type(data).__name__}, not an object; delete it to start "
                "the workflow afresh"
            )
        version = data.get("schema_version")
        if type(version) is not int:
            raise CheckpointError(
                f"{where} has no whole-number schema_version (found {version!r}); delete it to "
                "start the workflow afresh"
            )
        _check_version(version, workflow_id)
        if version < WORKFLOW_CHECKPOINT_SCHEMA_VERSION:
            data = _migrate(data, version, workflow_id)
        else:
            _require_checks(data, where)
        try:
            checkpoint = cls.model_validate(data)
        except ValidationError as exc:
            raise CheckpointError(
                f"{where} does not validate; delete it to start the workflow afresh:\n{exc}"
            ) from None
        checkpoint.ensure_loadable()
        if checkpoint.workflow_id != workflow_id:
            raise CheckpointError(
                f"{where} belongs to workflow {checkpoint.workflow_id!r}; the store returned "
                "another workflow's checkpoint"
            )
        for key, record in checkpoint.steps.items():
            if key != record.task_id:
                raise CheckpointError(
                    f"{where} files the step {record.task_id!r} under {key!r}; delete it to "
                    "start the workflow afresh"
                )
            if not record.matches():
                raise CheckpointError(
                    f"{where}: the saved outcome of step {key!r} does not match its check "
                    "(edited or damaged); it is not served: delete the checkpoint to run the "
                    "workflow afresh"
                )
        return checkpoint


def _require_checks(data: dict[str, Any], where: str) -> None:
    """Every step record of a current checkpoint carries its check (one removed by an edit must
    not be recomputed from the edited record)."""
    steps = data.get("steps")
    if not isinstance(steps, dict):
        return  # validation says what is wrong
    for key, record in steps.items():
        if isinstance(record, dict) and not record.get("check"):
            raise CheckpointError(
                f"{where}: the step {key!r} has no check, so its outcome cannot be trusted; "
                "delete the checkpoint to run the workflow afresh"
            )


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _check_version(version: int, workflow_id: str) -> None:
    current = WORKFLOW_CHECKPOINT_SCHEMA_VERSION
    if version > current:
        raise CheckpointError(
            f"the checkpoint of workflow {workflow_id!r} has schema version {version}, newer "
            f"than the {current} this slateflow reads; upgrade slateflow or delete the "
            "checkpoint (its finished steps will run again)"
        )
    if version < 1:
        raise CheckpointError(
            f"the checkpoint of workflow {workflow_id!r} has schema version {version}; versions "
            f"start at 1 (this slateflow writes {current}); delete the checkpoint"
        )


def _migrate(data: dict[str, Any], version: int, workflow_id: str) -> dict[str, Any]:
    """Bring a parsed checkpoint of an older ``version`` up to the current one, a version at a
    time."""
    while version < WORKFLOW_CHECKPOINT_SCHEMA_VERSION:
        step = _MIGRATIONS.get(version)
        if step is None:
            raise CheckpointError(
                f"the checkpoint of workflow {workflow_id!r} has schema version {version}, which "
                "this slateflow cannot migrate; delete the checkpoint"
            )
        try:
            data = step(dict(data))
        except (KeyError, TypeError, ValueError) as exc:  # ValidationError is a ValueError
            raise CheckpointError(
                f"the checkpoint of workflow {workflow_id!r} could not be migrated from schema "
                f"version {version}: {exc}; delete the checkpoint"
            ) from None
        version += 1
        data["schema_version"] = version
    return data
