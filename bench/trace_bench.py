"""What OpenTelemetry tracing costs: flow steps and span-creating operations, tracing off and
on; prints a table of medians against the targets.

Run: ``python bench/trace_bench.py`` (``--quick`` for a fast smoke run, as CI does). Needs
``opentelemetry-sdk`` (in the dev extra).

- **A flow step** (the 200-step linear flow of ``flow_bench.py``, each step completed by one
  write) with tracing off, and with ``otel.instrument()`` on over an SDK provider exporting to
  nowhere (a no-op exporter behind a simple processor), outside any span and inside one (where
  each step and commit become events). Target (issue 31): off unchanged within noise (one
  check of a module global); no span per step.
- **A span-creating operation** with tracing on, minus the same with tracing off: a user turn,
  a resolver called in a Session, a model call (``Resolver.llm`` on a scripted model, two spans:
  the run and the call). Target: <= 50 µs per span-creating operation.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import anyio
from flow_bench import linear_flow  # the same 200-step flow as the flow bench
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import NoOpTracerProvider

from slateflow import Conversation, ManualClock, Resolver, Session, State
from slateflow.flow import FlowRunner
from slateflow.integrations import otel
from slateflow.testing import ScriptedLLM


class Nowhere(SpanExporter):
    """Exports nothing: what is measured is slateflow's spans, not an exporter."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


PROVIDER = TracerProvider()
PROVIDER.add_span_processor(SimpleSpanProcessor(Nowhere()))
TRACER = PROVIDER.get_tracer("bench")


def flow_step(steps: int, inside_span: bool) -> float:
    """Seconds per step of a linear flow of ``steps`` steps."""
    flow = linear_flow(steps)
    state = State()
    runner = FlowRunner(flow, state)
    gc.collect()
    start = time.perf_counter()
    if inside_span:
        with TRACER.start_as_current_span("bench"):
            for i in range(steps):
                state.set(f"k:{i}", True)
    else:
        for i in range(steps):
            state.set(f"k:{i}", True)
    spent = time.perf_counter() - start
    assert runner.is_complete
    runner.close()
    return spent / steps


def operations(n: int) -> dict[str, float]:
    """Seconds per user turn, resolver call and model call (a fresh session each time)."""

    async def run() -> dict[str, float]:
        clock = ManualClock()
        out: dict[str, float] = {}
        async with Session(State(clock=clock), clock=clock) as session:
            conversation = Conversation(session)
            start = time.perf_counter()
            for _ in range(n):
                await conversation.user_turn("four of us on Saturday")
            out["turn"] = (time.perf_counter() - start) / n

            async def lookup(state: State) -> int:
                return 1

            fetch = Resolver.fetch("lookup", lookup)
            start = time.perf_counter()
            for _ in range(n):
                await session.call(fetch)
            out["resolver"] = (time.perf_counter() - start) / n
            llm = ScriptedLLM(["Seven is free."] * n, model="bench")
            ask = Resolver.llm("answer", llm, "When?")
            start = time.perf_counter()
            for _ in range(n):
                await session.call(ask)
            out["model"] = (time.perf_counter() - start) / n
        return out

    return anyio.run(run)


def sdk_span(n: int) -> float:
    """Seconds per bare SDK span (started as current, ended): the peer a span is measured
    against."""
    start = time.perf_counter()
    for _ in range(n):
        with TRACER.start_as_current_span("peer", attributes={"peer.number": 1}):
            pass
    return (time.perf_counter() - start) / n


def sdk_event(n: int) -> float:
    """Seconds per SDK event with three attributes on a recording span."""
    with TRACER.start_as_current_span("peer") as span:
        start = time.perf_counter()
        for i in range(n):
            span.add_event("peer", {"a": i, "b": "lookup:result, lookup:status", "c": "1, 2"})
        return (time.perf_counter() - start) / n


def paired(
    measure: Callable[[], Any], repeat: int, provider: Any = PROVIDER
) -> tuple[list[Any], list[Any]]:
    """``measure()`` with tracing off and on, alternating (the VM's speed drifts)."""
    off: list[Any] = []
    on: list[Any] = []
    for _ in range(repeat):
        off.append(measure())
        with otel.instrument(tracer_provider=provider):
            on.append(measure())
    return off, on


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a fast smoke run (as in CI)")
    args = parser.parse_args(argv)
    repeat = 5 if args.quick else 25
    n = 200 if args.quick else 1000
    rows: list[tuple[str, float, str]] = []
    med = statistics.median
    off, on = paired(lambda: flow_step(200, False), repeat)
    _, inside = paired(lambda: flow_step(200, True), repeat)
    rows += [
        ("flow step, tracing off", med(off), "unchanged (flow_bench)"),
        ("flow step, tracing on, no current span", med(on), ""),
        ("flow step, tracing on, inside a span (events)", med(inside), "no span per step"),
    ]
    plain, traced = paired(lambda: operations(n), repeat)
    bare, api = paired(lambda: operations(n), repeat, NoOpTracerProvider())
    for name, what, spans in (
        ("turn", "a user turn", 1),
        ("resolver", "a resolver call", 1),
        ("model", "a Resolver.llm call (run + model call)", 2),
    ):
        base = med(p[name] for p in plain)
        over = med(t[name] - p[name] for p, t in zip(plain, traced, strict=True))
        ours = med(t[name] - p[name] for p, t in zip(bare, api, strict=True))
        rows.append((f"{what}, tracing off", base, ""))
        rows.append((f"  on, SDK: per span over off ({spans} span(s), with events)", over / spans,
                     "<= 50 us"))  # fmt: skip
        rows.append(("  on, the API's no-op provider: slateflow's own part", ours / spans, ""))
    rows.append(("a bare SDK span, as current (peer)", med(sdk_span(n) for _ in range(repeat)),
                 "(a span costs 9-47 us)"))  # fmt: skip
    rows.append(("an SDK event, 3 attributes (peer)", med(sdk_event(n) for _ in range(repeat)),
                 ""))  # fmt: skip
    print(f"slateflow tracing benchmarks (Python {sys.version.split()[0]}, medians of {repeat})")
    print(f"{'measure':56} {'value':>10}   target")
    print("-" * 90)
    for name, seconds, target in rows:
        print(f"{name:56} {seconds * 1e6:>7.2f} us   {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
