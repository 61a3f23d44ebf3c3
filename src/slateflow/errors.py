"""Errors raised by slateflow.

Every failure a caller can cause raises a subclass of :class:`SlateError`. Each message names the
key (or step, or resolver) involved and says what to do about it. When a write fails, the state is
left exactly as it was: no value, version, journal record or signal is produced.

Several classes also derive from the matching built-in exception (``KeyError``, ``ValueError``,
``TimeoutError``), so code that already catches those keeps working.
"""

from __future__ import annotations

__all__ = [
    "CheckpointError",
    "CommitUnknownError",
    "CursorExpiredError",
    "DeliveryChainError",
    "DispatchError",
    "DispatchRejectedError",
    "ExtractDefinitionError",
    "FakeScriptError",
    "FlowDefinitionError",
    "FlowError",
    "FlowFormatError",
    "GuardFormatError",
    "HTTPCallError",
    "HistoryError",
    "InvalidKeyError",
    "KeyExistsError",
    "LLMOutputError",
    "LLMStreamError",
    "MissingExtraError",
    "MissingKeyError",
    "ModelCallError",
    "OrchestrationError",
    "PolicyViolation",
    "ReadOnlyError",
    "RecoveryError",
    "ResolverCancelledError",
    "ResolverDefinitionError",
    "ResolverError",
    "ResolverTimeoutError",
    "SchemaError",
    "ServerCallError",
    "SessionError",
    "SlateError",
    "SnapshotError",
    "StateValueError",
    "StoreClosedError",
    "StoreCorruptError",
    "StoreDivergedError",
    "StoreError",
    "StoreUnavailableError",
    "SupervisionError",
    "TemplateError",
    "ToolCallError",
    "ToolDefinitionError",
    "TransactionError",
    "UsageError",
    "VersionConflictError",
    "WaitTimeoutError",
    "WorkflowBusyError",
]


class SlateError(Exception):
    """Base class of every error slateflow raises on purpose.

    Catch this to handle any slateflow failure; the message is written for a person.
    """

    def __str__(self) -> str:
        # KeyError would otherwise repr() its message, wrapping it in quotes.
        return str(self.args[0]) if self.args else self.__class__.__name__


class InvalidKeyError(SlateError, ValueError):
    """A key is not a valid state key.

    Keys are non-empty strings of at most 256 characters, made of segments joined by ``:``, with
    no whitespace, control characters or ``*`` (reserved for patterns).
    """


class StateValueError(SlateError, ValueError):
    """A value cannot be stored: it is not JSON-compatible data or a pydantic model.

    Also raised for a bad ``confidence`` or ``meta`` on a write.
    """


class MissingKeyError(SlateError, KeyError):
    """A key that must exist does not (``require``, ``remove``, ``rename``)."""


class KeyExistsError(SlateError, KeyError):
    """A key that must not exist does (``rename`` onto an existing key without ``overwrite``)."""


class VersionConflictError(SlateError):
    """The key's version is not the one the writer expected; nothing was written.

    Raised by ``set(..., expected_version=v)`` and when a transaction's reads went stale before it
    committed. Read the key again and retry.
    """


class TransactionError(SlateError):
    """A transaction was used after it ended, or committed in the wrong place."""


class PolicyViolation(SlateError):
    """A write breaks a governance rule (writer, source, size, key count, read-only)."""


class ReadOnlyError(PolicyViolation):
    """A write to a read-only key, pattern or view (``state.derived``, ``state_meta:*``)."""


class SchemaError(SlateError, ValueError):
    """A value does not match the type declared for its key; pydantic's explanation follows."""


class CursorExpiredError(SlateError):
    """The journal no longer holds every change after a cursor (the ring overwrote them).

    Read less often, raise ``journal_size``, or attach a journal sink that keeps everything.
    """


class DeliveryChainError(SlateError):
    """Receivers or watchers reacting to each other's writes went on too long (one that writes
    the key it listens to): the chain was stopped. Reported on ``state.receiver_failed``; the
    writes stand, their changes were not delivered."""


