"""Background mode: an acknowledgement now, and the outcome delivered back to the model later."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..state import SECRET_MASK
from ..state.keys import error_key, result_key

if TYPE_CHECKING:
    from ..state import State
    from .run import Run

__all__ = [
    "AckFormatter",
    "BackgroundResult",
    "Deliver",
    "ResultFormatter",
    "Scheduling",
    "ToModel",
    "default_ack",
    "default_result",
    "dress",
    "is_secret_resolver",
]


class Scheduling(StrEnum):
    """When the model should hear about a background result.

    ``WHEN_IDLE``: at the next pause in the conversation. ``INTERRUPT``: now, even mid-turn.
    ``SILENT``: record it without telling the model (the state already holds it).
    """

    WHEN_IDLE = "when_idle"
    INTERRUPT = "interrupt"
    SILENT = "silent"


class BackgroundResult(BaseModel):
    """The outcome of a background run, handed to its ``deliver`` callback.

    ``status`` is ``"completed"``, ``"error"`` or ``"cancelled"``; ``value`` is set when completed,
    ``error`` (the message also written to ``<name>:error``) when it failed. ``response`` is the
    payload for the model, made by the Session's result formatter. A run cancelled because a newer
    run of the same name took over is delivered with ``superseded=True`` and ``SILENT`` scheduling.
    ``seq`` is the State commit that recorded the outcome (0 when nothing was written), so two
    results of one resolver can be told apart and ordered. ``secret`` is true when the resolver's
    result or error key is secret: the model is then only told that a secret result is
    available, or that the run failed, never the value or the message.
    """

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    name: str
    status: Literal["completed", "error", "cancelled"]
    value: Any = None
    error: str | None = None
    scheduling: Scheduling = Scheduling.WHEN_IDLE
    attempts: int = 0
    superseded: bool = False
    response: dict[str, Any] = Field(default_factory=dict)
    seq: int = 0
    secret: bool = False

    @classmethod
    def of(cls, run: Run) -> BackgroundResult:
        """The outcome of an ended ``run``: completed, error or cancelled (a superseded run's
        is ``SILENT``: a newer run of the name will deliver; this one only closes the loop)."""
        status = run.status
        ended = _ENDED.get(status, "cancelled")
        hint = run.scheduling or Scheduling.WHEN_IDLE
        return cls(
            name=run.resolver.name,
            status=ended,
            value=run.value if status == "done" else None,
            error=run.error if status == "error" else None,
            scheduling=Scheduling.SILENT if run.superseded else hint,
            attempts=run.attempts,
            superseded=run.superseded,
            seq=run.outcome_seq,
        )


_ENDED: dict[str, Literal["completed", "error", "cancelled"]] = {
    "done": "completed",
    "error": "error",
}

Deliver = Callable[[BackgroundResult], Awaitable[None] | None]
AckFormatter = Callable[[str], dict[str, Any]]
ResultFormatter = Callable[[BackgroundResult], dict[str, Any]]


def default_ack(name: str) -> dict[str, Any]:
    """The acknowledgement the model gets at once: ``{"status": "running", "resolver": name}``."""
    return {"status": "running", "resolver": name}


def default_result(result: BackgroundResult) -> dict[str, Any]:
    """The payload the model gets with the outcome: status, resolver, and result or error (a
    secret resolver's as ``"***"`` with a note saying why)."""
    payload: dict[str, Any] = {"status": result.status, "resolver": result.name}
    if result.secret and result.status == "completed":
        payload["result"] = SECRET_MASK
        payload["note"] = "a secret result is available; it is not shown"
    elif result.secret and result.status == "error":
        payload["error"] = SECRET_MASK
        payload["note"] = "the run failed; its message is secret and not shown"
    elif result.status == "completed":
        payload["result"] = result.value
    elif result.status == "error":
        payload["error"] = result.error
    return payload


class ToModel:
    """A ``deliver`` callback that hands results to a model (a conversation's
    ``deliver`` is one). On a durable State, a run delivered to one records how to hand its
    outcome over again after a restart, and what reaches the model never shows a secret
    value."""

    __slots__ = ()

    def __call__(self, result: BackgroundResult) -> Awaitable[None] | None:
        raise NotImplementedError


def is_secret_resolver(state: State, name: str) -> bool:
    """Whether what resolver ``name`` produces is secret: its result or its error key is secret
    under the State's policy (an error message often quotes the value it was about)."""
    policy = state.engine.policy
    return bool(policy.rules) and (
        policy.is_secret(result_key(name)) or policy.is_secret(error_key(name))
    )


def dress(
    result: BackgroundResult,
    formatter: ResultFormatter,
    state: State,
    *,
    to_model: bool = False,
) -> BackgroundResult:
    """``result`` with its ``response`` (what the model is told) made by ``formatter``.

    The outcome of a secret resolver (its result or error key is secret under
    ``policy(..., secret=True)``) is never shown: its response says a secret result is available
    (``"result": "***"``) or that the run failed (``"error": "***"``), and it is flagged
    ``secret``; with ``to_model`` its ``value`` and ``error`` are masked too (a ``deliver``
    callback of yours gets them in clear).
    """
    if result.status == "cancelled" or not is_secret_resolver(state, result.name):
        return result.model_copy(update={"response": formatter(result)})
    update: dict[str, Any] = {"secret": True}
    if result.value is not None:
        update["value"] = SECRET_MASK
    if result.error is not None:
        update["error"] = SECRET_MASK
    masked = result.model_copy(update=update)
    response = formatter(masked)
    kept = masked if to_model else result.model_copy(update={"secret": True})
    return kept.model_copy(update={"response": response})
