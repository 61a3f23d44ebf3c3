"""Resolvers in call mode (``await resolver.resolve(state)``) and ``slateflow.call``: the seed's
conventions, the key-write contract, provenance, every source kind, retries, timeouts,
cancellation, governance, definition errors, the LLM seam and ttl freshness.

Time is a :class:`ManualClock` wherever it matters: a test moves it with ``await clock.advance``
from the test task while the resolver runs in a task group beside it."""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from helpers import fingerprint
from slateflow import Key, ManualClock, Resolver, Retry, SlateError, State
from slateflow.errors import (
    PolicyViolation,
    ResolverDefinitionError,
    ResolverError,
    ResolverTimeoutError,
    SchemaError,
    StateValueError,
    TemplateError,
)
from slateflow.resolve import LLMRequest, LLMResponse, TextAgent, Usage, is_fresh
from slateflow.state import Change, source_of

SAFETY = 10  # seconds of wall time: only a guard against a hung test, never waited for
START = 1_767_225_600.0  # ManualClock's default start: 2026-01-01T00:00:00Z


# -- real implementations of the protocols (no mocks) -----------------------------------------


class FakeLLM:
    """An LLM: answers from a script (texts, responses or exceptions), else echoes the prompt.

    Records every request, so a test can check what the resolver sent."""

    def __init__(self, *script: str | LLMResponse | BaseException, model: str = "fake-1") -> None:
        self.script = list(script)
        self.model = model
        self.requests: list[LLMRequest] = []

    async def generate(self, request: LLMRequest) -> LLMResponse:
        self.requests.append(request)
        await anyio.lowlevel.checkpoint()
        step: str | LLMResponse | BaseException = (
            self.script.pop(0) if self.script else request.prompt
        )
        if isinstance(step, BaseException):
            raise step
        if isinstance(step, LLMResponse):
            return step
        return LLMResponse(
            text=step,
            model=request.model or self.model,
            usage=Usage(input_tokens=len(request.prompt.split()), output_tokens=len(step.split())),
        )