class UsageError(SlateError, ValueError):
    """A call got an argument it cannot use (a wait's timeout that is not a finite number of
    seconds, say); the message names the argument and what it takes."""


class SnapshotError(SlateError, ValueError):
    """A snapshot cannot be restored: wrong format, redacted, or an invalid entry."""


class WaitTimeoutError(SlateError, TimeoutError):
    """An async wait on the state (``wait_for``, ``wait_until``) ran out of time."""


class TemplateError(SlateError, ValueError):
    """A prompt template is malformed, or cannot be rendered from the state.

    Raised when the template is built (bad syntax, with the position) and when it is rendered (a
    missing key or path, or a secret key, named in the message).
    """


class ResolverDefinitionError(SlateError, ValueError):
    """A resolver was defined with bad arguments (name, reads, retry, timeout, ...)."""


class ResolverError(SlateError):
    """A resolver run failed (after its retries); its error message is in ``<name>:error``.

    ``name`` is the resolver, ``error`` the message written to the state, ``attempts`` how many
    attempts ran; the original exception is chained as ``__cause__``. For a secret resolver
    (its result or error key is secret) ``error`` is ``"***"`` and nothing is chained: the
    exception, which usually quotes the value, stays on the run's ``exception``.
    """

    def __init__(self, message: str, *, name: str, error: str, attempts: int) -> None:
        super().__init__(message)
        self.name = name
        self.error = error
        self.attempts = attempts


class MissingExtraError(SlateError, ImportError):
    """An integration's library is not installed: the message names the extra to install
    (``pip install 'slateflow[openai]'``)."""


