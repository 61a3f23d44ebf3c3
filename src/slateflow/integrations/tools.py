"""Tools a model calls: a schema derived from the function, arguments validated before
anything runs, the call run through the conversation's atomic admission, its outcome in the
State and in words the model can act on.

``@tool`` turns a function into a :class:`Tool` (schema from type hints and docstring: see
:mod:`slateflow.integrations.tool_schema`); a :class:`Toolbox` holds a call's tools, exports
their schemas (OpenAI, Anthropic, Gemini, or :class:`~slateflow.resolve.ToolSpec` for an
``llm`` resolver), only the ones the flows admit now when asked, and runs the model's calls::

    @tool
    async def book(ctx: ToolContext, date: str, party: int) -> dict:
        '''Book a table.

        Args:
            date: The day, as YYYY-MM-DD.
            party: How many people.
        '''
        return await api.book(date, party, key=ctx.idempotency_key)

    toolbox = Toolbox(book)
    outcome = await toolbox.call(conversation, "book", '{"date": "2026-12-01", "party": 4}')
    outcome.content  # what the model hears: the result, the refusal or the error

Docstrings with sections need ``griffelib`` (``pip install 'slateflow[tools]'``).
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, overload

import anyio
import anyio.to_thread
from pydantic import ValidationError
from pydantic_core import to_jsonable_python

from ..conversation.extract import Field, TurnExtractor, make_field
from ..conversation.promotion import Decision, Promotion
from ..errors import ExtractDefinitionError, SlateError, ToolDefinitionError
from ..resolve.clock import real_work
from ..resolve.llm import Message, ToolCall, ToolSpec
from ..state.keys import check_key
from .tool_schema import (
    Signature,
    anthropic_schema,
    gemini_schema,
    openai_schema,
    read_signature,
)

if TYPE_CHECKING:
    from ..conversation import Conversation
    from ..state import State

__all__ = [
    "Tool",
    "ToolContext",
    "ToolOutcome",
    "Toolbox",
    "tool",
]

Format = Literal["openai", "anthropic", "gemini"]
Status = Literal["done", "failed", "refused", "invalid", "error", "timeout"]
Fills = Mapping[str, str | tuple[str, Promotion]]
_FORMATS = {"openai": openai_schema, "anthropic": anthropic_schema, "gemini": gemini_schema}
DEFAULT_TIMEOUT = 30.0


@dataclass(frozen=True, slots=True)
class ToolContext:
    """What a tool function gets as its first argument when it asks for it (annotated
    ``ToolContext``, or named ``ctx`` / ``context``): the conversation, the tool, the model's
    call id and the call's ``idempotency_key``, which a side-effecting tool passes on (a
    booking API's ``Idempotency-Key``) so a call retried after a timeout is done once."""

    conversation: Conversation
    tool: str
    call_id: str | None
    idempotency_key: str
    arguments: dict[str, Any]

    @property
    def state(self) -> State:
        """The conversation's State."""
        return self.conversation.state


@dataclass(frozen=True, slots=True)
class ToolOutcome:
    """What one tool call came to. ``status``: ``"done"``; ``"failed"`` (it ran and returned
    :class:`~slateflow.conversation.ToolFailed`); ``"refused"`` (a flow did not admit it);
    ``"invalid"`` (bad arguments or an unknown tool: nothing ran); ``"error"`` (it raised);
    ``"timeout"``. ``content`` is what the model hears (the result as text, or the refusal or
    error in words it can act on); ``value`` the result; ``decisions`` what became of the
    argument values the tool ``fills`` into the State."""

    tool: str
    status: Status
    content: str
    call_id: str | None = None
    value: Any = None
    error: str | None = None
    shared: bool = False
    decisions: tuple[Decision, ...] = field(default=())

    @property
    def ok(self) -> bool:
        """Whether the tool ran and succeeded."""
        return self.status == "done"

    def message(self) -> Message:
        """The ``tool`` message answering the model's call, for the next request."""
        return Message(role="tool", content=self.content, tool_call_id=self.call_id or "call")