class Echo:
    """A TextAgent answering a fixed text."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.calls = 0

    async def run(self, state: State) -> str:
        self.calls += 1
        await anyio.lowlevel.checkpoint()
        return self.text


class Boom:
    """A TextAgent that always fails."""

    async def run(self, state: State) -> str:
        await anyio.lowlevel.checkpoint()
        raise RuntimeError("kaboom")


# -- helpers ---------------------------------------------------------------------------------


class Outcome:
    """What a resolve() run in a background task ended with."""

    def __init__(self) -> None:
        self.finished = False
        self.value: Any = None
        self.error: BaseException | None = None


async def resolve_while_advancing(
    resolver: Resolver,
    state: State,
    clock: ManualClock,
    advances: list[float] | float,
    *,
    between: Callable[[int], None] | None = None,
) -> Outcome:
    """Run ``resolver.resolve(state, clock=clock)`` in a task while the clock is advanced by each
    of ``advances`` in turn (``between(i)`` runs after the i-th advance). The run must have ended
    by then."""
    outcome = Outcome()

    async def go() -> None:
        try:
            outcome.value = await resolver.resolve(state, clock=clock)
        except Exception as exc:
            outcome.error = exc
        finally:
            outcome.finished = True

    steps = advances if isinstance(advances, list) else [advances]
    with anyio.fail_after(SAFETY):
        async with anyio.create_task_group() as tg:
            tg.start_soon(go)
            for i, seconds in enumerate(steps):
                await clock.advance(seconds)
                if between is not None:
                    between(i)
            if not outcome.finished:
                tg.cancel_scope.cancel()
                pytest.fail(f"the run had not ended after advancing {sum(steps)}s")
    return outcome


def epoch(started_at: Any) -> float:
    """A provenance ``started_at`` (epoch seconds, or an ISO 8601 string) as epoch seconds."""
    if isinstance(started_at, str):
        parsed = datetime.fromisoformat(started_at)
        assert parsed.tzinfo is not None, f"started_at {started_at!r} has no time zone"
        return parsed.timestamp()
    assert isinstance(started_at, int | float)
    assert not isinstance(started_at, bool)
    return float(started_at)


def batches_since(state: State, cursor: int) -> dict[int, list[Change]]:
    """The journal after ``cursor``, grouped by batch seq."""
    out: dict[int, list[Change]] = {}
    for m in state.journal.since(cursor):
        out.setdefault(m.seq, []).append(m)
    return out


def one_batch(state: State, cursor: int) -> dict[str, Change]:
    """The single batch committed after ``cursor`` (fails if there are more), by key."""
    batches = batches_since(state, cursor)
    assert len(batches) == 1, f"expected one batch after {cursor}, got {batches}"
    (changes,) = batches.values()
    by_key = {m.key: m for m in changes}
    assert len(by_key) == len(changes)
    return by_key


async def failing(state: State) -> Any:
    await anyio.lowlevel.checkpoint()
    raise RuntimeError("upstream 503")


@pytest.fixture
def state() -> State:
    return State()


# == the seed's tests, ported ================================================================


@pytest.mark.anyio
async def test_call_writes_result_to_state(state: State) -> None:
    out = await Resolver.agent("verify", Echo("ok-123")).resolve(state)
    assert out == "ok-123"
    assert state.get("verify:result") == "ok-123"
    assert state.get("verify:status") == "done"
    assert "verify:error" not in state


@pytest.mark.anyio
async def test_call_writes_error_to_state(state: State) -> None:
    with pytest.raises(ResolverError) as info:
        await Resolver.agent("verify", Boom()).resolve(state)
    assert info.value.name == "verify"
    assert "verify:error" in state
    assert state.get("verify:error") == "kaboom"
    assert "verify:result" not in state
    assert state.get("verify:status") == "error"


@pytest.mark.anyio
async def test_fetch_binds_state_and_writes_result(state: State) -> None:
    state.set("slot", "afternoon")

    async def lookup(s: State) -> Any:
        await anyio.lowlevel.checkpoint()
        return {"open": s.get("slot") == "afternoon"}

    out = await Resolver.fetch("availability", lookup).resolve(state)
    assert out == {"open": True}
    assert state.get("availability:result") == {"open": True}
    assert source_of(state, "availability:result") == "fetch"
    meta = state.get("state_meta:availability:result")
    assert meta["source"] == "fetch"
    assert meta["resolver"] == "availability"

    # The same resolver over different inputs gives a different value.
    state.set("slot", "morning")
    assert await Resolver.fetch("availability", lookup).resolve(state) == {"open": False}
    assert state.get("availability:result") == {"open": False}


@pytest.mark.anyio
async def test_agent_resolver_uses_result_convention(state: State) -> None:
    assert await Resolver.agent("verify", Echo("ok-9")).resolve(state) == "ok-9"
    assert state.get("verify:result") == "ok-9"
    assert source_of(state, "verify:result") == "agent"
    assert state.get("state_meta:verify:result")["resolver"] == "verify"


@pytest.mark.anyio
async def test_fetch_records_error(state: State) -> None:
    with pytest.raises(ResolverError):
        await Resolver.fetch("lookup", failing).resolve(state)
    assert state.get("lookup:error") == "upstream 503"
    assert "lookup:result" not in state
    assert state.get("lookup:status") == "error"
    assert source_of(state, "lookup:error") == "fetch"


@pytest.mark.anyio
async def test_llm_interpolates_prompt_and_stores_text(state: State) -> None:
    state.set("topic", "billing")
    llm = FakeLLM()
    out = await Resolver.llm("summary", llm, "Summarize the {topic} issue").resolve(state)
    assert out == "Summarize the billing issue"
    assert state.get("summary:result") == "Summarize the billing issue"
    assert [r.prompt for r in llm.requests] == ["Summarize the billing issue"]
    assert source_of(state, "summary:result") == "llm"


@pytest.mark.anyio
async def test_llm_prompt_renders_paths_json_and_literal_braces(state: State) -> None:
    state.set("availability:result", {"open": True, "slots": ["9:00", "10:00"]})
    llm = FakeLLM()
    out = await Resolver.llm(
        "s",
        llm,
        "open={availability:result.open} last={availability:result.slots.-1} "
        "all={availability:result} {{x}} name={user:name?there}",
    ).resolve(state)
    assert out == ('open=true last=10:00 all={"open":true,"slots":["9:00","10:00"]} {x} name=there')


async def _fetch_value(state: State) -> Any:
    return {"n": 1}


def _function_value(state: State) -> Any:
    return {"n": 1}


async def _agent_value(state: State) -> str:
    return "text"


KIND_BUILDERS: dict[str, Callable[[str], Resolver]] = {
    "agent": lambda name: Resolver.agent(name, _agent_value),
    "fetch": lambda name: Resolver.fetch(name, _fetch_value),
    "function": lambda name: Resolver.function(name, _function_value),
    "llm": lambda name: Resolver.llm(name, FakeLLM("text"), "hello"),
}


@pytest.mark.anyio
@pytest.mark.parametrize("kind", sorted(KIND_BUILDERS))
async def test_provenance_names_the_source_kind_and_resolver(state: State, kind: str) -> None:
    resolver = KIND_BUILDERS[kind]("x")
    assert resolver.kind == kind
    await resolver.resolve(state)
    for key in ("x:result", "x:status"):
        assert source_of(state, key) == kind
        record = state.provenance(key)
        assert record is not None
        assert record.writer == "x"
    meta = state.get("state_meta:x:result")
    assert meta["source"] == kind
    assert meta["resolver"] == "x"


@pytest.mark.asyncio
async def test_call_and_fetch_under_pytest_asyncio() -> None:
    state = State()
    assert await Resolver.agent("verify", Echo("ok")).resolve(state) == "ok"
    with pytest.raises(ResolverError):
        await Resolver.fetch("lookup", failing).resolve(state)
    assert state.pick("verify:result", "lookup:error", "lookup:status") == {
        "verify:result": "ok",
        "lookup:error": "upstream 503",
        "lookup:status": "error",
    }


# == the key-write contract ==================================================================


@pytest.mark.anyio
async def test_status_is_running_while_the_source_runs(state: State) -> None:
    state.update({"v:result": "old", "v:error": "old error"})
    before = state.journal.cursor
    seen: dict[str, Any] = {}

    async def source(s: State) -> str:
        seen["status"] = s.get("v:status")
        seen["result"] = s.get("v:result")
        seen["error"] = s.get("v:error")
        seen["batches"] = batches_since(s, before)
        seen["provenance"] = s.provenance("v:status")
        return "new"

    await Resolver.fetch("v", source).resolve(state)
    assert seen["status"] == "running"
    # Only the status is written at the start: the previous outcome is still readable.
    assert seen["result"] == "old"
    assert seen["error"] == "old error"
    (start,) = seen["batches"].values()
    assert [(m.key, m.new) for m in start] == [("v:status", "running")]
    record = seen["provenance"]
    assert (record.source, record.writer) == ("fetch", "v")


@pytest.mark.anyio
async def test_success_is_one_batch_with_result_done_and_error_removed(state: State) -> None:
    state.update({"v:error": "from an earlier run", "other": 1})
    cursors: list[int] = []

    async def source(s: State) -> Any:
        cursors.append(s.journal.cursor)
        return {"ok": True}

    await Resolver.fetch("v", source).resolve(state)
    batch = one_batch(state, cursors[0])
    assert set(batch) == {"v:result", "v:status", "v:error"}
    assert batch["v:result"].new == {"ok": True}
    assert batch["v:status"].new == "done"
    assert batch["v:error"].removed
    assert len({m.seq for m in batch.values()}) == 1
    assert state.items("v:") == [("v:status", "done"), ("v:result", {"ok": True})]
    assert state.version("other") == 1


@pytest.mark.anyio
async def test_success_without_earlier_error_writes_result_and_status(state: State) -> None:
    cursors: list[int] = []

    async def source(s: State) -> int:
        cursors.append(s.journal.cursor)
        return 7

    assert await Resolver.fetch("v", source).resolve(state) == 7
    batch = one_batch(state, cursors[0])
    assert set(batch) == {"v:result", "v:status"}
    assert (batch["v:result"].new, batch["v:status"].new) == (7, "done")


@pytest.mark.anyio
async def test_failure_is_one_batch_with_error_status_and_result_removed(state: State) -> None:
    state.update({"v:result": "stale", "other": 1})
    cursors: list[int] = []

    async def source(s: State) -> Any:
        cursors.append(s.journal.cursor)
        raise LookupError("no such booking")

    with pytest.raises(ResolverError):
        await Resolver.fetch("v", source).resolve(state)
    batch = one_batch(state, cursors[0])
    assert set(batch) == {"v:error", "v:status", "v:result", "v:failures"}
    assert batch["v:error"].new == "no such booking"
    assert batch["v:status"].new == "error"
    assert batch["v:failures"].new == 1  # failures in a row: failed("v", times=n) reads it
    assert batch["v:result"].removed
    assert "v:result" not in state
    assert state.items("v:") == [
        ("v:status", "error"),
        ("v:error", "no such booking"),
        ("v:failures", 1),
    ]
    assert state.version("other") == 1


@pytest.mark.anyio
async def test_failure_without_earlier_result_writes_error_and_status(state: State) -> None:
    cursors: list[int] = []

    async def source(s: State) -> Any:
        cursors.append(s.journal.cursor)
        raise LookupError("nope")

    with pytest.raises(ResolverError):
        await Resolver.fetch("v", source).resolve(state)
    batch = one_batch(state, cursors[0])
    assert set(batch) == {"v:error", "v:status", "v:failures"}


def _raising(message: str) -> Any:
    async def source(s: State) -> Any:
        raise RuntimeError(message)

    return source


@pytest.mark.anyio
async def test_success_after_failure_and_failure_after_success(state: State) -> None:
    outcomes = iter([RuntimeError("first fails"), "second works", RuntimeError("third fails")])

    async def source(s: State) -> Any:
        step = next(outcomes)
        if isinstance(step, Exception):
            raise step
        return step

    resolver = Resolver.fetch("v", source)
    with pytest.raises(ResolverError):
        await resolver.resolve(state)
    assert state.pick("v:status", "v:result", "v:error", "v:failures") == {
        "v:status": "error",
        "v:error": "first fails",
        "v:failures": 1,
    }
    assert await resolver.resolve(state) == "second works"
    assert state.pick("v:status", "v:result", "v:error", "v:failures") == {
        "v:status": "done",
        "v:result": "second works",
    }
    with pytest.raises(ResolverError):
        await resolver.resolve(state)
    with pytest.raises(ResolverError):
        await Resolver.fetch("v", _raising("again")).resolve(state)
    assert state.pick("v:status", "v:result", "v:error", "v:failures") == {
        "v:status": "error",
        "v:error": "again",
        "v:failures": 2,  # two in a row since the success: failed("v", times=2) holds
    }


@pytest.mark.anyio
async def test_resolver_error_attributes(state: State) -> None:
    raised = ConnectionError("upstream refused")

    async def source(s: State) -> Any:
        raise raised

    with pytest.raises(ResolverError) as info:
        await Resolver.fetch("lookup", source).resolve(state)
    err = info.value
    assert isinstance(err, SlateError)
    assert err.name == "lookup"
    assert err.error == "upstream refused" == state.get("lookup:error")
    assert err.attempts == 1
    assert err.__cause__ is raised
    assert "lookup" in str(err)
    assert "upstream refused" in str(err)
    assert "lookup:error" in str(err)


@pytest.mark.anyio
async def test_error_message_without_text_is_the_exception_type(state: State) -> None:
    async def source(s: State) -> Any:
        raise KeyError()

    with pytest.raises(ResolverError) as info:
        await Resolver.fetch("v", source).resolve(state)
    assert state.get("v:error") == "KeyError"
    assert info.value.error == "KeyError"


@pytest.mark.anyio
async def test_huge_error_message_is_cut(state: State) -> None:
    async def source(s: State) -> Any:
        raise RuntimeError("x" * 50_000)

    with pytest.raises(ResolverError):
        await Resolver.fetch("v", source).resolve(state)
    message = state.get("v:error")
    assert message.startswith("xxxx")
    assert 100 < len(message) <= 2000


@pytest.mark.anyio
async def test_call_shorthand_equals_agent_resolver(state: State) -> None:
    agent = Echo("hello")
    assert await Resolver.agent("greet", agent).resolve(state) == "hello"
    assert agent.calls == 1
    record = state.provenance("greet:result")
    assert record is not None
    assert (record.source, record.writer, record.meta["mode"]) == ("agent", "greet", "call")

    async def not_text(s: State) -> Any:
        return 5

    with pytest.raises(ResolverError) as info:
        await Resolver.agent("greet", not_text).resolve(state)
    assert "not str" in info.value.error
    assert "greet:result" not in state


# == provenance meta ===========================================================================


@pytest.mark.anyio
async def test_success_provenance_meta() -> None:
    clock = ManualClock()
    state = State(clock=clock)
    state.set("slot", "afternoon")
    state.set("slot", "evening")
    state.set("party", 2)

    async def source(s: State) -> Any:
        await clock.sleep(2.5)
        return {"slot": s.get("slot")}

    resolver = Resolver.fetch("v", source, reads=["slot", Key("party", int), "absent"], ttl=30)
    outcome = await resolve_while_advancing(resolver, state, clock, 3)
    assert outcome.value == {"slot": "evening"}
    record = state.provenance("v:result")
    assert record is not None
    assert record.source == "fetch"
    assert record.writer == "v"
    meta = dict(record.meta)
    assert epoch(meta.pop("started_at")) == START
    assert meta == {
        "mode": "call",
        "duration": 2.5,
        "inputs": {"slot": 2, "party": 1, "absent": 0},
        "attempt": 1,
        "ttl": 30.0,
    }
    # The commit time is on the state's clock: 2.5 s after the start.
    assert record.at == datetime.fromtimestamp(clock.time() - 0.5, UTC)
    # The status of the same batch carries the same provenance.
    assert state.provenance("v:status") == record


@pytest.mark.anyio
async def test_error_provenance_meta() -> None:
    clock = ManualClock()
    state = State(clock=clock)
    state.set("slot", "x")

    async def source(s: State) -> Any:
        await clock.sleep(1)
        raise LookupError("gone")

    resolver = Resolver.fetch("v", source, reads=["slot"], retry=Retry(attempts=2, backoff=4))
    outcome = await resolve_while_advancing(resolver, state, clock, 10)
    assert isinstance(outcome.error, ResolverError)
    record = state.provenance("v:error")
    assert record is not None
    assert (record.source, record.writer) == ("fetch", "v")
    meta = dict(record.meta)
    assert epoch(meta.pop("started_at")) == START
    assert meta == {
        "mode": "call",
        "duration": 6.0,  # 1 s, 4 s backoff, 1 s
        "inputs": {"slot": 1},
        "attempts": 2,
        "exception": "LookupError",
    }
    assert state.provenance("v:status") == record


@pytest.mark.anyio
async def test_inputs_are_the_versions_at_the_start_of_the_run() -> None:
    clock = ManualClock()
    state = State(clock=clock)
    state.set("slot", "a")

    async def source(s: State) -> str:
        await clock.sleep(5)
        return "done"

    resolver = Resolver.fetch("v", source, reads=["slot"])

    def write_during_run(i: int) -> None:
        if i == 0:
            state.set("slot", "b")  # while the source is sleeping

    await resolve_while_advancing(resolver, state, clock, [1, 10], between=write_during_run)
    assert state.version("slot") == 2
    record = state.provenance("v:result")
    assert record is not None
    assert record.meta["inputs"] == {"slot": 1}


@pytest.mark.anyio
async def test_no_reads_no_ttl_means_no_inputs_or_ttl_in_meta(state: State) -> None:
    await Resolver.fetch("v", _fetch_value).resolve(state)
    record = state.provenance("v:result")
    assert record is not None
    assert "inputs" not in record.meta
    assert "ttl" not in record.meta
    assert record.meta["duration"] >= 0
    assert record.meta["attempt"] == 1
    # started_at is an ISO timestamp close to the commit time (system clock).
    started = epoch(record.meta["started_at"])
    assert 0 <= record.at.timestamp() - started < 60


@pytest.mark.anyio
async def test_llm_provenance_has_model_and_usage(state: State) -> None:
    state.set("topic", "billing")
    llm = FakeLLM(
        LLMResponse(
            text="A summary.", model="m-large", usage=Usage(input_tokens=12, output_tokens=3)
        )
    )
    await Resolver.llm("summary", llm, "Summarize {topic}").resolve(state)
    record = state.provenance("summary:result")
    assert record is not None
    assert record.source == "llm"
    assert record.meta["model"] == "m-large"
    assert record.meta["usage"] == {"input_tokens": 12, "output_tokens": 3}
    # reads default to the prompt's keys
    assert record.meta["inputs"] == {"topic": 1}


def test_usage_total_tokens() -> None:
    assert Usage(input_tokens=12, output_tokens=30).total_tokens == 42
    assert Usage().total_tokens == 0
    with pytest.raises(ValueError, match="input_tokens"):
        Usage(input_tokens=-1)


# == the sources ===============================================================================


@pytest.mark.anyio
@pytest.mark.parametrize("returned", [42, {"text": "hi"}, None, b"bytes"])
async def test_agent_returning_non_str_is_an_error(state: State, returned: Any) -> None:
    async def agent(s: State) -> Any:
        return returned

    with pytest.raises(ResolverError) as info:
        await Resolver.agent("a", agent).resolve(state)
    assert "not str" in state.get("a:error")
    assert info.value.error == state.get("a:error")
    assert isinstance(info.value.__cause__, TypeError)
    assert state.get("a:status") == "error"
    assert "a:result" not in state


@pytest.mark.anyio
async def test_agent_object_with_run_and_async_callables(state: State) -> None:
    class Caller:
        async def __call__(self, s: State) -> str:
            return f"called {s.get('x')}"

    class Both:
        """Has run() and __call__: run() is the agent."""

        async def run(self, s: State) -> str:
            return "run"

        async def __call__(self, s: State) -> str:
            return "call"

    async def fn(s: State) -> str:
        return f"fn {s.get('x')}"

    state.set("x", 1)
    assert isinstance(Echo("e"), TextAgent)
    assert await Resolver.agent("a1", Echo("obj")).resolve(state) == "obj"
    assert await Resolver.agent("a2", fn).resolve(state) == "fn 1"
    assert await Resolver.agent("a3", Caller()).resolve(state) == "called 1"
    assert await Resolver.agent("a4", Both()).resolve(state) == "run"
    assert state.pick("a1:result", "a2:result", "a3:result", "a4:result") == {
        "a1:result": "obj",
        "a2:result": "fn 1",
        "a3:result": "called 1",
        "a4:result": "run",
    }


@pytest.mark.anyio
async def test_function_resolver_sync_async_and_thread(state: State) -> None:
    loop_thread = threading.get_ident()
    threads: dict[str, int] = {}
    state.set("n", 20)

    def sync_fn(s: State) -> int:
        threads["sync"] = threading.get_ident()
        return s.get("n") + 1

    async def async_fn(s: State) -> int:
        threads["async"] = threading.get_ident()
        await anyio.lowlevel.checkpoint()
        return s.get("n") + 2

    def blocking_fn(s: State) -> int:
        threads["thread"] = threading.get_ident()
        return s.get("n") + 3

    assert await Resolver.function("f1", sync_fn).resolve(state) == 21
    assert await Resolver.function("f2", async_fn).resolve(state) == 22
    assert await Resolver.function("f3", blocking_fn, thread=True).resolve(state) == 23
    assert threads["sync"] == loop_thread
    assert threads["async"] == loop_thread
    assert threads["thread"] != loop_thread
    for name, value in (("f1", 21), ("f2", 22), ("f3", 23)):
        assert state.get(f"{name}:result") == value
        assert state.get(f"{name}:status") == "done"
        assert source_of(state, f"{name}:result") == "function"


@pytest.mark.anyio
async def test_function_in_a_thread_is_fenced_like_any_source(state: State) -> None:
    def writes_other(s: State) -> int:
        s.set("other", 1)
        return 1

    def writes_progress(s: State) -> int:
        s.set("t:progress", 0.5)
        return 2

    with pytest.raises(ResolverError) as info:
        await Resolver.function("t", writes_other, thread=True).resolve(state)
    assert isinstance(info.value.__cause__, PolicyViolation)
    assert "other" not in state
    assert await Resolver.function("t", writes_progress, thread=True).resolve(state) == 2
    record = state.provenance("t:progress")
    assert record is not None
    assert (record.source, record.writer) == ("function", "t")


@pytest.mark.anyio
async def test_function_in_a_thread_is_abandoned_at_its_timeout() -> None:
    clock = ManualClock()
    state = State(clock=clock)
    started = threading.Event()
    release = threading.Event()
    finished = threading.Event()

    def blocking(s: State) -> str:
        started.set()
        try:
            release.wait(SAFETY)
            return "late"
        finally:
            finished.set()

    def until_the_thread_runs(i: int) -> None:
        if i == 0:
            assert started.wait(SAFETY)

    resolver = Resolver.function("slow", blocking, thread=True, timeout=2)
    try:
        outcome = await resolve_while_advancing(
            resolver, state, clock, [0, 2], between=until_the_thread_runs
        )
        # The run ended while the thread is still blocked: it was abandoned.
        assert not finished.is_set()
    finally:
        release.set()
    assert isinstance(outcome.error, ResolverError)
    assert isinstance(outcome.error.__cause__, ResolverTimeoutError)
    assert state.get("slow:status") == "error"
    assert await anyio.to_thread.run_sync(finished.wait, SAFETY)
    await anyio.lowlevel.checkpoint()
    # The abandoned thread's late value never lands.
    assert "slow:result" not in state
    assert state.get("slow:status") == "error"


class Booking(BaseModel):
    guest: str
    at: datetime
    party: int
    tags: tuple[str, ...] = ()


@pytest.mark.anyio
async def test_fetch_returning_a_pydantic_model_stores_its_json(state: State) -> None:
    booking = Booking(
        guest="Ada", at=datetime(2026, 5, 1, 19, 30, tzinfo=UTC), party=4, tags=("x",)
    )

    async def source(s: State) -> Booking:
        return booking

    await Resolver.fetch("book", source).resolve(state)
    stored = state.get("book:result")
    assert stored == booking.model_dump(mode="json")
    assert stored == {"guest": "Ada", "at": "2026-05-01T19:30:00Z", "party": 4, "tags": ["x"]}
    assert Booking.model_validate(stored) == booking
    assert state.get(Key("book:result", Booking)) == booking


@pytest.mark.anyio
@pytest.mark.parametrize(
    "value",
    [
        pytest.param({1, 2}, id="set"),
        pytest.param(object(), id="object"),
        pytest.param({1: "int key"}, id="int-key"),
        pytest.param({"ok": [1, {"deep": float("nan")}]}, id="nan"),
        pytest.param(lambda: None, id="function"),
    ],
)
async def test_fetch_returning_a_non_json_value_is_an_error(state: State, value: Any) -> None:
    state.update({"other": 1, "v:result": "previous"})
    cursors: list[int] = []

    async def source(s: State) -> Any:
        cursors.append(s.journal.cursor)
        return value

    with pytest.raises(ResolverError) as info:
        await Resolver.fetch("v", source).resolve(state)
    assert isinstance(info.value.__cause__, StateValueError)
    assert state.get("v:status") == "error"
    assert "v:result" in state.get("v:error")
    # One batch after the start: the error, the status and the removal of the old result.
    batch = one_batch(state, cursors[0])
    assert set(batch) == {"v:error", "v:status", "v:result", "v:failures"}
    assert batch["v:result"].removed
    assert state.keys() == ["other", "v:status", "v:error", "v:failures"]
    assert state.version("other") == 1


# == retries ===================================================================================


class Flaky:
    """A source failing with the given exceptions first, then returning ``value``; records the
    clock's monotonic time of each call."""

    def __init__(
        self, clock: ManualClock, *failures: BaseException, value: Any = "ok", work: float = 0
    ) -> None:
        self.clock = clock
        self.failures = list(failures)
        self.value = value
        self.work = work
        self.times: list[float] = []

    async def __call__(self, state: State) -> Any:
        self.times.append(self.clock.monotonic())
        if self.work:
            await self.clock.sleep(self.work)
        else:
            await anyio.lowlevel.checkpoint()
        if self.failures:
            raise self.failures.pop(0)
        return self.value


