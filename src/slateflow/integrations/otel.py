"""OpenTelemetry traces of a call (extra ``slateflow[otel]``: ``opentelemetry-api`` only).

``instrument()`` makes slateflow report to OpenTelemetry through the API, so spans go wherever
the application's tracer provider sends them (an SDK with an exporter, or nowhere):

- **spans**: each user turn (``slateflow.turn``), each resolver run (``resolve {name}``: mode,
  scheduling, attempts, status, error), each model call (``chat {model}``, GenAI semantic
  conventions) and each tool call (``execute_tool {name}``);
- **events** on whichever span is current: flow steps entered and done (flow, step, and the
  guard that completed it), tool admissions (admitted or refused, with the reason) and commits
  (keys and versions; values only with ``values=True``, never a secret's, each cut at
  ``max_value_chars``; keys matching an ``exclude`` glob are left out).

Spans start in the task that does the work, under the span current there, so inside pipecat
or LiveKit slateflow's spans nest under the framework's. A background run's span links to the
turn that started it and, when its result reaches the model with a later turn's context, to
that turn too (the span then ends: its ``slateflow.run.finished`` event marks when the work
itself ended).

The call's id (``gen_ai.conversation.id``) is the Redis call id of a State from
``State.connect``, or what :func:`set_conversation_id` gave the State.
"""

from __future__ import annotations

import fnmatch
import json
import threading
import weakref
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from importlib import metadata
from typing import Any

from .. import tracing
from ..extras import require
from ..flow import signals
from ..state import Change, State

__all__ = [
    "GEN_AI_CONVERSATION_ID",
    "GEN_AI_OPERATION_NAME",
    "GEN_AI_PROVIDER_NAME",
    "GEN_AI_REQUEST_MODEL",
    "GEN_AI_RESPONSE_FINISH_REASONS",
    "GEN_AI_RESPONSE_MODEL",
    "GEN_AI_TOOL_CALL_ID",
    "GEN_AI_TOOL_NAME",
    "GEN_AI_USAGE_INPUT_TOKENS",
    "GEN_AI_USAGE_OUTPUT_TOKENS",
    "Instrumentation",
    "instrument",
    "set_conversation_id",
]

# The GenAI semantic conventions' current names, kept here: the conventions package is
# pre-release and marks most gen_ai constants deprecated.
GEN_AI_OPERATION_NAME = "gen_ai.operation.name"
GEN_AI_PROVIDER_NAME = "gen_ai.provider.name"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
GEN_AI_RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
GEN_AI_USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
GEN_AI_TOOL_NAME = "gen_ai.tool.name"
GEN_AI_TOOL_CALL_ID = "gen_ai.tool.call.id"
GEN_AI_CONVERSATION_ID = "gen_ai.conversation.id"

_STARTED = {"slateflow.link": "started"}
_PENDING_LIMIT = 256  # background spans awaiting delivery, per tracer (oldest ended first)
_TURNS_KEPT = 64  # turn span contexts remembered per State, for delivery links

_ids: weakref.WeakKeyDictionary[State, str] = weakref.WeakKeyDictionary()
_turn: ContextVar[Any] = ContextVar("slateflow_otel_turn", default=None)
_call: ContextVar[str | None] = ContextVar("slateflow_otel_call", default=None)


def set_conversation_id(state: State, conversation_id: str) -> None:
    """Name ``state``'s call in traces (``gen_ai.conversation.id``); a State connected on
    Redis is named by its call id without this."""
    if type(conversation_id) is not str or not conversation_id:
        raise TypeError(f"a conversation id is a non-empty str, got {conversation_id!r}")
    _ids[state] = conversation_id


def _conversation_id(state: State | None) -> str | None:
    if state is None:
        return _call.get()
    found = _ids.get(state)
    if found is not None:
        return found
    call_id = getattr(state.store, "call_id", None)
    return call_id if isinstance(call_id, str) else _call.get()


