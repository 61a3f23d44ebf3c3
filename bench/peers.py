"""The peers the benchmarks measure on this machine, in the same run: Burr and LangGraph.

Each returns None when its library is not installed (``python -m pip install -e ".[bench]"``).
"""

from __future__ import annotations

import gc
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any


def _burr_step() -> Any:
    """A Burr action adding one to ``i`` (Burr imported here: it is optional)."""
    from burr.core import State as BurrState
    from burr.core.action import action

    @action(reads=["i"], writes=["i"])
    def step(state: BurrState) -> BurrState:
        return state.update(i=state["i"] + 1)

    return step


def burr_chain(steps: int, repeat: int) -> float | None:
    """Seconds per step of a ``steps``-action Burr chain, ``app.step()`` per step."""
    try:
        from burr.core import ApplicationBuilder, default
    except ImportError:
        return None
    step = _burr_step()
    samples = []
    for _ in range(repeat):
        app = (
            ApplicationBuilder()
            .with_actions(**{f"s{i}": step for i in range(steps)})
            .with_transitions(*[(f"s{i}", f"s{i + 1}", default) for i in range(steps - 1)])
            .with_state(i=0)
            .with_entrypoint("s0")
            .build()
        )
        gc.collect()
        start = time.perf_counter()
        for _ in range(steps):
            app.step()
        samples.append((time.perf_counter() - start) / steps)
    return statistics.median(samples)


def burr_durable(flows: int, repeat: int) -> float | None:
    """Burr's SQLite persister (WAL, synchronous=NORMAL) saving every step of a 3-step app."""
    try:
        from burr.core import ApplicationBuilder, default
        from burr.core.persistence import SQLLitePersister
    except ImportError:
        return None
    step = _burr_step()
    samples = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(repeat):
            path = str(Path(tmp) / f"burr-{r}.db")
            conn = sqlite3.connect(path, check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            persister = SQLLitePersister(path, table_name="burr_state", connection=conn)
            persister.initialize()
            gc.collect()
            start = time.perf_counter()
            for n in range(flows):
                app = (
                    ApplicationBuilder()
                    .with_actions(a=step, b=step, c=step)
                    .with_transitions(("a", "b", default), ("b", "c", default))
                    .with_state(i=0)
                    .with_entrypoint("a")
                    .with_identifiers(app_id=f"app-{n}")
                    .with_state_persister(persister)
                    .build()
                )
                for _ in range(3):
                    app.step()
            samples.append((time.perf_counter() - start) / (flows * 3))
            conn.close()
    return statistics.median(samples)


def langgraph_chain(steps: int, repeat: int) -> float | None:
    try:
        from typing import TypedDict

        from langgraph.graph import END, START, StateGraph
    except ImportError:
        return None

    class S(TypedDict):
        i: int

    def node(state: S) -> dict[str, int]:
        return {"i": state["i"] + 1}

    graph = StateGraph(S)
    for i in range(steps):
        graph.add_node(f"s{i}", node)
    graph.add_edge(START, "s0")
    for i in range(steps - 1):
        graph.add_edge(f"s{i}", f"s{i + 1}")
    graph.add_edge(f"s{steps - 1}", END)
    app = graph.compile()
    samples = []
    for _ in range(repeat):
        gc.collect()
        start = time.perf_counter()
        out = app.invoke({"i": 0}, {"recursion_limit": steps + 10})
        samples.append((time.perf_counter() - start) / steps)
        assert out["i"] == steps
    return statistics.median(samples)