@pytest.mark.anyio
async def test_retry_until_success() -> None:
    clock = ManualClock()
    state = State(clock=clock)
    source = Flaky(clock, ConnectionError("a"), ConnectionError("b"), value={"n": 3})
    resolver = Resolver.fetch("v", source, retry=Retry(attempts=3, backoff=1))
    outcome = await resolve_while_advancing(resolver, state, clock, 10)
    assert outcome.value == {"n": 3}
    assert len(source.times) == 3
    assert state.get("v:result") == {"n": 3}
    assert "v:error" not in state
    record = state.provenance("v:result")
    assert record is not None
    assert record.meta["attempt"] == 3
    assert record.meta["duration"] == 3.0  # waits of 1 s and 2 s


@pytest.mark.anyio
async def test_retry_exhausted_reports_every_attempt() -> None:
    clock = ManualClock()
    state = State(clock=clock)
    source = Flaky(clock, *(ConnectionError(f"try {i}") for i in range(1, 6)))
    resolver = Resolver.fetch("v", source, retry=Retry(attempts=4, backoff=0.5))
    outcome = await resolve_while_advancing(resolver, state, clock, 60)
    err = outcome.error
    assert isinstance(err, ResolverError)
    assert err.attempts == 4
    assert len(source.times) == 4
    assert err.error == "try 4" == state.get("v:error")
    assert "after 4 attempts" in str(err)
    assert isinstance(err.__cause__, ConnectionError)
    record = state.provenance("v:error")
    assert record is not None
    assert record.meta["attempts"] == 4
    assert record.meta["exception"] == "ConnectionError"


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("retry", "expected"),
    [
        (Retry(attempts=4, backoff=1, multiplier=2), [0, 1, 3, 7]),
        (Retry(attempts=4, backoff=1, multiplier=2, max_backoff=1.5), [0, 1, 2.5, 4]),
        (Retry(attempts=3, backoff=0.25, multiplier=1), [0, 0.25, 0.5]),
        (Retry(attempts=3, backoff=0), [0, 0, 0]),
    ],
)
async def test_retry_backoff_waits_on_the_clock(retry: Retry, expected: list[float]) -> None:
    clock = ManualClock()
    state = State(clock=clock)
    source = Flaky(clock, *(ConnectionError("down") for _ in range(10)))
    outcome = await resolve_while_advancing(
        Resolver.fetch("v", source, retry=retry), state, clock, 100
    )
    assert isinstance(outcome.error, ResolverError)
    assert source.times == pytest.approx(expected)