class _ModelCall:
    __slots__ = ("span",)

    def __init__(self, span: Any) -> None:
        self.span = span

    def answered(self, response: Any) -> None:
        span = self.span
        if not span.is_recording():
            return
        if response.model:
            span.set_attribute(GEN_AI_RESPONSE_MODEL, response.model)
        if response.finish_reason:
            span.set_attribute(GEN_AI_RESPONSE_FINISH_REASONS, [response.finish_reason])
        usage = response.usage
        if usage is not None:
            span.set_attribute(GEN_AI_USAGE_INPUT_TOKENS, usage.input_tokens)
            span.set_attribute(GEN_AI_USAGE_OUTPUT_TOKENS, usage.output_tokens)


class Instrumentation:
    """What :func:`instrument` installed: a :mod:`slateflow.tracing` tracer over an
    OpenTelemetry tracer, and receivers of the flow signals. :meth:`uninstrument` (or leaving
    a ``with`` block) takes both away."""

    def __init__(
        self,
        tracer: Any,
        *,
        values: bool,
        exclude: Sequence[str],
        max_value_chars: int,
    ) -> None:
        self._trace = require("opentelemetry.trace", "otel", "slateflow.integrations.otel")
        self._context = require("opentelemetry.context", "otel", "slateflow.integrations.otel")
        self._tracer = tracer
        self.values = values
        self.exclude = tuple(exclude)
        self.max_value_chars = max_value_chars
        self._pending: dict[tuple[int, str], list[Any]] = {}
        self._pending_count = 0
        self._turns: weakref.WeakKeyDictionary[State, dict[int, Any]] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        self._receivers = [
            (signals.step_entered, self._step_entered),
            (signals.step_done, self._step_done),
            (signals.step_reset, self._step_reset),
            (signals.flow_completed, self._flow_completed),
        ]
        self._previous: tracing.Tracer | None = None
        self._installed = False

    # -- installing --------------------------------------------------------------------------

    def _install(self) -> None:
        for signal, receiver in self._receivers:
            signal.connect(receiver, weak=False)
        self._previous = tracing.install(self)
        self._installed = True

    def uninstrument(self) -> None:
        """Stop tracing (the tracer installed before this one is restored); background spans
        still awaiting delivery end now. Idempotent."""
        if not self._installed:
            return
        self._installed = False
        for signal, receiver in self._receivers:
            signal.disconnect(receiver)
        if tracing.current is self:
            tracing.install(self._previous)
        with self._lock:
            pending, self._pending = self._pending, {}
            self._pending_count = 0
        for spans in pending.values():
            for span in spans:
                span.end()

    def __enter__(self) -> Instrumentation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.uninstrument()

    # -- spans -------------------------------------------------------------------------------

    @contextmanager
    def turn(self, conversation: Any, number: int) -> Iterator[object]:
        """The span of one user turn."""
        state = conversation.state
        call_id = _conversation_id(state)
        attributes: dict[str, Any] = {"slateflow.turn.number": number}
        if call_id is not None:
            attributes[GEN_AI_CONVERSATION_ID] = call_id
        with self._tracer.start_as_current_span("slateflow.turn", attributes=attributes) as span:
            with self._lock:
                kept = self._turns.setdefault(state, {})
                kept[number] = span.get_span_context()
                if len(kept) > _TURNS_KEPT:
                    del kept[min(kept)]
            turn_token, call_token = _turn.set(span.get_span_context()), _call.set(call_id)
            try:
                yield span
            finally:
                _turn.reset(turn_token)
                _call.reset(call_token)

    @contextmanager
    def run(self, run: Any) -> Iterator[object]:
        """The span of one resolver run, in the run's task."""
        trace = self._trace
        call_id = _conversation_id(run.state)
        attributes: dict[str, Any] = {
            "slateflow.resolver.name": run.name,
            "slateflow.resolver.mode": str(run.mode),
        }
        if run.scheduling is not None:
            attributes["slateflow.resolver.scheduling"] = str(run.scheduling)
        if call_id is not None:
            attributes[GEN_AI_CONVERSATION_ID] = call_id
        started_by = _turn.get()
        links = () if started_by is None else (trace.Link(started_by, _STARTED),)
        span = self._tracer.start_span(f"resolve {run.name}", attributes=attributes, links=links)
        # Attached by hand, not with trace.use_span: a run's failures are its status, not
        # exceptions, and this is on the path of every run.
        token = self._context.attach(trace.set_span_in_context(span))
        call_token = _call.set(call_id)
        held = False
        try:
            yield span
            held = self._finished(run, span)
        finally:
            _call.reset(call_token)
            self._context.detach(token)
            if not held:
                span.end()

    def _finished(self, run: Any, span: Any) -> bool:
        """Record how ``run`` ended on ``span``; True when the span stays open until the
        result reaches the model (a background run whose result goes to a conversation)."""
        trace = self._trace
        status = run.status
        ended: dict[str, Any] = {
            "slateflow.resolver.status": status,
            "slateflow.resolver.attempts": run.attempts,
        }
        if status == "error":
            ended["slateflow.resolver.error"] = run.error or ""
            span.set_status(trace.Status(trace.StatusCode.ERROR, run.error or "error"))
        span.set_attributes(ended)
        if run.mode != "background" or not run.to_inbox or status == "cancelled":
            return False
        span.add_event("slateflow.run.finished", {"slateflow.resolver.status": status})
        with self._lock:
            self._pending.setdefault((id(run.state), run.name), []).append(span)
            self._pending_count += 1
            oldest = self._oldest() if self._pending_count > _PENDING_LIMIT else None
        if oldest is not None:
            oldest.end()
        return True

    def _oldest(self) -> Any:
        for key, spans in self._pending.items():
            span = spans.pop(0)
            if not spans:
                del self._pending[key]
            self._pending_count -= 1
            return span
        return None

    def delivered(self, state: Any, results: Sequence[Any], turn: int) -> None:
        """Background results handed to the model with turn ``turn``'s context: their runs'
        spans link to that turn and end."""
        with self._lock:
            context = self._turns.get(state, {}).get(turn)
            spans = []
            for result in results:
                waiting = self._pending.get((id(state), result.name))
                if waiting:
                    spans.append(waiting.pop(0))
                    self._pending_count -= 1
                    if not waiting:
                        del self._pending[(id(state), result.name)]
        for span in spans:
            if context is not None:
                span.add_link(context, {"slateflow.link": "delivered"})
            span.set_attribute("slateflow.delivered.turn", turn)
            span.end()

    @contextmanager
    def model_call(self, llm: Any, request: Any) -> Iterator[_ModelCall]:
        """The span of one model call (``chat {model}``)."""
        model = request.model or getattr(llm, "model", None) or "unknown"
        attributes: dict[str, Any] = {
            GEN_AI_OPERATION_NAME: "chat",
            GEN_AI_PROVIDER_NAME: getattr(llm, "provider_name", None) or type(llm).__name__,
            GEN_AI_REQUEST_MODEL: str(model),
        }
        call_id = _call.get()
        if call_id is not None:
            attributes[GEN_AI_CONVERSATION_ID] = call_id
        with self._tracer.start_as_current_span(f"chat {model}", attributes=attributes) as span:
            yield _ModelCall(span)

    @contextmanager
    def tool(self, tool: str, call_id: str | None) -> Iterator[object]:
        """The span of one tool call (``execute_tool {name}``)."""
        attributes: dict[str, Any] = {GEN_AI_OPERATION_NAME: "execute_tool", GEN_AI_TOOL_NAME: tool}
        if call_id is not None:
            attributes[GEN_AI_TOOL_CALL_ID] = call_id
        conversation = _call.get()
        if conversation is not None:
            attributes[GEN_AI_CONVERSATION_ID] = conversation
        with self._tracer.start_as_current_span(f"execute_tool {tool}", attributes=attributes) as s:
            yield s

    # -- events ------------------------------------------------------------------------------

    def _span(self) -> Any:
        span = self._trace.get_current_span()
        return span if span.is_recording() else None

    def admission(self, tool: str, allowed: bool, reason: str | None) -> None:
        """A tool admission decided: an event on the current span."""
        span = self._span()
        if span is not None:
            attributes: dict[str, Any] = {
                "slateflow.tool.name": tool,
                "slateflow.tool.admitted": allowed,
            }
            if reason:
                attributes["slateflow.tool.reason"] = reason
            span.add_event("slateflow.tool.admission", attributes)

    def commit(self, batch: Sequence[Any]) -> None:
        """A State's commit: an event on the current span (keys, versions, values if asked)."""
        span = self._span()
        if span is None:
            return
        changes = [Change.wrap(raw) for raw in batch]
        if self.exclude:
            changes = [c for c in changes if not _excluded(c.key, self.exclude)]
        if not changes:
            return
        # Strings, not lists: the SDK checks a list item by item, on every commit.
        attributes: dict[str, Any] = {
            "slateflow.commit.seq": changes[0].seq,
            "slateflow.commit.keys": ", ".join([c.key for c in changes]),
            "slateflow.commit.versions": ", ".join([str(c.version) for c in changes]),
        }
        if self.values:
            attributes["slateflow.commit.values"] = [self._value(c) for c in changes]
        span.add_event("slateflow.commit", attributes)

    def _value(self, change: Change) -> str:
        if change.removed:
            return "(removed)"
        if change.secret:
            return "***"
        text = json.dumps(change.new, ensure_ascii=False, default=str)
        cap = self.max_value_chars
        return text if len(text) <= cap else text[:cap] + f"... ({len(text)} chars)"

    def _step(self, name: str, flow: str, step: str, guard: str | None = None) -> None:
        span = self._span()
        if span is None:
            return
        attributes = {"slateflow.flow": flow, "slateflow.step": step}
        if guard is not None:
            attributes["slateflow.guard"] = guard
        span.add_event(name, attributes)

    def _step_entered(self, runner: Any, flow: str = "", step: str = "", **_: Any) -> None:
        self._step("slateflow.step.entered", flow, step)

    def _step_done(self, runner: Any, flow: str = "", step: str = "", **_: Any) -> None:
        if self._span() is not None:  # the guard is read only for a span that records
            self._step("slateflow.step.done", flow, step, _guard(runner, step))

    def _step_reset(self, runner: Any, flow: str = "", step: str = "", **_: Any) -> None:
        self._step("slateflow.step.reset", flow, step)

    def _flow_completed(self, runner: Any, flow: str = "", **_: Any) -> None:
        span = self._span()
        if span is not None:
            span.add_event("slateflow.flow.completed", {"slateflow.flow": flow})


