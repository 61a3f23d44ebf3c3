"""Kill-and-resume rounds of the crash test, many more than the test suite runs; prints a table.

Run: ``python bench/crash_bench.py`` (``--runs N``, default 300; ``--quick`` runs 20).

Each round runs the 10-step durable booking flow of ``tests/stores/crash_worker.py`` in a forked
process, SIGKILLs it a random time in (batch durability, every fifth round sync), checks the
file it left (no acknowledged write lost, no half-applied batch, finished resolvers ran exactly
once), resumes it in a new process and checks the end equals an uninterrupted run. Any failed
check stops the run with the seed that reproduces it.

Then the batch-loss window: a process writing as fast as one CPU-bound thread can under
``durability="batch"`` is SIGKILLed at a random moment; the window is how long before the kill
the oldest acknowledged write that did not reach the file was acknowledged (``--windows N``,
default 100; ``--quick`` runs 10). The store bounds it by ``max_lag`` (5 ms) plus the one
transaction being written at the kill.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "stores"))

import crash_worker


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a fast smoke run (as in CI)")
    parser.add_argument("--runs", type=int, default=300, help="kill-and-resume rounds")
    parser.add_argument("--seed", type=int, default=1000, help="seed of the first round")
    parser.add_argument("--windows", type=int, default=100, help="tight-writer kills")
    args = parser.parse_args()
    runs = 20 if args.quick else args.runs
    kills = 10 if args.quick else args.windows

    tally: Counter[str] = Counter()
    rounds: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp)
        (where / "warm").mkdir()
        crash_worker.uninterrupted(where / "warm")  # starts the forkserver
        (where / "clean").mkdir()
        expected, seconds = crash_worker.uninterrupted(where / "clean")
        for n in range(runs):
            seed = args.seed + n
            run_dir = where / f"run{seed}"
            run_dir.mkdir()
            started = time.perf_counter()
            try:
                tally.update(crash_worker.crash_and_resume(run_dir, seed, seconds, expected))
            except AssertionError as exc:
                print(f"FAILED at seed {seed}: {exc}", file=sys.stderr)
                raise SystemExit(1) from None
            rounds.append(time.perf_counter() - started)
        rng = random.Random(args.seed)
        windows: list[float] = []
        lost: list[int] = []
        for n in range(kills):
            (where / f"tight{n}").mkdir()
            window, count = crash_worker.loss_window(where / f"tight{n}", rng.uniform(0.05, 0.3))
            windows.append(window)
            lost.append(count)

    print(f"slateflow crash bench (Python {sys.version.split()[0]})")
    print(f"{'measure':<52}{'value':>12}")
    print("-" * 64)
    rows = [
        ("kill-and-resume rounds, all checks passed", f"{runs}"),
        ("killed by SIGKILL", f"{tally['killed']}"),
        ("killed before the flow completed", f"{tally['killed mid-flow']}"),
        ("resolvers in flight at the kill, run again", f"{tally['resolvers run twice']}"),
        ("finished resolvers run again", "0"),
        ("acknowledged writes lost", "0"),
        ("uninterrupted run (fork to exit)", f"{seconds * 1e3:.0f} ms"),
        ("median round (kill, check, resume, check)", f"{statistics.median(rounds) * 1e3:.0f} ms"),
        (f"batch-loss window, median of {kills} kills", f"{statistics.median(windows):.1f} ms"),
        ("batch-loss window, worst", f"{max(windows):.1f} ms"),
        ("  documented bound: max_lag + one transaction", "5 ms + write"),
        ("acknowledged writes lost at a kill, worst", f"{max(lost):,}"),
    ]
    for name, value in rows:
        print(f"{name:<52}{value:>12}")


if __name__ == "__main__":
    main()