@pytest.mark.anyio
async def test_retry_does_not_run_before_its_backoff_is_due() -> None:
    clock = ManualClock()
    state = State(clock=clock)
    source = Flaky(clock, ConnectionError("down"), value="up")
    resolver = Resolver.fetch("v", source, retry=Retry(attempts=2, backoff=5))
    counts: list[tuple[int, Any]] = []

    def look(i: int) -> None:
        counts.append((len(source.times), state.get("v:status")))

    outcome = await resolve_while_advancing(resolver, state, clock, [4.999, 0.001], between=look)
    assert counts == [(1, "running"), (2, "done")]
    assert outcome.value == "up"


@pytest.mark.anyio
async def test_retry_waits_with_jitter_stay_within_bounds() -> None:
    clock = ManualClock()
    state = State(clock=clock)
    source = Flaky(clock, *(ConnectionError("down") for _ in range(10)))
    retry = Retry(attempts=5, backoff=1, multiplier=2, jitter=0.5)
    await resolve_while_advancing(Resolver.fetch("v", source, retry=retry), state, clock, 100)
    waits = [b - a for a, b in zip(source.times, source.times[1:], strict=False)]
    assert len(waits) == 4
    for n, wait in enumerate(waits, start=1):
        full = 2.0 ** (n - 1)
        assert full * 0.5 - 1e-9 <= wait <= full + 1e-9


class Transient(Exception):
    pass


class Permanent(Exception):
    pass


@pytest.mark.anyio
@pytest.mark.parametrize(
    "retry_on",
    [
        pytest.param(Transient, id="class"),
        pytest.param((KeyError, Transient), id="tuple"),
        pytest.param(lambda exc: "transient" in str(exc), id="predicate"),
    ],
)
async def test_retry_on_chooses_what_is_retried(retry_on: Any) -> None:
    clock = ManualClock()
    state = State(clock=clock)
    retry = Retry(attempts=5, backoff=1, retry_on=retry_on)

    # Retried: a transient failure, then success.
    source = Flaky(clock, Transient("transient glitch"), value="ok")
    outcome = await resolve_while_advancing(
        Resolver.fetch("a", source, retry=retry), state, clock, 10
    )
    assert outcome.value == "ok"
    assert len(source.times) == 2

    # Not retried: a permanent failure ends the run at once.
    source = Flaky(clock, Permanent("permanent"), value="never")
    outcome = await resolve_while_advancing(
        Resolver.fetch("b", source, retry=retry), state, clock, 10
    )
    assert isinstance(outcome.error, ResolverError)
    assert outcome.error.attempts == 1
    assert len(source.times) == 1
    assert state.get("b:error") == "permanent"


@pytest.mark.anyio
async def test_retry_predicate_receives_the_exception() -> None:
    clock = ManualClock()
    seen: list[BaseException] = []
    first = ConnectionError("x")

    def predicate(exc: BaseException) -> bool:
        seen.append(exc)
        return True

    source = Flaky(clock, first, value="ok")
    resolver = Resolver.fetch("v", source, retry=Retry(attempts=2, backoff=0, retry_on=predicate))
    await resolve_while_advancing(resolver, State(), clock, 0)
    assert seen == [first]