class Tool:
    """A function a model may call, with the schema of its arguments (see the module docs).

    ``name`` defaults to the function's name; ``description`` to its docstring's first
    paragraph. ``timeout``: seconds a call may run (None: the toolbox's default). ``fills``:
    arguments that are also facts for the State, ``{"party": "booking:party"}`` or
    ``{"party": ("booking:party", overwrite())}``: when a call is admitted, their values go
    through the promotion rule (default ``keep_known``) with provenance source ``tool_args``,
    before the function runs. Calling the tool object calls the function.
    """

    __slots__ = ("_fills", "_signature", "description", "fn", "name", "timeout")

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        timeout: float | None = None,
        fills: Fills | None = None,
    ) -> None:
        if not callable(fn):
            raise ToolDefinitionError(f"a tool is made of a function, got {fn!r}")
        label = name if name is not None else getattr(fn, "__name__", "")
        try:
            if type(label) is not str or not label or ":" in label:
                raise ValueError(label)
            check_key(f"tool:{label}:result")
        except (SlateError, ValueError):
            raise ToolDefinitionError(
                f"tool name {label!r} cannot name its state keys (tool:<name>:result); use "
                "letters, digits, '_' or '-'"
            ) from None
        self.name: str = label
        self.fn = fn
        self._signature: Signature = read_signature(fn, label, ToolContext, description)
        self.description = self._signature.description
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0
        ):
            raise ToolDefinitionError(f"tool {label!r}: timeout must be seconds > 0")
        self.timeout = timeout
        self._fills = _fills(label, fills, self._signature)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    @property
    def parameters(self) -> dict[str, Any]:
        """The JSON schema of the arguments."""
        return self._signature.parameters

    def spec(self) -> ToolSpec:
        """The tool for an ``llm`` resolver or :class:`~slateflow.resolve.LLMRequest`."""
        return ToolSpec(name=self.name, description=self.description, parameters=self.parameters)

    def schema(self, format: Format = "openai") -> dict[str, Any]:
        """The tool as ``format``'s API takes it: ``"openai"`` (chat completions and every
        compatible server), ``"anthropic"`` (Messages ``tools``) or ``"gemini"`` (a function
        declaration)."""
        make = _FORMATS.get(format)
        if make is None:
            raise ValueError(f"format must be one of {sorted(_FORMATS)}, got {format!r}")
        return make(self.name, self.description, self.parameters)

    def validate(self, arguments: str | Mapping[str, Any] | None) -> tuple[Any, dict[str, Any]]:
        """The arguments checked against the schema: what the function gets and their JSON
        form; raises ``ValueError`` with a message for the model."""
        if arguments is None or arguments == "":
            data: Any = {}
        elif isinstance(arguments, str):
            try:
                data = json.loads(arguments)
            except ValueError as exc:
                raise ValueError(f"the arguments are not JSON ({exc})") from None
        else:
            data = dict(arguments)
        if not isinstance(data, dict):
            raise ValueError(f"the arguments must be a JSON object, got {type(data).__name__}")
        try:
            checked = self._signature.model.model_validate(data)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}" for e in exc.errors()
            )
            raise ValueError(problems) from None
        return checked, checked.model_dump(mode="json")

    async def invoke(self, context: ToolContext, checked: Any) -> Any:
        """Run the function with checked arguments: a sync one in a worker thread, an async
        one on the loop."""
        signature = self._signature
        kwargs: dict[str, Any]
        if signature.single is not None:
            kwargs = {signature.single: checked}
        else:
            kwargs = {name: getattr(checked, name) for name in type(checked).model_fields}
        if signature.context is not None:
            kwargs[signature.context] = context
        fn = self.fn
        if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
            getattr(fn, "__call__", None)  # noqa: B004 - a callable object's own call
        ):
            return await fn(**kwargs)
        with real_work():
            value = await anyio.to_thread.run_sync(
                functools.partial(fn, **kwargs), abandon_on_cancel=True
            )
        if inspect.isawaitable(value):
            value = await value
        return value

    def fill(self, state: State, arguments: dict[str, Any]) -> tuple[Decision, ...]:
        """Promote the argument values the tool ``fills`` (source ``tool_args``)."""
        if self._fills is None:
            return ()
        found = {
            f.name: (arguments[f.name], 1.0) for f in self._fills.fields if f.name in arguments
        }
        if not found:
            return ()
        return self._fills.promote(state, found, writer=self.name, source="tool_args").decisions

    def __repr__(self) -> str:
        return f"Tool({self.name!r})"


