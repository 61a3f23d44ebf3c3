"""RayExecutor against LocalExecutor: 200 concurrent steps and a lone round trip, on asyncio
and trio; prints a table of medians against the target.

Run: ``python bench/ray_bench.py`` (``--quick`` for a fast smoke run, as CI does). Needs
``slateflow[ray]``; starts a local Ray of two CPUs. Ray's servers listen on every interface, so
CI runs this inside a private network namespace (``unshare -n``); the table says where it ran.

A step is an async agent that answers at once, so what is measured is the executor: shipping
the spec out as JSON, an actor call, the outcome back as JSON, and the wait on the object ref.
Per step over local: (Ray's wall time for 200 steps - the local executor's) / 200, with 2
actors x 100 concurrent calls. Target (issue 30): <= 2 ms a step over the local executor.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import tempfile
import time
import warnings

import anyio

from slateflow.orchestrate import AgentStepSpec, LocalExecutor, execute_parallel
from slateflow.orchestrate.ray import RayExecutor

STEPS = 200


async def answer(spec: AgentStepSpec) -> dict[str, object]:
    return {"n": spec.input}


AGENTS = {"answer": answer}


async def fan_out(executor: object, specs: list[AgentStepSpec]) -> float:
    start = time.perf_counter()
    outcomes = await execute_parallel(executor, specs)  # type: ignore[arg-type]
    spent = time.perf_counter() - start
    assert all(o.success for o in outcomes), [o.error for o in outcomes if not o.success][:2]
    return spent


async def lone(executor: RayExecutor, rounds: int) -> list[float]:
    spec = AgentStepSpec(task_id="one", agent="answer", input=1)
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        outcome = await executor.execute_step(spec)
        times.append(time.perf_counter() - start)
        assert outcome.success, outcome.error
    return times


def measure(backend: str, repeat: int) -> dict[str, float]:
    specs = [AgentStepSpec(task_id=f"t{i}", agent="answer", input=i) for i in range(STEPS)]
    local = LocalExecutor(AGENTS, concurrency=STEPS)
    with RayExecutor(AGENTS, actors=2, actor_concurrency=100) as ray_executor:
        anyio.run(fan_out, ray_executor, specs, backend=backend)  # start the actors, warm up
        ours, theirs = [], []
        for _ in range(repeat):
            theirs.append(anyio.run(fan_out, local, specs, backend=backend))
            ours.append(anyio.run(fan_out, ray_executor, specs, backend=backend))
        trips = anyio.run(lone, ray_executor, 20 if repeat < 5 else 200, backend=backend)
    over = [(o - t) / STEPS for o, t in zip(ours, theirs, strict=True)]
    return {
        "local": statistics.median(theirs) / STEPS,
        "ray": statistics.median(ours) / STEPS,
        "over": statistics.median(over),
        "trip": statistics.median(trips),
        "trip_p99": sorted(trips)[int(len(trips) * 0.99) - 1] if len(trips) >= 100 else max(trips),
    }


def network() -> str:
    names = sorted(name for _, name in socket.if_nameindex())
    return "a private network namespace" if names == ["lo"] else "this machine's network"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a fast smoke run (as in CI)")
    args = parser.parse_args(argv)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import ray
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        _temp_dir=tempfile.mkdtemp(prefix="ray"),
        log_to_driver=False,
        configure_logging=False,
        runtime_env={"env_vars": {"PYTHONPATH": ":".join(sys.path)}},
    )
    repeat = 3 if args.quick else 15
    try:
        rows = [(backend, measure(backend, repeat)) for backend in ("asyncio", "trio")]
    finally:
        ray.shutdown()
    print(
        f"slateflow RayExecutor (Ray {ray.__version__}, Python {sys.version.split()[0]}, "
        f"2 CPUs, in {network()}, medians of {repeat})"
    )
    print(f"{'measure':<58}{'value':>12}   target")
    print("-" * 90)
    for backend, m in rows:
        for name, seconds, target in (
            (f"{backend}: LocalExecutor, {STEPS} concurrent steps, per step", m["local"], ""),
            (f"{backend}: RayExecutor, {STEPS} concurrent steps, per step", m["ray"], ""),
            ("  per step over the local executor", m["over"], "<= 2 ms"),
            (f"{backend}: RayExecutor, a lone round trip (p50)", m["trip"], "(reported)"),
            ("  a lone round trip (p99)", m["trip_p99"], ""),
        ):
            print(f"{name:<58}{seconds * 1e3:>9.3f} ms   {target}")


if __name__ == "__main__":
    main()