class ServerCallError(SlateError):
    """A server answered a call with an error status, or could not be reached (the base of
    :class:`ModelCallError` and :class:`HTTPCallError`).

    ``server`` is where it was sent, ``status`` the HTTP status (None: no answer), and
    ``retryable`` / ``retry_after`` what the server said of trying again (a 429 or 5xx is
    retryable, honouring ``Retry-After``; a 400, 401 or 404 is not): a resolver's ``Retry``
    takes them at their word.
    """

    def __init__(
        self,
        message: str,
        *,
        server: str,
        status: int | None,
        retryable: bool,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.server = server
        self.status = status
        self.retryable = retryable
        self.retry_after = retry_after


class ModelCallError(ServerCallError):
    """A model server answered a call with an error status, or could not be reached."""


class HTTPCallError(ServerCallError):
    """An HTTP resolver's request failed: an error status, no answer, an answer too large or
    not the shape its ``output`` asks for. The message names the resolver, the method and the
    URL (secret values masked): ``HTTP 503 from availability (GET http://host/slots)``."""


class LLMOutputError(SlateError, ValueError):
    """A model's answer does not match the output model its resolver asked for (not JSON, or
    failing validation): the run fails and nothing is written to ``<name>:result``."""


class LLMStreamError(SlateError):
    """A streamed answer ended before the model finished it (the connection dropped, the
    server stopped): the run fails rather than keep a truncated answer."""


class ResolverTimeoutError(SlateError, TimeoutError):
    """One attempt of a resolver ran longer than its ``timeout`` (retried like any failure)."""


class ResolverCancelledError(SlateError):
    """Awaited a run that was cancelled (``run.wait()`` on a cancelled or superseded run)."""


class DispatchRejectedError(SlateError):
    """A dispatch was refused: the resolver uses ``on_conflict="reject"`` and is already running."""


class SessionError(SlateError):
    """A Session was used outside its ``async with`` block, or from another thread."""


class GuardFormatError(SlateError, ValueError):
    """A guard cannot be built, read from JSON or written to JSON.

    The message names the path of the bad node (``guard.of[1].key``) and what was expected; a
    custom guard (code) refuses to serialise.
    """


class FlowDefinitionError(SlateError, ValueError):
    """A flow is malformed: ``flow.build()`` / ``flow.compile()`` found problems.

    ``problems`` lists every problem found (not only the first), each naming the step, tool or
    constraint involved; the message shows them all, one per line.
    """

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        super().__init__(message)
        self.problems: list[str] = list(problems or [message])


class FlowFormatError(SlateError, ValueError):
    """A flow cannot be read from or written to JSON.

    The message names the path of the bad node (``flow.steps[2].done.of[0].key``) and what was
    expected; a flow holding a custom guard refuses to serialise.
    """


class ToolDefinitionError(SlateError, ValueError):
    """A tool was defined with a function whose signature or docstring cannot make its schema
    (a ``*args`` parameter, a type pydantic cannot describe, no description), or a toolbox was
    given two tools of one name."""


class ToolCallError(SlateError):
    """A tool call shared an identical call that failed or was cancelled (``run_tool``); the
    failure of that call is the ``__cause__``."""


class FlowError(SlateError):
    """A flow runner was misused: an unknown step name, a runner used after ``close()``, an
    ``on_enter`` action with no session to run it in. (Waits that time out raise
    :class:`WaitTimeoutError`.)"""


class FakeScriptError(SlateError):
    """A testing fake was used beyond its script: called more often than it has replies, or
    asked to complete a call that is not waiting. The message says how many were scripted."""


class ExtractDefinitionError(SlateError, ValueError):
    """An extractor was defined with bad arguments; the message names the extractor and field."""


class OrchestrationError(SlateError, ValueError):
    """An orchestration was called with bad arguments (a spec, a stage, a loop without a cap);
    the message names the task or combinator and says what to pass instead."""


class DispatchError(SlateError):
    """One dispatched call failed: ``agent`` names who, the message says why (the agent's own
    exception, if any, is the ``__cause__``)."""

    def __init__(self, agent: str, message: str) -> None:
        super().__init__(message)
        self.agent = agent


class SupervisionError(SlateError):
    """A supervised agent cannot answer: it was stopped, cancelled, or its channel is closed.
    The message names the agent."""


class StoreError(SlateError):
    """A durable store cannot be opened, read or written; the message names the file and says
    what to do. A write whose commit could not be persisted is reported here."""


class StoreCorruptError(StoreError):
    """A store file is not a slateflow store, is damaged, or was written by a newer format
    version. Nothing was loaded and nothing runs; the message names the file and the bad part."""


class StoreClosedError(StoreError):
    """The state's durable store was closed: open the file again (``State.open``) to write."""


class StoreUnavailableError(StoreError):
    """The server a shared State commits through cannot be reached: nothing was committed and
    the local replica is as it was (reads keep serving it). The message names the server and
    the call; write again once it is back."""


class CommitUnknownError(StoreError):
    """A commit was sent to a shared State's server but no reply came back, even after sending
    it again: it may or may not have been applied (it is never applied twice). The replica
    catches up from the server as soon as it answers, so a commit that was applied shows in
    the State; read the key again before deciding to retry."""


class StoreDivergedError(StoreError):
    """A replica found a history on its shared store that it cannot account for (the server
    lost commits the replica had applied, or trimmed past them). The replica resynced from the
    server's snapshot; this error, sent on ``state.receiver_failed`` and logged, says what was
    lost. Nothing is merged silently."""


class HistoryError(StoreError, LookupError):
    """``state.journal.at(seq)`` asked for a commit the store no longer (or never) held: before the
    last compaction, after the newest commit, or on a state without a history store."""


class CheckpointError(StoreError):
    """A workflow checkpoint cannot be used: unreadable, from a future schema version, or for
    another workflow. The resumable run fails closed: no step runs."""


class WorkflowBusyError(CheckpointError):
    """A resumable workflow was run again while a run of it was in flight (on the same
    checkpoint store): nothing ran. Wait for the first run to end."""


class RecoveryError(SlateError):
    """Resuming after a restart needs something the caller did not give (a resolver that was in
    flight, a flow whose recorded steps no longer exist); nothing was re-dispatched."""