def _fills(name: str, fills: Fills | None, signature: Signature) -> TurnExtractor | None:
    if not fills:
        return None
    allowed = set(signature.model.model_fields)
    known: dict[str, Field] = {}
    for arg, target in fills.items():
        if arg not in allowed:
            raise ToolDefinitionError(
                f"tool {name!r}: fills {arg!r}, which is not one of its arguments {sorted(allowed)}"
            )
        key, rule = (target, None) if isinstance(target, str) else target
        try:
            known[arg] = make_field(f"tool:{name}", known, arg, key, None, rule)
        except ExtractDefinitionError as exc:
            raise ToolDefinitionError(str(exc)) from None
    return TurnExtractor(f"tool:{name}", tuple(known.values()), (), 1)


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...
@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    timeout: float | None = None,
    fills: Fills | None = None,
) -> Callable[[Callable[..., Any]], Tool]: ...
def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout: float | None = None,
    fills: Fills | None = None,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Make a :class:`Tool` of a function: ``@tool`` or ``@tool(name=..., fills=...)``."""

    def make(f: Callable[..., Any]) -> Tool:
        return Tool(f, name=name, description=description, timeout=timeout, fills=fills)

    return make(fn) if fn is not None else make


class Toolbox:
    """The tools of a call, by name: their schemas, and the model's calls run through the
    conversation.

    ``timeout`` is the seconds a call may run unless its tool says otherwise. A call
    (:meth:`call`) is checked (an unknown tool or bad arguments: the model hears what was
    wrong, nothing runs), admitted by the flows atomically (refused: the model hears why),
    fills its arguments into the State, runs (identical concurrent calls share one
    execution), writes ``tool:<name>:result`` or ``tool:<name>:error`` with provenance
    (source ``tool``, the call id and idempotency key in ``meta``), and reports a success to
    the flows. A failure or timeout becomes words the model can act on, never an exception.
    """

    __slots__ = ("_tools", "timeout")

    def __init__(self, *tools: Tool | Callable[..., Any], timeout: float = DEFAULT_TIMEOUT) -> None:
        self._tools: dict[str, Tool] = {}
        self.timeout = timeout
        for item in tools:
            self.add(item)

    def add(self, item: Tool | Callable[..., Any]) -> Tool:
        """Add a tool (a function is made one with :func:`tool`); returns it."""
        made = item if isinstance(item, Tool) else Tool(item)
        if made.name in self._tools:
            raise ToolDefinitionError(f"the toolbox already has a tool named {made.name!r}")
        self._tools[made.name] = made
        return made

    @property
    def names(self) -> tuple[str, ...]:
        """The tools' names, in the order they were added (``Conversation(tools=...)``)."""
        return tuple(self._tools)

    def __getitem__(self, name: str) -> Tool:
        return self._tools[name]

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[Tool]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    def _chosen(self, names: Iterable[str] | None) -> list[Tool]:
        if names is None:
            return list(self._tools.values())
        return [self._tools[n] for n in names if n in self._tools]

    def admitted(self, conversation: Conversation) -> tuple[str, ...]:
        """The tools every flow of ``conversation`` admits now (a question: nothing is
        recorded). A turn's context says the same in ``context.tools``."""
        return tuple(n for n in self._tools if conversation.admit(n, record=False).allowed)

    def specs(self, names: Iterable[str] | None = None) -> tuple[ToolSpec, ...]:
        """The tools (all, or those of ``names`` that it has) as
        :class:`~slateflow.resolve.ToolSpec`: ``specs(context.tools)`` for this turn."""
        return tuple(t.spec() for t in self._chosen(names))

    def schemas(
        self, format: Format = "openai", names: Iterable[str] | None = None
    ) -> list[dict[str, Any]]:
        """The tools (all, or those of ``names``) as ``format``'s API takes them."""
        return [t.schema(format) for t in self._chosen(names)]

    async def call(
        self,
        conversation: Conversation,
        name: str,
        arguments: str | Mapping[str, Any] | None = None,
        *,
        call_id: str | None = None,
    ) -> ToolOutcome:
        """Run the model's call of ``name`` with ``arguments`` (its JSON text or a mapping);
        see the class docs. Never raises for what the model did; cancelling the caller
        cancels the call."""
        found = self._tools.get(name)
        if found is None:
            known = ", ".join(self._tools) or "none"
            return ToolOutcome(
                name,
                "invalid",
                f"Error: there is no tool named {name!r}. Tools: {known}.",
                call_id,
                error=f"unknown tool {name!r}",
            )
        try:
            checked, data = found.validate(arguments)
        except ValueError as exc:
            return ToolOutcome(
                name,
                "invalid",
                f"Error: the arguments of {name!r} are invalid: {exc}. Nothing was done; call "
                "it again with arguments that match its schema.",
                call_id,
                error=str(exc),
            )
        return await _Call(self, found, conversation, checked, data, call_id).run()

    async def call_all(
        self, conversation: Conversation, calls: Iterable[ToolCall]
    ) -> list[ToolOutcome]:
        """Run a model reply's tool calls concurrently (as voice frameworks do); the outcomes
        in the calls' order (``[o.message() for o in outcomes]`` answers them)."""
        todo = list(calls)
        outcomes: list[ToolOutcome | None] = [None] * len(todo)

        async def one(i: int, call: ToolCall) -> None:
            outcomes[i] = await self.call(conversation, call.name, call.arguments, call_id=call.id)

        async with anyio.create_task_group() as tg:
            for i, call in enumerate(todo):
                tg.start_soon(one, i, call)
        return [o for o in outcomes if o is not None]

    def __repr__(self) -> str:
        return f"Toolbox({', '.join(self._tools)})"


