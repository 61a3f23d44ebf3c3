"""Test a pipecat call offline: a scripted LLM service, a fake voice, a caller.

- :class:`ScriptedLLMService`: a pipecat ``LLMService`` over any slateflow
  :class:`~slateflow.LLM` (a :class:`~slateflow.testing.ScriptedLLM`, a function of the request,
  or a real :class:`~slateflow.integrations.openai.OpenAIModel`): it reads the context through
  pipecat's OpenAI adapter (the wire format a provider gets), streams the reply's text and runs
  its tool calls through pipecat's function-call machinery.
- :class:`FakeVoice`: stands in for TTS and the output transport: it speaks each reply a word at
  a time (``BotStarted``/``BotStoppedSpeakingFrame``, ``TTSTextFrame``), is cut off by an
  interruption, and records what the caller heard and when.
- :func:`pipecat_call`: the pipeline around a :class:`~slateflow.integrations.pipecat.PipecatCall`
  (user aggregator with external turn strategies, steering, the LLM, the voice, the tap,
  the assistant aggregator), running, with a :class:`Caller` to drive it: ``say(text)``,
  ``begin_speaking()`` / ``finish_speaking(text)``, ``wait_quiet()``.

A first test::

    async with pipecat_call(call, ScriptedLLMService(agent)) as caller:
        await caller.say("A table for four on Saturday at seven, please.")
        await caller.wait_quiet()
        assert "Saturday" in caller.heard[-1]
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

from pipecat.frames.frames import (
    BotStartedSpeakingFrame,
    BotStoppedSpeakingFrame,
    EndFrame,
    Frame,
    FunctionCallCancelFrame,
    FunctionCallFromLLM,
    FunctionCallInProgressFrame,
    FunctionCallResultFrame,
    InterruptionFrame,
    LLMContextFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    ProposedUserStartedSpeakingFrame,
    ProposedUserStoppedSpeakingFrame,
    StartFrame,
    SystemFrame,
    TranscriptionFrame,
    TTSSpeakFrame,
    TTSTextFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import (
    LLMContextAggregatorPair,
    LLMUserAggregatorParams,
)
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.llm_service import LLMService
from pipecat.services.settings import LLMSettings
from pipecat.turns.user_mute.base_user_mute_strategy import BaseUserMuteStrategy
from pipecat.turns.user_start.external_user_turn_start_strategy import (
    ExternalUserTurnStartStrategy,
)
from pipecat.turns.user_stop.external_user_turn_stop_strategy import ExternalUserTurnStopStrategy
from pipecat.turns.user_turn_strategies import UserTurnStrategies
from pipecat.workers.runner import WorkerRunner

from ...resolve.llm import LLM, LLMRequest, Message, ToolCall, ToolSpec
from .call import PipecatCall
from .timing import FloorHold

__all__ = [
    "Caller",
    "FakeVoice",
    "LineMonitor",
    "ScriptedLLMService",
    "external_turns",
    "pipecat_call",
    "run_pipeline",
]

DOWN = FrameDirection.DOWNSTREAM
UP = FrameDirection.UPSTREAM


class ScriptedLLMService(LLMService):  # type: ignore[misc]
    """A pipecat LLM service answering from a slateflow :class:`~slateflow.LLM`.

    ``requests`` holds every :class:`~slateflow.resolve.LLMRequest` it made, in the OpenAI
    wire format's terms (system, developer, user, assistant and tool messages; the advertised
    tools). A request whose tool calls are not each answered by a tool result fails, as a
    provider refuses it.
    """

    def __init__(self, llm: LLM, **kwargs: Any) -> None:
        settings = LLMSettings(
            model="scripted", system_instruction=None, temperature=None, max_tokens=None,
            top_p=None, top_k=None, frequency_penalty=None, presence_penalty=None, seed=None,
            filter_incomplete_user_turns=None, user_turn_completion_config=None,
        )  # fmt: skip
        super().__init__(settings=settings, **kwargs)
        self.llm = llm
        self.requests: list[LLMRequest] = []

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if not isinstance(frame, LLMContextFrame):
            await self.push_frame(frame, direction)
            return
        await self.push_frame(LLMFullResponseStartFrame())
        try:
            request = await self.request(frame.context)
            self.requests.append(request)
            response = await self.llm.generate(request)
            if response.text:
                await self.push_frame(LLMTextFrame(response.text))
            if response.tool_calls and not frame.speculation:
                await self.run_function_calls(
                    [
                        FunctionCallFromLLM(
                            function_name=call.name,
                            tool_call_id=call.id,
                            arguments=call.parsed(),
                            context=frame.context,
                        )
                        for call in response.tool_calls
                    ]
                )
        except Exception as exc:
            await self.push_error(error_msg=f"scripted LLM failed: {exc}", exception=exc)
        finally:
            await self.push_frame(LLMFullResponseEndFrame())

    async def request(self, context: LLMContext) -> LLMRequest:
        """The request a provider would get for ``context`` (through the OpenAI adapter)."""
        instruction = self._settings.system_instruction
        params = await self.get_llm_adapter().get_llm_invocation_params(
            context,
            system_instruction=instruction if isinstance(instruction, str) else None,
            convert_developer_to_user=False,
        )
        messages = [_message(m) for m in params["messages"]]
        system = [m.content for m in messages if m.role == "system"]
        tools = params["tools"] if isinstance(params["tools"], list) else []
        return LLMRequest(
            system="\n\n".join(s for s in system if s) or None,
            messages=tuple(m for m in messages if m.role != "system"),
            tools=tuple(
                ToolSpec(
                    name=t["function"]["name"],
                    description=t["function"].get("description") or "",
                    parameters=t["function"].get("parameters") or {},
                )
                for t in tools
            ),
        )


def _message(m: Any) -> Message:
    content = m.get("content")
    if isinstance(content, list):
        content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    calls = tuple(
        ToolCall(id=c["id"], name=c["function"]["name"], arguments=c["function"]["arguments"])
        for c in m.get("tool_calls") or ()
    )
    return Message(
        role=m["role"],
        content=content or "",
        tool_calls=calls,
        tool_call_id=m.get("tool_call_id"),
    )


class FakeVoice(FrameProcessor):  # type: ignore[misc]
    """TTS and output transport in one, offline: speaks each reply ``word_seconds`` a word.

    As a real output does, it passes a reply's end frame on only once the reply was spoken,
    and an interruption stops it at once (what was queued is dropped). ``heard`` lists what the
    caller heard, one entry per utterance (cut short where an interruption cut it); ``events``
    the bot's speech on a time line (``("started", t)``, ``("stopped", t)``), which
    :class:`Caller` matches against the caller's own speech.
    """

    def __init__(self, *, word_seconds: float = 0.002) -> None:
        super().__init__(name="fake-voice")
        self.word_seconds = word_seconds
        self.heard: list[str] = []
        self.events: list[tuple[str, float]] = []
        self._queue: asyncio.Queue[str | Frame | None] = asyncio.Queue()
        self._speaker: asyncio.Task[None] | None = None
        self._speaking = False
        self._words: list[str] = []
        self._pending: list[str] = []

    @property
    def speaking(self) -> bool:
        """Whether the bot is speaking now."""
        return self._speaking

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, StartFrame):
            await self.push_frame(frame, direction)
            self._speaker = self.create_task(self._speak(), "fake-voice-speaker")
            return
        if isinstance(frame, InterruptionFrame):
            await self.push_frame(frame, direction)
            await self._cut_off()
            return
        if direction is DOWN and isinstance(frame, LLMTextFrame):
            self._pending.append(frame.text)  # what a TTS would synthesise
            return
        if direction is DOWN and isinstance(frame, LLMFullResponseEndFrame):
            text, self._pending = " ".join(self._pending).strip(), []
            if text:
                self._queue.put_nowait(text)
            self._queue.put_nowait(frame)  # passed on once the reply was spoken
            return
        if direction is DOWN and isinstance(frame, TTSSpeakFrame):
            self._queue.put_nowait(frame.text)
            return
        if direction is DOWN and not isinstance(frame, SystemFrame | EndFrame):
            # As a real output transport does, every other frame waits its turn behind the
            # speech queued before it (a reply's start comes after the last reply's words).
            self._queue.put_nowait(frame)
            return
        if isinstance(frame, EndFrame) and self._speaker is not None:
            self._queue.put_nowait(None)  # say what is queued, then end
            await self._speaker
            self._speaker = None
        await self.push_frame(frame, direction)

    async def _speak(self) -> None:
        while (item := await self._queue.get()) is not None:
            if isinstance(item, Frame):
                await self.push_frame(item, DOWN)
                if self._queue.empty():
                    await self._bot(False)
                continue
            await self._bot(True)
            for word in item.split():
                await asyncio.sleep(self.word_seconds)
                self._words.append(word)
                await self.push_frame(TTSTextFrame(word, text_type="word"))
            if self._queue.empty():
                await self._bot(False)
        await self._bot(False)

    async def _bot(self, speaking: bool) -> None:
        if speaking == self._speaking:
            return
        self._speaking = speaking
        self.events.append(("started" if speaking else "stopped", time.monotonic()))
        if not speaking:
            self.heard.append(" ".join(self._words))
            self._words = []
        frame_cls = BotStartedSpeakingFrame if speaking else BotStoppedSpeakingFrame
        await self.push_frame(frame_cls(), DOWN)
        await self.push_frame(frame_cls(), UP)

    async def _cut_off(self) -> None:
        self._pending = []
        kept: list[str | Frame | None] = []
        while not self._queue.empty():
            item = self._queue.get_nowait()
            if isinstance(item, Frame) and not item.interruptible:
                kept.append(item)  # a tool's result still reaches the context
        for item in kept:
            self._queue.put_nowait(item)
        if self._speaker is not None:
            await self.cancel_task(self._speaker)
            await self._bot(False)
            self._speaker = self.create_task(self._speak(), "fake-voice-speaker")


class LineMonitor(FrameProcessor):  # type: ignore[misc]
    """What is going on at the output, for :meth:`Caller.wait_quiet` when no
    :class:`~slateflow.integrations.pipecat.PipecatCall` is in the pipeline (pipecat Flows
    under the same harness): a reply being generated, tool calls in flight."""

    def __init__(self) -> None:
        super().__init__(name="line-monitor")
        self.responding = False
        self.tools: set[str] = set()

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if direction is DOWN:
            if isinstance(frame, LLMFullResponseStartFrame):
                self.responding = True
            elif isinstance(frame, LLMFullResponseEndFrame | InterruptionFrame):
                self.responding = False
            elif isinstance(frame, FunctionCallInProgressFrame):
                self.tools.add(frame.tool_call_id)
            elif isinstance(frame, FunctionCallResultFrame | FunctionCallCancelFrame):
                self.tools.discard(frame.tool_call_id)
        await self.push_frame(frame, direction)


class Caller:
    """Drives a running pipeline as a caller would (see :func:`pipecat_call`).

    ``heard`` is what the caller heard (the voice's replies); ``overlaps`` the moments the bot
    started speaking while the caller was talking (a voice agent should have none).
    """

    def __init__(
        self,
        worker: PipelineWorker,
        voice: FakeVoice,
        monitor: LineMonitor,
        running: asyncio.Task[None],
        call: PipecatCall | None = None,
    ) -> None:
        self.worker = worker
        self.voice = voice
        self.monitor = monitor
        self.call = call
        self._running = running
        self.speaking_since: float | None = None
        self.spans: list[tuple[float, float]] = []

    @property
    def heard(self) -> list[str]:
        """The bot's replies as the caller heard them."""
        return self.voice.heard

    @property
    def ended(self) -> bool:
        """Whether the pipeline has ended (the call hung up)."""
        return self._running.done()

    def answered_after(self, moment: float) -> float | None:
        """Seconds from ``moment`` (a ``time.monotonic()`` reading) until the bot next started
        speaking: how long the caller waited in silence; ``None`` if it has not spoken since."""
        later = [t for kind, t in self.voice.events if kind == "started" and t > moment]
        return later[0] - moment if later else None

    @property
    def overlaps(self) -> list[float]:
        """When the bot started speaking while the caller was talking."""
        spans = list(self.spans)
        if self.speaking_since is not None:
            spans.append((self.speaking_since, float("inf")))
        return [t for kind, t in self.voice.events if kind == "started"
                and any(a < t < b for a, b in spans)]  # fmt: skip

    async def begin_speaking(self) -> None:
        """The caller starts talking (over the bot, maybe: that is an interruption)."""
        self.speaking_since = time.monotonic()
        await self.worker.queue_frame(ProposedUserStartedSpeakingFrame())

    async def finish_speaking(self, text: str = "") -> None:
        """The caller stops talking; ``text`` is what they said (empty: noise, a cough)."""
        if text:
            await self.worker.queue_frame(TranscriptionFrame(text, "caller", _now()))
        await self.worker.queue_frame(ProposedUserStoppedSpeakingFrame())
        if self.speaking_since is not None:
            self.spans.append((self.speaking_since, time.monotonic()))
        self.speaking_since = None

    async def say(self, text: str) -> None:
        """One whole utterance: start talking, the words, stop."""
        await self.begin_speaking()
        await self.finish_speaking(text)

    async def wait_quiet(
        self, *, timeout: float = 10.0, settle: float = 0.05, resolvers: bool = False
    ) -> None:
        """Wait until the line has been quiet for ``settle`` seconds in a row: nobody talking,
        no reply or tool call in flight, no result about to be told. With ``resolvers=True``
        the runs of the call's session count too (a caller who waits for the answer of a
        background check: a test that completes a lookup by hand leaves it off). Raises
        ``TimeoutError`` naming what is still going on after ``timeout``."""
        deadline = time.monotonic() + timeout
        quiet_since: float | None = None
        while True:
            now = time.monotonic()
            flags = self._flags(resolvers)
            if not any(flags.values()):
                quiet_since = quiet_since if quiet_since is not None else now
                if now - quiet_since >= settle:
                    return
            else:
                quiet_since = None
            if now >= deadline:
                busy = ", ".join(k for k, v in flags.items() if v)
                raise TimeoutError(f"the line is not quiet after {timeout}s: {busy}")
            await asyncio.sleep(settle / 5)

    async def wait_ended(self, *, timeout: float = 10.0) -> None:
        """Wait until the pipeline has ended (the call hung up); raises ``TimeoutError``."""
        await asyncio.wait_for(asyncio.shield(self._running), timeout)

    async def wait_until(
        self, condition: Callable[[], object], *, timeout: float = 10.0, what: str = ""
    ) -> None:
        """Wait until ``condition()`` is true (the bot speaking, a key set); raises
        ``TimeoutError`` naming ``what`` after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() >= deadline:
                raise TimeoutError(f"waited {timeout}s for {what or condition!r}")
            await asyncio.sleep(0.001)

    def _flags(self, resolvers: bool = False) -> dict[str, bool]:
        monitor = self.monitor
        flags = {
            "the caller is speaking": self.speaking_since is not None,
            "the bot is speaking": self.voice.speaking,
            "a reply is being generated": monitor.responding,
            f"tools running: {sorted(monitor.tools)}": bool(monitor.tools),
        }
        call = self.call
        if call is not None:
            if resolvers:
                running = sorted({run.name for run in call.session.runs()})
                flags[f"resolvers still running ({', '.join(running)})"] = bool(running)
            flags["the model has not answered its last context"] = call.replies.waiting
            flags["a result or a reprompt is about to be told"] = call.activity.pending_action
            a = call.activity
            flags["the call heard the caller start speaking and not stop"] = a.user_speaking
            flags["the call heard the bot start speaking and not stop"] = a.bot_speaking
            flags["the call saw a reply start and not end"] = a.responding
            flags[f"the call runs tools {sorted(a.tools)}"] = bool(a.tools)
        return flags


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S")


def external_turns(
    stop_timeout: float = 0.05, mute: Sequence[BaseUserMuteStrategy] = ()
) -> LLMUserAggregatorParams:
    """User aggregator parameters for a driven caller: external turn strategies (the
    caller's ``begin_speaking`` / ``finish_speaking`` are the turn's edges)."""
    return LLMUserAggregatorParams(
        user_turn_strategies=UserTurnStrategies(
            start=[ExternalUserTurnStartStrategy()],
            stop=[ExternalUserTurnStopStrategy(timeout=stop_timeout)],
        ),
        user_mute_strategies=list(mute),
    )


@asynccontextmanager
async def run_pipeline(
    llm: LLMService,
    context: LLMContext,
    *,
    before_llm: Sequence[FrameProcessor] = (),
    after_output: Sequence[FrameProcessor] = (),
    voice: FakeVoice | None = None,
    user_params: LLMUserAggregatorParams | None = None,
    call: PipecatCall | None = None,
    **worker_options: Any,
) -> AsyncIterator[tuple[Caller, PipelineWorker, LLMContextAggregatorPair]]:
    """A running pipeline ``[user aggregator, *before_llm, llm, voice, monitor,
    *after_output, assistant aggregator]`` over ``context``, driven by a :class:`Caller`;
    yields the caller, the worker and the aggregator pair (what pipecat Flows' ``FlowManager``
    needs). Ends with the block, or earlier when the pipeline ends itself. ``worker_options``
    go to pipecat's ``PipelineWorker`` (``enable_tracing=True``, ``conversation_id=...``)."""
    voice = voice if voice is not None else FakeVoice()
    monitor = LineMonitor()
    pair = LLMContextAggregatorPair(context, user_params=user_params or external_turns())
    pipeline = Pipeline(
        [pair.user(), *before_llm, llm, voice, monitor, *after_output, pair.assistant()]
    )
    options = {"cancel_on_idle_timeout": False, "check_dangling_tasks": False, "enable_rtvi": False}
    worker = PipelineWorker(pipeline, **{**options, **worker_options})
    started = asyncio.Event()

    @worker.event_handler("on_pipeline_started")  # type: ignore[untyped-decorator]
    async def _started(worker: PipelineWorker, frame: Frame) -> None:
        started.set()

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    running = asyncio.create_task(runner.run())
    try:
        await asyncio.wait_for(started.wait(), timeout=10)
        yield Caller(worker, voice, monitor, running, call), worker, pair
    finally:
        if not running.done():
            await worker.queue_frame(EndFrame())
            try:
                await asyncio.wait_for(asyncio.shield(running), timeout=10)
            except TimeoutError:
                await runner.cancel()
        await running


@asynccontextmanager
async def pipecat_call(
    call: PipecatCall,
    llm: LLMService,
    *,
    voice: FakeVoice | None = None,
    stop_timeout: float = 0.05,
    **worker_options: Any,
) -> AsyncIterator[Caller]:
    """Run ``call`` in a real pipeline with ``llm`` and a :class:`FakeVoice`
    (:func:`run_pipeline`, with external turn strategies and :class:`FloorHold`); yields the
    :class:`Caller`. The pipeline ends with the block (or earlier, when the call hangs up).
    ``worker_options`` go to pipecat's ``PipelineWorker``."""
    if call.toolbox is not None:
        call.register_tools(llm)
    params = external_turns(stop_timeout, [FloorHold(call)])
    try:
        async with run_pipeline(
            llm,
            call.context,
            before_llm=[call.steering],
            after_output=[call.tap],
            voice=voice,
            user_params=params,
            call=call,
            **worker_options,
        ) as (caller, _, _):
            yield caller
    finally:
        await call.close()