@pytest.mark.anyio
async def test_default_retry_does_not_retry_slateflow_errors() -> None:
    clock = ManualClock()
    state = State(clock=clock)
    llm = FakeLLM()
    # A missing template key: a TemplateError, which would only repeat.
    resolver = Resolver.llm("l", llm, "Hi {user:name}", retry=Retry(attempts=3, backoff=1))
    outcome = await resolve_while_advancing(resolver, state, clock, 10)
    assert isinstance(outcome.error, ResolverError)
    assert outcome.error.attempts == 1
    assert isinstance(outcome.error.__cause__, TemplateError)
    assert llm.requests == []

    # A policy refusal from inside the source: not retried either.
    calls: list[float] = []

    async def writes_other(s: State) -> Any:
        calls.append(clock.monotonic())
        s.set("other", 1)

    resolver = Resolver.fetch("w", writes_other, retry=Retry(attempts=3, backoff=1))
    outcome = await resolve_while_advancing(resolver, state, clock, 10)
    assert isinstance(outcome.error, ResolverError)
    assert isinstance(outcome.error.__cause__, PolicyViolation)
    assert len(calls) == 1


@pytest.mark.anyio
@pytest.mark.parametrize(
    "failure",
    [TimeoutError("slow upstream"), ConnectionError("reset"), ValueError("bad reply")],
)
async def test_default_retry_retries_ordinary_failures_and_timeouts(failure: Exception) -> None:
    clock = ManualClock()
    source = Flaky(clock, failure, value="ok")
    resolver = Resolver.fetch("v", source, retry=Retry(attempts=2, backoff=1))
    outcome = await resolve_while_advancing(resolver, State(), clock, 5)
    assert outcome.value == "ok"
    assert source.times == [0, 1]


@pytest.mark.anyio
async def test_without_retry_a_failure_is_final() -> None:
    clock = ManualClock()
    source = Flaky(clock, ConnectionError("once"), value="ok")
    outcome = await resolve_while_advancing(Resolver.fetch("v", source), State(), clock, 5)
    assert isinstance(outcome.error, ResolverError)
    assert outcome.error.attempts == 1
    assert len(source.times) == 1


@pytest.mark.parametrize(
    "kwargs",
    [
        {"attempts": 0},
        {"attempts": -1},
        {"attempts": 1.5},
        {"attempts": True},
        {"attempts": "3"},
        {"backoff": -0.1},
        {"backoff": math.nan},
        {"backoff": math.inf},
        {"backoff": "1"},
        {"backoff": False},
        {"multiplier": -2},
        {"multiplier": math.inf},
        {"max_backoff": -1},
        {"max_backoff": math.nan},
        {"jitter": -0.1},
        {"jitter": 1.5},
        {"jitter": math.nan},
        {"retry_on": "ValueError"},
        {"retry_on": 3},
        {"retry_on": (ValueError, "x")},
    ],
    ids=repr,
)
def test_retry_rejects_bad_arguments(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ResolverDefinitionError):
        Retry(**kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [{"jitter": "0.5"}, {"jitter": True}, {"retry_on": int}, {"retry_on": (int, str)}],
    ids=repr,
)
def test_retry_rejects_bad_jitter_and_non_exception_classes(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ResolverDefinitionError):
        Retry(**kwargs)


@settings(deadline=None)
@given(
    attempt=st.integers(1, 12),
    backoff=st.floats(0, 10),
    multiplier=st.floats(0, 4),
    max_backoff=st.floats(0, 60),
    jitter=st.floats(0, 1),
)
def test_retry_delay_is_capped_backoff_reduced_by_at_most_jitter(
    attempt: int, backoff: float, multiplier: float, max_backoff: float, jitter: float
) -> None:
    retry = Retry(
        attempts=13, backoff=backoff, multiplier=multiplier, max_backoff=max_backoff, jitter=jitter
    )
    full = min(max_backoff, backoff * multiplier ** (attempt - 1))
    delay = retry.delay(attempt)
    slack = 1e-9 * max(1.0, full)
    assert full * (1 - jitter) - slack <= delay <= full + slack
    assert Retry(
        attempts=13, backoff=backoff, multiplier=multiplier, max_backoff=max_backoff
    ).delay(attempt) == pytest.approx(full)


def test_should_retry_stops_at_the_last_attempt() -> None:
    retry = Retry(attempts=3)
    assert retry.should_retry(ConnectionError(), 1)
    assert retry.should_retry(ConnectionError(), 2)
    assert not retry.should_retry(ConnectionError(), 3)
    assert not retry.should_retry(TemplateError("x"), 1)
    assert retry.should_retry(ResolverTimeoutError("x"), 1)


# == timeouts ==================================================================================


@pytest.mark.anyio
async def test_timeout_with_manual_clock() -> None:
    clock = ManualClock()
    state = State(clock=clock)
    state.set("slow:result", "previous")

    async def hangs(s: State) -> str:
        await clock.sleep(10)
        return "too late"

    resolver = Resolver.fetch("slow", hangs, timeout=1)
    statuses: list[Any] = []
    outcome = await resolve_while_advancing(
        resolver,
        state,
        clock,
        [0.999, 0.001],
        between=lambda i: statuses.append(state.get("slow:status")),
    )
    assert statuses == ["running", "error"]
    err = outcome.error
    assert isinstance(err, ResolverError)
    assert isinstance(err.__cause__, ResolverTimeoutError)
    assert isinstance(err.__cause__, TimeoutError)
    message = state.get("slow:error")
    assert "timed out after 1s" in message
    assert "slow" in message
    assert err.error == message
    assert "slow:result" not in state
    record = state.provenance("slow:error")
    assert record is not None
    assert record.meta["exception"] == "ResolverTimeoutError"
    assert record.meta["attempts"] == 1
    assert record.meta["duration"] == 1.0
    assert clock.pending == 0  # the abandoned sleep is gone


@pytest.mark.anyio
async def test_timeout_is_retried_when_retry_is_given() -> None:
    clock = ManualClock()
    state = State(clock=clock)
    times: list[float] = []

    async def slow_then_fast(s: State) -> str:
        times.append(clock.monotonic())
        if len(times) < 3:
            await clock.sleep(10)
        return f"attempt {len(times)}"

    resolver = Resolver.fetch(
        "v", slow_then_fast, timeout=1, retry=Retry(attempts=3, backoff=0.5, multiplier=1)
    )
    outcome = await resolve_while_advancing(resolver, state, clock, 20)
    assert outcome.value == "attempt 3"
    assert times == [0, 1.5, 3.0]
    record = state.provenance("v:result")
    assert record is not None
    assert record.meta["attempt"] == 3
    assert record.meta["duration"] == 3.0


@pytest.mark.anyio
async def test_timeout_retries_exhausted() -> None:
    clock = ManualClock()
    state = State(clock=clock)

    async def hangs(s: State) -> str:
        await clock.sleep(100)
        return "never"

    resolver = Resolver.fetch("v", hangs, timeout=2, retry=Retry(attempts=2, backoff=1))
    outcome = await resolve_while_advancing(resolver, state, clock, 50)
    assert isinstance(outcome.error, ResolverError)
    assert outcome.error.attempts == 2
    record = state.provenance("v:error")
    assert record is not None
    assert record.meta["exception"] == "ResolverTimeoutError"
    assert record.meta["duration"] == 5.0
    assert "attempt 2" in state.get("v:error")


@pytest.mark.anyio
async def test_source_finishing_before_its_timeout_succeeds() -> None:
    clock = ManualClock()
    state = State(clock=clock)

    async def quick(s: State) -> str:
        await clock.sleep(0.9)
        return "fast enough"

    outcome = await resolve_while_advancing(Resolver.fetch("v", quick, timeout=1), state, clock, 5)
    assert outcome.value == "fast enough"
    assert state.get("v:status") == "done"
    assert clock.pending == 0  # the deadline was withdrawn