class _Call:
    """One admitted-or-refused run of a tool (:meth:`Toolbox.call`)."""

    def __init__(
        self,
        box: Toolbox,
        found: Tool,
        conversation: Conversation,
        checked: Any,
        data: dict[str, Any],
        call_id: str | None,
    ) -> None:
        self.tool = found
        self.conversation = conversation
        self.checked = checked
        self.data = data
        self.call_id = call_id
        self.timeout = found.timeout if found.timeout is not None else box.timeout
        canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
        turn = conversation.state.get("session:turn", 0)
        basis = f"{found.name}\n{call_id}" if call_id else f"{found.name}\n{canonical}\n{turn}"
        self.key = f"{found.name}-{hashlib.sha256(basis.encode()).hexdigest()[:24]}"
        self.decisions: tuple[Decision, ...] = ()

    async def _body(self, **_: Any) -> Any:
        # Inside the claim: admitted. The facts first, so the function and guards see them.
        self.decisions = self.tool.fill(self.conversation.state, self.data)
        context = ToolContext(self.conversation, self.tool.name, self.call_id, self.key, self.data)
        return await self.tool.invoke(context, self.checked)

    async def run(self) -> ToolOutcome:
        name = self.tool.name
        clock = self.conversation.session.clock
        began = clock.monotonic()
        try:
            with clock.deadline(self.timeout) as scope:
                result = await self.conversation.run_tool(
                    name, self._body, self.data, call_id=self.call_id
                )
        except Exception as exc:
            text = f"{type(exc).__name__}: {exc}"
            return self._record("error", f"Error: tool {name!r} failed ({text}).", text, began)
        if scope.cancelled_caught:
            text = f"it did not finish within {self.timeout:g} s and was stopped"
            return self._record("timeout", f"Error: tool {name!r} timed out: {text}.", text, began)
        if not result.allowed:
            return ToolOutcome(
                name,
                "refused",
                f"Refused: {result.reason or 'not allowed now'}",
                self.call_id,
                error=result.reason,
                decisions=self.decisions,
            )
        try:
            value = to_jsonable_python(result.value)
        except Exception as exc:
            text = f"its result cannot be stored as data ({exc})"
            return self._record("error", f"Error: tool {name!r} failed: {text}.", text, began)
        if result.failed:
            text = value if isinstance(value, str) else _spell(value)
            return self._record(
                "failed", f"Failed: {text}", text, began, value=value, shared=result.shared
            )
        return self._record("done", "", None, began, value=value, shared=result.shared)

    def _record(
        self,
        status: Status,
        content: str,
        error: str | None,
        began: float,
        *,
        value: Any = None,
        shared: bool = False,
    ) -> ToolOutcome:
        name = self.tool.name
        state = self.conversation.state
        result_key, error_key = f"tool:{name}:result", f"tool:{name}:error"
        meta = {
            "call_id": self.call_id,
            "idempotency_key": self.key,
            "status": status,
            "duration_ms": round((self.conversation.session.clock.monotonic() - began) * 1e3, 3),
            "shared": shared,
        }
        secret = state.is_secret(result_key) or state.is_secret(error_key)
        with state.transaction():
            if status == "done":
                state.set(result_key, value, source="tool", writer=name, meta=meta)
                state.remove(error_key, None, source="tool", writer=name)
            else:
                state.set(error_key, error, source="tool", writer=name, meta=meta)
                state.remove(result_key, None, source="tool", writer=name)
        if status == "done":
            content = (
                "Done (the result is private)."
                if secret
                else value
                if isinstance(value, str)
                else _spell(value)
            )
        elif secret:
            content = f"Error: tool {name!r} did not succeed (the reason is private)."
        return ToolOutcome(
            name, status, content, self.call_id, value, error, shared, self.decisions
        )


def _spell(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
