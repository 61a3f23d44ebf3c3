"""ConversationScript: drive a flow turn by turn, the way a caller would talk to the agent."""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping
from typing import Any

from ..conversation import Conversation, TurnContext
from ..errors import FakeScriptError, TemplateError
from ..flow import Enforcement, Flow, FlowRunner, FlowStack, StackRunner, Verdict
from ..integrations.tools import Toolbox, ToolOutcome
from ..resolve import ManualClock
from ..resolve.clock import settle
from ..resolve.llm import ToolCall
from ..resolve.template import MISSING, Reference
from ..state import Key
from .asserts import UNSET, assert_resolved, assert_step, shown, why
from .fakes import Fake

__all__ = ["ConversationScript"]

_UNSET = UNSET


class ConversationScript:
    """A conversation with a flow, as a test script.

    Actions are awaited (each lets the session's tasks run until they are blocked again):
    ``start(flow)``, ``user(text)``, ``tool_ok(tool)``, ``call_tool(tool, args)`` and
    ``call_tools(...)`` (through a Toolbox), ``resolve(name, value)``, ``fail(name, error)``,
    ``interrupt()`` / ``noise()`` (barge-in), ``between_turns()``, ``advance(seconds)``;
    ``agent(text)`` records what the agent said. Expectations are plain calls that raise
    ``AssertionError`` with the flow's explanation and the recent journal: ``expect_step``,
    ``expect_done``, ``expect_key``, ``expect_refused``, ``expect_admitted``,
    ``expect_resolved``, ``expect_complete``.

    ``fakes`` maps resolver names to their :class:`Fake` sources, so ``resolve("availability",
    {...})`` answers the held call of that resolver. ``user(text)`` is a whole turn through
    ``conversation.user_turn``: the words (redacted as the conversation redacts them) also go
    to ``transcript_key`` (source ``"user"``), its extractors run, the flows advance,
    ``turn:`` keys are cleared, and the :class:`TurnContext` is kept in ``context``
    (``expect_told`` checks it). ``start`` takes a ``Flow`` or a ``FlowStack``; ``runner`` is
    the flow speaking now (a digression's while it has the floor).
    """

    def __init__(
        self,
        conversation: Conversation,
        *,
        fakes: Mapping[str, Fake] | None = None,
        transcript_key: str = "turn:transcript",
        toolbox: Toolbox | None = None,
    ) -> None:
        if not isinstance(conversation, Conversation):
            raise TypeError(
                f"ConversationScript takes a Conversation (Conversation(session)), got "
                f"{type(conversation).__name__}"
            )
        self.conversation = conversation
        self.session = conversation.session
        self.state = conversation.state
        self.fakes: dict[str, Fake] = dict(fakes or {})
        self.transcript_key = transcript_key
        self.toolbox = toolbox
        """The agent's tools (:meth:`call_tool`)."""
        self._call_ids = itertools.count(1)
        self.transcript: list[str] = []
        self.contexts: list[TurnContext] = []
        """The context of every turn so far, oldest first."""
        self._started: FlowRunner | StackRunner | None = None

    @property
    def _runner(self) -> FlowRunner | None:
        started = self._started
        return started.current if isinstance(started, StackRunner) else started

    @property
    def runner(self) -> FlowRunner:
        """The runner of the started flow (of a stack: the flow speaking now)."""
        runner = self._runner
        if runner is None:
            raise AssertionError("the script has no flow yet: await script.start(flow) first")
        return runner

    @property
    def stack(self) -> StackRunner:
        """The runner of the started ``FlowStack``."""
        if not isinstance(self._started, StackRunner):
            raise AssertionError("the script runs no FlowStack: await script.start(stack) first")
        return self._started

    @property
    def context(self) -> TurnContext:
        """What the model was told on the last turn."""
        if not self.contexts:
            raise AssertionError("no turn yet: await script.user(text) first")
        return self.contexts[-1]

    def use(self, name: str, fake: Fake) -> Fake:
        """Register ``fake`` as the source of resolver ``name``; returns it."""
        self.fakes[name] = fake
        return fake

    async def settle(self) -> None:
        """Let the session's tasks run until every one is blocked (time does not move)."""
        clock = self.session.clock
        if isinstance(clock, ManualClock):
            await clock.advance(0)
        else:
            await settle()

    # -- actions ---------------------------------------------------------------------------

    async def start(
        self, flow: Flow | FlowStack, *, enforcement: Enforcement | str = Enforcement.ENFORCE
    ) -> Any:
        """Start ``flow`` (or a ``FlowStack``) in the conversation; returns its runner."""
        started = self.conversation.run_flow(flow, enforcement=enforcement)
        self._started = started
        await self.settle()
        return started

    async def user(self, text: str) -> TurnContext:
        """The caller says ``text``: one whole turn (see the class docs); returns the context.
        After :meth:`interrupt`, the interruption ends with these words."""
        if self.conversation.interrupting:
            self.conversation.end_interruption(turn_follows=True)
        self.transcript.append(text)
        redact = self.conversation.redact
        heard = redact(text) if redact is not None else text
        self.state.set(self.transcript_key, heard, source="user", writer="caller")
        await self.settle()
        context = await self.conversation.user_turn(text)
        self.contexts.append(context)
        await self.settle()
        return context

    async def say(self, facts: Mapping[str, Any] | None = None, /, **named: Any) -> None:
        """Facts an extractor recognised this turn, written in one batch with source
        ``"extraction"``: a mapping of keys to values, or keywords. One rule for both: ``__``
        stands for ``:`` (``booking__date="Tuesday"`` and ``{"booking__date": "Tuesday"}`` both
        write ``booking:date``; a key already written with ``:`` is kept as it is)."""
        writes: dict[str | Key[Any], Any] = {}
        for key, value in [*(facts or {}).items(), *named.items()]:
            writes[key.replace("__", ":") if isinstance(key, str) else key] = value
        self.state.update(writes, source="extraction", writer="script")
        await self.settle()

    async def tool_ok(self, tool: str) -> None:
        """The model calls ``tool`` and it succeeds. Fails the test if the flow refuses it."""
        started = self._started
        admission = (started if isinstance(started, StackRunner) else self.runner).admit(tool)
        if not admission.allowed:
            raise AssertionError(
                f"the flow refused {tool!r}: {admission.reason}\n{why(self.runner, self.state)}"
            )
        await self.conversation.tool_ok(tool)
        await self.settle()

    async def interrupt(self) -> None:
        """The caller starts talking over the agent (``begin_interruption``): ``interrupt``
        results landing now are held. The next :meth:`user` ends it with the words said;
        :meth:`noise` ends it with none."""
        self.conversation.begin_interruption()
        await self.settle()

    async def noise(self) -> None:
        """The interruption was noise (a cough, no words): ``end_interruption(turn_follows=
        False)``, so what it held is delivered now."""
        if not self.conversation.interrupting:
            raise AssertionError("noise() ends an interruption: await script.interrupt() first")
        self.conversation.end_interruption(turn_follows=False)
        await self.settle()

    def agent(self, text: str) -> None:
        """The agent said ``text`` (``conversation.agent_said``): it joins the transcript, and
        the context it was spoken from counts as handed over."""
        self.conversation.agent_said(text)

    async def between_turns(self) -> TurnContext:
        """What the model would be told now, with no user turn (a result landed while the line
        is quiet): ``conversation.context_now()``, kept in ``contexts`` for ``expect_told``."""
        await self.settle()
        context = self.conversation.context_now()
        self.contexts.append(context)
        return context

    def use_tools(self, toolbox: Toolbox) -> Toolbox:
        """The agent's tools, for :meth:`call_tool`; returns ``toolbox``."""
        self.toolbox = toolbox
        return toolbox

    async def call_tool(
        self, tool: str, arguments: Mapping[str, Any] | None = None, *, call_id: str | None = None
    ) -> ToolOutcome:
        """The model calls ``tool`` with ``arguments`` through the toolbox (:meth:`use_tools`):
        admitted or refused by the flows, validated, run, recorded. Returns the outcome (a
        refusal is an outcome, not a failure: ``outcome.status == "refused"``)."""
        outcome = await self._toolbox().call(
            self.conversation, tool, dict(arguments or {}), call_id=call_id
        )
        await self.settle()
        return outcome

    async def call_tools(self, *calls: tuple[str, Mapping[str, Any]]) -> list[ToolOutcome]:
        """The model calls several tools in one reply (run concurrently, as voice frameworks
        do): ``call_tools(("book", {...}), ("book", {...}))``; outcomes in the calls' order."""
        batch = [
            ToolCall(id=f"call_{next(self._call_ids)}", name=name, arguments=json.dumps(args))
            for name, args in calls
        ]
        outcomes = await self._toolbox().call_all(self.conversation, batch)
        await self.settle()
        return outcomes

    def _toolbox(self) -> Toolbox:
        if self.toolbox is None:
            raise AssertionError(
                "the script has no tools: script.use_tools(Toolbox(...)) or "
                "ConversationScript(conversation, toolbox=...)"
            )
        return self.toolbox

    def _fake(self, name: str) -> Fake:
        fake = self.fakes.get(name)
        if fake is None:
            known = ", ".join(sorted(self.fakes)) or "none"
            raise AssertionError(
                f"no fake is registered for resolver {name!r} (registered: {known}); pass "
                "fakes={name: fake} to the script or call script.use(name, fake)"
            )
        return fake

    async def resolve(self, name: str, value: Any) -> None:
        """Answer the held call of resolver ``name``'s fake with ``value``."""
        await self.settle()  # a call just dispatched may not have reached its fake yet
        try:
            self._fake(name).complete(value)
        except FakeScriptError as exc:
            raise AssertionError(f"{exc}\n{why(self._runner, self.state)}") from None
        await self.settle()

    async def fail(self, name: str, error: BaseException | str) -> None:
        """Make the held call of resolver ``name``'s fake raise ``error``."""
        await self.settle()
        try:
            self._fake(name).fail(error)
        except FakeScriptError as exc:
            raise AssertionError(f"{exc}\n{why(self._runner, self.state)}") from None
        await self.settle()

    async def advance(self, seconds: float) -> None:
        """Move the session's manual clock on by ``seconds``."""
        clock = self.session.clock
        if not isinstance(clock, ManualClock):
            raise AssertionError("advance() needs a Session with a ManualClock")
        await clock.advance(seconds)

    # -- expectations ------------------------------------------------------------------------

    def expect_step(self, step: str) -> None:
        """The flow is at ``step`` (it is active)."""
        assert_step(self.runner, step)

    def expect_done(self, step: str) -> None:
        """``step`` is done."""
        assert_step(self.runner, step, Verdict.DONE)

    def expect_key(self, key: str, value: Any = _UNSET) -> None:
        """``key`` is set (to ``value``, when given); ``key`` may be a path into its value,
        ``"pick:slot.time"``, as in templates and guards."""
        try:
            ref = Reference(key)
        except TemplateError as exc:
            raise FakeScriptError(f"expect_key({key!r}): {exc}") from None
        got = ref.lookup(self.state)
        where = f"{key!r}" if ref.key == key else f"{key!r} (a path into {ref.key!r})"
        if got is MISSING:
            raise AssertionError(
                f"expected {where} to be set, and it is not\n{why(self._runner, self.state)}"
            )
        if value is not _UNSET and (got != value or type(got) is not type(value)):
            raise AssertionError(
                f"expected {where} to be {value!r}, got "
                f"{shown(self.state, ref.key, got)}\n{why(self._runner, self.state)}"
            )

    def _why_blocked(self, tool: str) -> str | None:
        # A stack answers for all its layers (the main flow's constraints bind in a digression).
        started = self._started
        runner = started if isinstance(started, StackRunner) else self.runner
        return runner.admit(tool, record=False).reason or None

    def expect_refused(self, tool: str, reason: str | None = None) -> str:
        """The flow refuses ``tool`` now (with ``reason`` in its message, when given); returns
        the reason. Records nothing, even in observe mode."""
        refusal = self._why_blocked(tool)
        if refusal is None:
            raise AssertionError(
                f"expected the flow to refuse {tool!r}, but it admits it\n"
                + why(self.runner, self.state)
            )
        if reason is not None and reason not in refusal:
            raise AssertionError(
                f"{tool!r} is refused, but not for {reason!r}: {refusal}\n"
                + why(self.runner, self.state)
            )
        return refusal

    def expect_admitted(self, tool: str) -> None:
        """The flow admits ``tool`` now."""
        refusal = self._why_blocked(tool)
        if refusal is not None:
            raise AssertionError(
                f"expected {tool!r} to be admitted, but: {refusal}\n" + why(self.runner, self.state)
            )

    def expect_told(self, text: str) -> str:
        """The last turn's context has a line containing ``text`` (new or repeated); returns
        that line."""
        for line in self.context.all_lines:
            if text in line:
                return line
        told = "\n".join(f"  {line}" for line in self.context.all_lines) or "  (nothing)"
        raise AssertionError(f"expected the model to be told {text!r}; it was told:\n{told}")

    def expect_resolved(self, name: str, value: Any = _UNSET) -> None:
        """Resolver ``name`` has a result (equal to ``value``, when given)."""
        assert_resolved(self.state, name, value, runner=self._runner)

    def expect_complete(self) -> None:
        """The flow is complete."""
        if not self.runner.is_complete:
            raise AssertionError(
                "expected the flow to be complete\n" + why(self.runner, self.state)
            )
