"""The crash test: a durable 10-step flow with background resolvers killed by SIGKILL at random
points, then resumed in a new process.

Each run forks a worker (``crash_worker.run_flow``) from a forkserver that has slateflow
preloaded; the worker arms a timer that SIGKILLs it a random time into the flow (anywhere from
before the State is open to after the flow completed); it is resumed in a new process on the
other event loop (killed on asyncio, resumed on trio, or the reverse). Then
``crash_worker.crash_and_resume`` checks:

- the file a kill leaves is a consistent state: every resolver marked done has its result from
  the same commit (no half-applied batch), and every write the worker was told is durable is
  there (no committed write lost);
- a resolver whose result was durable before the kill never ran again (exactly once), and no
  resolver ran more than twice (at least once, re-dispatched once at most);
- the resumed run ends in exactly the values of an uninterrupted run.

``bench/crash_bench.py`` runs many more of these.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import crash_worker

pytestmark = pytest.mark.crash

RUNS = 50
TALLY: Counter[str] = Counter()


class Clean:
    """An uninterrupted run: its final values, and how long a run takes here."""

    def __init__(self, values: dict[str, Any], seconds: float) -> None:
        self.values = values
        self.seconds = seconds


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Clean:
    crash_worker.uninterrupted(tmp_path_factory.mktemp("warm"))  # starts the forkserver
    return Clean(*crash_worker.uninterrupted(tmp_path_factory.mktemp("clean")))


def test_the_uninterrupted_run_completes_the_flow(uninterrupted: Clean) -> None:
    assert uninterrupted.values["flow:booking:complete"] is True
    assert uninterrupted.values["r8:result"] == {"step": 8, "value": 64}


@pytest.mark.parametrize("seed", range(RUNS))
def test_a_killed_run_resumes_to_the_uninterrupted_end(
    seed: int, tmp_path: Path, uninterrupted: Clean
) -> None:
    TALLY.update(
        crash_worker.crash_and_resume(tmp_path, seed, uninterrupted.seconds, uninterrupted.values)
    )
    TALLY["runs"] += 1


def test_the_kills_landed_mid_flow() -> None:
    """The random kills must exercise resumption, not mostly hit finished runs."""
    if TALLY["runs"] < RUNS:
        pytest.skip("needs every crash run of this module")
    assert TALLY["killed mid-flow"] >= RUNS // 3, TALLY
    assert TALLY["resolvers run twice"] >= 3, TALLY  # in flight at the kill: run again