def _excluded(key: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(key, pattern) for pattern in patterns)


def _guard(runner: Any, step_id: str) -> str | None:
    """How the step's ``done`` guard reads (the guard that completed it), if it has one."""
    flow = getattr(runner, "flow", None)
    try:
        done = flow.step(step_id).done if flow is not None else None
    except (KeyError, ValueError, AttributeError):
        return None
    return None if done is None else str(done.describe())


def instrument(
    *,
    tracer_provider: Any = None,
    values: bool = False,
    exclude: Iterable[str] = (),
    max_value_chars: int = 256,
) -> Instrumentation:
    """Trace slateflow through OpenTelemetry (see the module docstring) until
    ``.uninstrument()``; use it as a context manager to scope it.

    ``tracer_provider``: the provider to get slateflow's tracer from (default: the global
    one, as set by ``trace.set_tracer_provider``). ``values=True`` puts committed values on
    commit events (secrets always masked); ``exclude``: key globs left out of commit events
    (``["audio:*", "transcript:*"]``: large keys flood traces); ``max_value_chars`` cuts each
    value. Raises ``MissingExtraError`` without ``opentelemetry-api``.
    """
    trace = require("opentelemetry.trace", "otel", "slateflow.integrations.otel")
    if type(max_value_chars) is not int or max_value_chars < 16:
        raise ValueError(f"max_value_chars must be a whole number >= 16, got {max_value_chars!r}")
    try:
        version: str | None = metadata.version("slateflow")
    except metadata.PackageNotFoundError:  # run from a source tree
        version = None
    tracer = trace.get_tracer("slateflow", version, tracer_provider=tracer_provider)
    instrumentation = Instrumentation(
        tracer, values=values, exclude=list(exclude), max_value_chars=max_value_chars
    )
    instrumentation._install()
    return instrumentation