@pytest.mark.anyio
async def test_source_ignoring_its_timeout_is_reported_and_its_value_discarded(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = ManualClock()
    state = State(clock=clock)
    state.set("sw:result", "previous")

    async def ignores(s: State) -> str:
        try:
            await clock.sleep(10)
        except BaseException:  # the mistake under test: catch the cancellation, keep going
            with anyio.CancelScope(shield=True):
                await clock.sleep(3)
            return "swallowed"
        return "slept"

    with caplog.at_level(logging.WARNING, logger="slateflow.resolve"):
        outcome = await resolve_while_advancing(
            Resolver.fetch("sw", ignores, timeout=1), state, clock, 10
        )
    assert isinstance(outcome.error, ResolverError)
    assert isinstance(outcome.error.__cause__, ResolverTimeoutError)
    assert state.get("sw:status") == "error"
    assert "timed out" in state.get("sw:error")
    assert "sw:result" not in state
    assert "swallowed" not in repr(state.snapshot())
    record = state.provenance("sw:error")
    assert record is not None
    assert record.meta["exception"] == "ResolverTimeoutError"
    assert record.meta["duration"] == 4.0  # it only ended when the source did
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "'sw'" in warnings[0].getMessage()
    assert "ignored the cancellation" in warnings[0].getMessage()


async def _swallow_and_return(clock: ManualClock, s: State) -> str:
    try:
        await clock.sleep(10)
    except BaseException:  # the mistake under test: catch the cancellation, return a value
        return "swallowed"
    return "slept"


@pytest.mark.anyio
async def test_source_swallowing_its_timeout_still_times_out_and_its_value_is_discarded() -> None:
    clock = ManualClock()
    state = State(clock=clock)
    state.set("sw:result", "previous")
    resolver = Resolver.fetch("sw", partial(_swallow_and_return, clock), timeout=1)
    outcome = await resolve_while_advancing(resolver, state, clock, 5)
    assert isinstance(outcome.error, ResolverError)
    assert isinstance(outcome.error.__cause__, ResolverTimeoutError)
    assert state.get("sw:status") == "error"
    assert "timed out after 1s" in state.get("sw:error")
    assert "sw:result" not in state
    assert "swallowed" not in repr(state.snapshot())


# == cancellation ==============================================================================


@pytest.mark.anyio
async def test_caller_cancellation_writes_cancelled_and_propagates(state: State) -> None:
    state.update({"v:result": "old value", "v:error": "old error"})
    versions = (state.version("v:result"), state.version("v:error"))
    started = anyio.Event()
    after: list[str] = []

    async def hangs(s: State) -> str:
        started.set()
        await anyio.sleep_forever()
        return "never"

    with anyio.fail_after(SAFETY), anyio.CancelScope() as scope:
        async with anyio.create_task_group() as tg:

            async def cancel_when_started() -> None:
                await started.wait()
                scope.cancel()

            tg.start_soon(cancel_when_started)
            await Resolver.fetch("v", hangs).resolve(state)
            after.append("resolve returned")  # pragma: no cover - must not run
    assert scope.cancelled_caught
    assert after == []
    assert state.get("v:status") == "cancelled"
    assert (state.version("v:result"), state.version("v:error")) == versions
    assert state.get("v:result") == "old value"
    assert state.get("v:error") == "old error"
    record = state.provenance("v:status")
    assert record is not None
    assert (record.source, record.writer) == ("fetch", "v")
    assert record.meta["mode"] == "call"
    assert "reason" in record.meta


@pytest.mark.anyio
async def test_caller_cancellation_during_retry_backoff() -> None:
    clock = ManualClock()
    state = State(clock=clock)
    source = Flaky(clock, *(ConnectionError("down") for _ in range(5)))
    resolver = Resolver.fetch("v", source, retry=Retry(attempts=5, backoff=10))
    with anyio.fail_after(SAFETY):
        async with anyio.create_task_group() as tg:
            tg.start_soon(partial(resolver.resolve, state, clock=clock))
            await clock.advance(5)  # first attempt failed; waiting 10 s to retry
            assert state.get("v:status") == "running"
            tg.cancel_scope.cancel()
    assert len(source.times) == 1
    assert state.get("v:status") == "cancelled"
    assert "v:error" not in state
    assert "v:result" not in state
    assert clock.pending == 0


@pytest.mark.anyio
async def test_source_swallowing_the_callers_cancellation_ends_cancelled(
    state: State, caplog: pytest.LogCaptureFixture
) -> None:
    started = anyio.Event()

    async def swallows(s: State) -> str:
        started.set()
        try:
            await anyio.sleep_forever()
        except BaseException:  # the mistake under test
            return "swallowed"
        return "never"

    with (
        caplog.at_level(logging.WARNING, logger="slateflow.resolve"),
        anyio.fail_after(SAFETY),
        anyio.CancelScope() as scope,
    ):
        async with anyio.create_task_group() as tg:

            async def cancel_when_started() -> None:
                await started.wait()
                scope.cancel()

            tg.start_soon(cancel_when_started)
            await Resolver.fetch("sw", swallows).resolve(state)
    # The caller was cancelled: the swallowed value must not land as the result.
    assert "sw:result" not in state
    assert state.get("sw:status") == "cancelled"


# == governance ================================================================================


@pytest.mark.anyio
async def test_policy_for_the_resolvers_own_writer_allows_its_writes(state: State) -> None:
    state.policy("verify:*", writers=["verify"])

    async def works(s: State) -> str:
        s.set("verify:progress", 0.5)
        return "ok"

    assert await Resolver.fetch("verify", works).resolve(state) == "ok"
    assert state.pick("verify:status", "verify:result", "verify:progress") == {
        "verify:status": "done",
        "verify:result": "ok",
        "verify:progress": 0.5,
    }
    with pytest.raises(ResolverError):
        await Resolver.fetch("verify", failing).resolve(state)
    assert state.get("verify:status") == "error"
    assert "verify:result" not in state
    # Somebody else is still kept out.
    with pytest.raises(PolicyViolation):
        state.set("verify:result", "forged", writer="mallory")


@pytest.mark.anyio
async def test_policy_forbidding_the_writer_refuses_before_anything_is_written(
    state: State,
) -> None:
    state.policy("verify:*", writers=["someone-else"])
    state.set("x", 1)
    before = fingerprint(state)
    calls: list[int] = []

    async def source(s: State) -> str:
        calls.append(1)
        return "ok"

    with pytest.raises(PolicyViolation) as info:
        await Resolver.fetch("verify", source).resolve(state)
    assert "verify:status" in str(info.value)
    assert calls == []
    assert fingerprint(state) == before
    assert "verify:status" not in state


@pytest.mark.anyio
async def test_policy_forbidding_the_source_kind_refuses_before_anything_is_written(
    state: State,
) -> None:
    state.policy("verify:*", sources=["agent"])
    before = fingerprint(state)
    with pytest.raises(PolicyViolation):
        await Resolver.fetch("verify", _fetch_value).resolve(state)
    assert fingerprint(state) == before
    # The agent kind is allowed.
    assert await Resolver.agent("verify", Echo("ok")).resolve(state) == "ok"


@pytest.mark.anyio
async def test_result_over_a_size_cap_ends_the_run_as_an_error(state: State) -> None:
    state.policy("verify:result", max_bytes=16)
    state.set("verify:result", "small", writer="verify")

    async def big(s: State) -> str:
        return "x" * 100

    with pytest.raises(ResolverError) as info:
        await Resolver.fetch("verify", big).resolve(state)
    assert isinstance(info.value.__cause__, PolicyViolation)
    message = state.get("verify:error")
    assert "16-byte cap" in message
    assert "verify:result" in message
    assert info.value.error == message
    assert state.get("verify:status") == "error"
    assert "verify:result" not in state
    record = state.provenance("verify:error")
    assert record is not None
    assert record.meta["exception"] == "PolicyViolation"


@pytest.mark.anyio
async def test_result_refused_by_a_schema_ends_the_run_as_an_error(state: State) -> None:
    state.declare("count:result", int)

    async def wrong_type(s: State) -> str:
        return "seven"

    with pytest.raises(ResolverError) as info:
        await Resolver.fetch("count", wrong_type).resolve(state)
    assert isinstance(info.value.__cause__, SchemaError)
    assert state.get("count:status") == "error"
    assert "count:result" in state.get("count:error")

    async def right_type(s: State) -> int:
        return 7

    assert await Resolver.fetch("count", right_type).resolve(state) == 7
    assert state.pick("count:status", "count:result", "count:error") == {
        "count:status": "done",
        "count:result": 7,
    }


@pytest.mark.anyio
async def test_refused_error_write_still_ends_with_a_terminal_status(
    state: State, caplog: pytest.LogCaptureFixture
) -> None:
    state.policy("verify:error", read_only=True)
    with caplog.at_level(logging.ERROR, logger="slateflow.resolve"), pytest.raises(ResolverError):
        await Resolver.fetch("verify", failing).resolve(state)
    assert state.get("verify:status") == "error"
    assert "verify:error" not in state
    assert any("could not be written" in r.getMessage() for r in caplog.records)


@pytest.mark.anyio
async def test_source_writing_another_key_is_refused_inside_the_source(state: State) -> None:
    state.set("other", 0)
    before = state.version("other")
    seen: list[PolicyViolation] = []

    async def meddles(s: State) -> str:
        try:
            s.set("other", 1)
        except PolicyViolation as exc:
            seen.append(exc)
            raise
        return "never"

    with pytest.raises(ResolverError) as info:
        await Resolver.fetch("v", meddles).resolve(state)
    assert len(seen) == 1
    assert info.value.__cause__ is seen[0]
    assert state.get("v:error") == str(seen[0])
    assert "'other'" in state.get("v:error")
    assert state.get("other") == 0
    assert state.version("other") == before


@pytest.mark.anyio
@pytest.mark.parametrize(
    "write",
    [
        pytest.param(lambda s: s.update({"v:progress": 1, "elsewhere": 2}), id="update"),
        pytest.param(lambda s: s.remove("elsewhere"), id="remove"),
        pytest.param(lambda s: s.modify("elsewhere", 0, lambda n: n + 1), id="modify"),
        pytest.param(lambda s: s.clear_prefix("elsewhere"), id="clear_prefix"),
        pytest.param(lambda s: s.set("v2:result", 1), id="similar-name"),
    ],
)
async def test_source_cannot_write_outside_its_keys_by_any_method(
    state: State, write: Callable[[State], Any]
) -> None:
    state.set("elsewhere", 5)
    before = state.version("elsewhere")

    async def source(s: State) -> str:
        write(s)
        return "never"

    with pytest.raises(ResolverError) as info:
        await Resolver.fetch("v", source).resolve(state)
    assert isinstance(info.value.__cause__, PolicyViolation)
    assert state.get("elsewhere") == 5
    assert state.version("elsewhere") == before
    assert "v:progress" not in state
    assert "v2:result" not in state


@pytest.mark.anyio
async def test_source_may_write_its_own_progress_key(state: State) -> None:
    async def source(s: State) -> str:
        s.set("lookup:progress", "halfway")
        s.set("lookup:detail:step", 2)
        s.set("lookup:note", "explicit", source="tool", writer="helper")
        return "done"

    await Resolver.fetch("lookup", source).resolve(state)
    for key in ("lookup:progress", "lookup:detail:step"):
        record = state.provenance(key)
        assert record is not None
        assert (record.source, record.writer) == ("fetch", "lookup")
    note = state.provenance("lookup:note")
    assert note is not None
    assert (note.source, note.writer) == ("tool", "helper")
    # Outside the run, writes are the user's again.
    state.set("after", 1)
    after = state.provenance("after")
    assert after is not None
    assert (after.source, after.writer) == ("user", None)


@pytest.mark.anyio
@pytest.mark.parametrize("suffix", ["result", "error", "status"])
async def test_source_cannot_write_its_runtime_keys(state: State, suffix: str) -> None:
    async def source(s: State) -> str:
        s.set(f"v:{suffix}", "forged")
        return "real"

    with pytest.raises(ResolverError) as info:
        await Resolver.fetch("v", source).resolve(state)
    assert isinstance(info.value.__cause__, PolicyViolation)
    assert f"v:{suffix}" in state.get("v:error")
    assert state.get("v:status") == "error"
    assert "v:result" not in state
    assert "forged" not in repr(state.snapshot())


@pytest.mark.anyio
async def test_fence_is_lifted_after_the_run_even_when_it_fails(state: State) -> None:
    with pytest.raises(ResolverError):
        await Resolver.fetch("v", failing).resolve(state)
    state.set("other", 1)  # not refused: the run's fence is gone
    assert state.get("other") == 1


# == definition errors =========================================================================


@pytest.mark.parametrize(
    "name",
    ["", "has space", "a*b", "tab\tname", 3, None, b"bytes", "x" * 300, "trailing:"],
    ids=repr,
)
def test_bad_resolver_names_are_definition_errors(name: Any) -> None:
    with pytest.raises(ResolverDefinitionError):
        Resolver.fetch(name, _fetch_value)


def test_resolver_named_state_meta_is_a_definition_error() -> None:
    with pytest.raises(ResolverDefinitionError):
        Resolver.fetch("state_meta", _fetch_value)


def test_good_names_are_accepted() -> None:
    for name in ("verify", "a:b", "lookup-2", "x_y"):
        resolver = Resolver.fetch(name, _fetch_value)
        assert resolver.result_key == f"{name}:result"
        assert resolver.error_key == f"{name}:error"
        assert resolver.status_key == f"{name}:status"


@pytest.mark.parametrize(
    "options",
    [
        pytest.param({"reactive": True}, id="reactive-without-reads"),
        pytest.param({"reactive": True, "reads": []}, id="reactive-empty-reads"),
        pytest.param({"reactive": True, "reads": ["slot", "v:result"]}, id="reactive-own-key"),
        pytest.param({"reactive": True, "reads": ["v:progress"]}, id="reactive-own-progress"),
        pytest.param({"timeout": -1}, id="negative-timeout"),
        pytest.param({"timeout": 0}, id="zero-timeout"),
        pytest.param({"timeout": math.nan}, id="nan-timeout"),
        pytest.param({"timeout": math.inf}, id="inf-timeout"),
        pytest.param({"timeout": True}, id="bool-timeout"),
        pytest.param({"timeout": "5"}, id="str-timeout"),
        pytest.param({"ttl": -5}, id="negative-ttl"),
        pytest.param({"ttl": 0}, id="zero-ttl"),
        pytest.param({"debounce": -0.1}, id="negative-debounce"),
        pytest.param({"on_conflict": "newest"}, id="bad-on-conflict"),
        pytest.param({"on_conflict": None}, id="none-on-conflict"),
        pytest.param({"retry": 3}, id="int-retry"),
        pytest.param({"retry": {"attempts": 3}}, id="dict-retry"),
        pytest.param({"retry": Retry}, id="retry-class"),
    ],
)
def test_bad_options_are_definition_errors(options: dict[str, Any]) -> None:
    with pytest.raises(ResolverDefinitionError):
        Resolver.fetch("v", _fetch_value, **options)


def test_reactive_reading_another_resolvers_keys_is_fine() -> None:
    resolver = Resolver.fetch("v", _fetch_value, reactive=True, reads=["verify:result", "slot"])
    assert resolver.reads == ("verify:result", "slot")
    assert Resolver.fetch("v", _fetch_value, reads="slot").reads == ("slot",)
    assert Resolver.fetch("v", _fetch_value, reads=["a", "a", Key("b", int)]).reads == ("a", "b")


def test_invalid_read_key_is_a_definition_error() -> None:
    with pytest.raises(ResolverDefinitionError):
        Resolver.fetch("v", _fetch_value, reads=["bad key"])


@pytest.mark.parametrize(
    "build",
    [
        pytest.param(lambda: Resolver.llm("l", object(), "hi"), id="llm-without-generate"),
        pytest.param(
            lambda: Resolver.llm("l", type("L", (), {"generate": 3})(), "hi"),
            id="llm-generate-not-callable",
        ),
        pytest.param(lambda: Resolver.agent("a", 42), id="agent-not-callable"),
        pytest.param(lambda: Resolver.fetch("f", "http://x"), id="fetch-not-callable"),
        pytest.param(lambda: Resolver.function("f", None), id="function-not-callable"),
    ],
)
def test_bad_sources_are_definition_errors(build: Callable[[], Resolver]) -> None:
    with pytest.raises(ResolverDefinitionError):
        build()


@pytest.mark.parametrize("prompt", ["Hello {", "Hello }", "empty {}", "{items[0]}", "{a b}"])
def test_bad_prompt_syntax_is_a_template_error_at_definition(prompt: str) -> None:
    with pytest.raises(TemplateError):
        Resolver.llm("l", FakeLLM(), prompt)


@pytest.mark.parametrize("options", [{"temperature": -1.0}, {"max_tokens": 0}], ids=repr)
def test_bad_llm_request_options_are_definition_errors(options: dict[str, Any]) -> None:
    with pytest.raises(ResolverDefinitionError):
        Resolver.llm("l", FakeLLM(), "hi", **options)


# == the LLM seam ==============================================================================


@pytest.mark.anyio
async def test_llm_request_carries_every_field(state: State) -> None:
    state.set("topic", "refunds")
    llm = FakeLLM("ok")
    resolver = Resolver.llm(
        "l",
        llm,
        "About {topic}.",
        system="You are terse.",
        model="m-small",
        temperature=0.2,
        max_tokens=64,
    )
    assert await resolver.resolve(state) == "ok"
    (request,) = llm.requests
    assert request == LLMRequest(
        prompt="About refunds.",
        system="You are terse.",
        model="m-small",
        temperature=0.2,
        max_tokens=64,
    )
    record = state.provenance("l:result")
    assert record is not None
    assert record.meta["model"] == "m-small"


@pytest.mark.anyio
async def test_llm_request_defaults(state: State) -> None:
    llm = FakeLLM("ok")
    await Resolver.llm("l", llm, "plain").resolve(state)
    (request,) = llm.requests
    assert (request.prompt, request.system, request.model) == ("plain", None, None)
    assert (request.temperature, request.max_tokens) == (None, None)


@pytest.mark.anyio
async def test_llm_prompt_is_rendered_at_each_attempt() -> None:
    clock = ManualClock()
    state = State(clock=clock)
    state.set("topic", "first")
    llm = FakeLLM(ConnectionError("overloaded"), "second answer")
    resolver = Resolver.llm("l", llm, "On {topic}", retry=Retry(attempts=2, backoff=1))

    def change_topic(i: int) -> None:
        if i == 0:
            state.set("topic", "second")

    outcome = await resolve_while_advancing(resolver, state, clock, [0.5, 5], between=change_topic)
    assert outcome.value == "second answer"
    assert [r.prompt for r in llm.requests] == ["On first", "On second"]
    record = state.provenance("l:result")
    assert record is not None
    assert record.meta["attempt"] == 2
    assert record.meta["inputs"] == {"topic": 2}


@pytest.mark.anyio
async def test_llm_missing_key_is_a_template_error_in_the_error_key(state: State) -> None:
    llm = FakeLLM()
    resolver = Resolver.llm("l", llm, "Hello {user:name}, about {topic}", retry=Retry(backoff=0))
    state.set("topic", "x")
    with pytest.raises(ResolverError) as info:
        await resolver.resolve(state)
    assert isinstance(info.value.__cause__, TemplateError)
    message = state.get("l:error")
    assert "user:name" in message
    assert info.value.attempts == 1
    assert llm.requests == []
    record = state.provenance("l:error")
    assert record is not None
    assert record.meta["exception"] == "TemplateError"
    assert record.meta["inputs"] == {"user:name": 0, "topic": 1}


@pytest.mark.anyio
async def test_llm_secret_key_is_never_rendered_nor_leaked(state: State) -> None:
    secret = "4111-1111-SECRET-9876"
    state.policy("user:card", secret=True)
    state.set("user:card", secret)
    state.set("user:profile", {"name": "Ada", "card": "public"})
    llm = FakeLLM()
    for prompt in ("Card: {user:card}", "Card: {user:card?none}", "Card: {user:card.x}"):
        cursor = state.journal.cursor
        with pytest.raises(ResolverError) as info:
            await Resolver.llm("l", llm, prompt, retry=Retry(backoff=0)).resolve(state)
        err = info.value
        assert isinstance(err.__cause__, TemplateError)
        assert "user:card" in state.get("l:error")
        texts = [
            str(err),
            repr(err),
            err.error,
            str(err.__cause__),
            repr(err.__cause__),
            state.get("l:error"),
            repr(state.provenance("l:error")),
            repr([m.to_dict(redact=False) for m in state.journal.since(cursor)]),
        ]
        for text in texts:
            assert secret not in text
    assert llm.requests == []


@pytest.mark.anyio
async def test_llm_failure_is_retried_and_recorded(state: State) -> None:
    llm = FakeLLM(ConnectionError("overloaded"), ConnectionError("still overloaded"))
    resolver = Resolver.llm("l", llm, "hi", retry=Retry(attempts=2, backoff=0))
    with pytest.raises(ResolverError) as info:
        await resolver.resolve(state)
    assert info.value.attempts == 2
    assert state.get("l:error") == "still overloaded"
    assert len(llm.requests) == 2
    record = state.provenance("l:error")
    assert record is not None
    assert "usage" not in record.meta
    assert record.meta["exception"] == "ConnectionError"


@pytest.mark.anyio
async def test_llm_explicit_reads_replace_the_prompt_keys(state: State) -> None:
    state.set("topic", "x")
    state.set("mood", "calm")
    await Resolver.llm("l", FakeLLM("ok"), "About {topic}", reads=["mood"]).resolve(state)
    record = state.provenance("l:result")
    assert record is not None
    assert record.meta["inputs"] == {"mood": 1}


@pytest.mark.anyio
async def test_llm_non_text_response_is_an_error(state: State) -> None:
    class Broken:
        async def generate(self, request: LLMRequest) -> Any:
            return {"text": "not a response"}

    with pytest.raises(ResolverError):
        await Resolver.llm("l", Broken(), "hi").resolve(state)
    assert state.get("l:status") == "error"
    assert "l:result" not in state


# == ttl and freshness =========================================================================


@pytest.mark.anyio
async def test_is_fresh_follows_the_ttl_on_the_states_clock() -> None:
    clock = ManualClock()
    state = State(clock=clock)
    resolver = Resolver.fetch("v", _fetch_value, ttl=10)
    assert not is_fresh(state, "v")
    await resolver.resolve(state, clock=clock)
    assert is_fresh(state, "v")
    await clock.advance(9.5)
    assert is_fresh(state, "v")
    await clock.advance(0.5)
    assert not is_fresh(state, "v")
    # A new run with a different value makes it fresh again.
    await Resolver.function("v", lambda s: {"n": 2}, ttl=10).resolve(state, clock=clock)
    assert is_fresh(state, "v")
    await clock.advance(10)
    assert not is_fresh(state, "v")


@pytest.mark.anyio
async def test_is_fresh_without_ttl_and_after_failure() -> None:
    clock = ManualClock()
    state = State(clock=clock)
    await Resolver.fetch("v", _fetch_value).resolve(state, clock=clock)
    await clock.advance(1_000_000)
    assert is_fresh(state, "v")  # no ttl: never stale
    with pytest.raises(ResolverError):
        await Resolver.fetch("v", failing, ttl=10).resolve(state, clock=clock)
    assert not is_fresh(state, "v")  # the failure removed the result


@pytest.mark.anyio
async def test_rerun_with_the_same_value_refreshes_ttl_and_provenance() -> None:
    clock = ManualClock()
    state = State(clock=clock)
    state.set("slot", "a")
    resolver = Resolver.fetch("v", _fetch_value, ttl=10, reads=["slot"])
    await resolver.resolve(state, clock=clock)
    await clock.advance(20)
    state.set("slot", "b")
    assert not is_fresh(state, "v")
    cursor = state.journal.cursor
    await resolver.resolve(state, clock=clock)
    assert is_fresh(state, "v")
    record = state.provenance("v:result")
    assert record is not None
    assert record.meta["inputs"] == {"slot": 2}
    assert "v:result" in {m.key for m in state.journal.since(cursor)}


# -- a run of each kind writes the same three keys ----------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("kind", sorted(KIND_BUILDERS))
async def test_every_kind_writes_the_same_keys(state: State, kind: str) -> None:
    value = await KIND_BUILDERS[kind]("k").resolve(state)
    assert state.get("k:result") == value
    assert state.get("k:status") == "done"
    assert sorted(state.keys("k:")) == ["k:result", "k:status"]


class ServerSaid(Exception):
    """A failure carrying what the server said of retrying it (as integration errors do)."""

    def __init__(self, retryable: bool | None, retry_after: float | None) -> None:
        super().__init__(f"HTTP error (retryable={retryable}, retry after {retry_after})")
        self.retryable = retryable
        self.retry_after = retry_after


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("failure", "expected"),
    [
        (ServerSaid(True, 3.0), [0, 3, 6]),  # Retry-After: 3 beats the 1 s backoff
        (ServerSaid(True, 100.0), [0, 10, 20]),  # ... within max_backoff
        (ServerSaid(True, None), [0, 1, 3]),  # retryable, no wait asked: the backoff
        (ServerSaid(False, 1.0), [0]),  # a 400 is not retried
    ],
)
async def test_a_failure_that_says_how_to_retry_is_taken_at_its_word(
    failure: BaseException, expected: list[float]
) -> None:
    clock = ManualClock()
    state = State(clock=clock)
    source = Flaky(clock, *(failure for _ in range(10)))
    retry = Retry(attempts=3, backoff=1, multiplier=2, max_backoff=10)
    outcome = await resolve_while_advancing(
        Resolver.fetch("v", source, retry=retry), state, clock, 100
    )
    assert isinstance(outcome.error, ResolverError)
    assert source.times == pytest.approx(expected)


@pytest.mark.anyio
async def test_a_slateflow_error_that_says_it_is_retryable_is_retried() -> None:
    from slateflow.errors import SlateError

    class Busy(SlateError):
        retryable = True
        retry_after = 0.5

    clock = ManualClock()
    source = Flaky(clock, Busy("the model server is busy"), value="ok")
    outcome = await resolve_while_advancing(
        Resolver.fetch("v", source, retry=Retry(attempts=2)), State(clock=clock), clock, 10
    )
    assert outcome.value == "ok"
    assert source.times == pytest.approx([0, 0.5])
