"""The call timeline of a long call: the page written, and drawn in a real Chromium; prints a
table against the targets.

Run: ``python bench/timeline_bench.py`` (``--quick`` for a smoke run, as CI does). A durable
call of 10,000 commits (turns, a flow, resolver runs, tool calls and plain writes) is recorded
once; then ``slateflow.timeline.build`` writes its page, and headless Chromium (Debian's
``chromium`` and ``chromium-driver``) loads it: the page's own ``performance.now()`` when it
finished drawing is its render time. Targets (issue 31): HTML written in <= 1 s, rendered in
<= 2 s.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the test suite's headless Chromium

from browser_support import CHROMEDRIVER, CHROMIUM  # noqa: E402
from slateflow import State  # noqa: E402
from slateflow.timeline import build  # noqa: E402


def record(path: Path, commits: int) -> None:
    """A call of ``commits`` commits, written as a voice call's would be (without the wait)."""
    with State.open(path, durability="batch") as state:
        turn = 0
        i = 0
        while i < commits:
            turn += 1
            state.update({"session:turn": turn, "turn:user": f"words of turn {turn}"})
            state.set("lookup:status", "running")
            state.update({"lookup:result": {"open": turn % 2 == 0}, "lookup:status": "done"})
            state.set("flow:booking:active", [f"s{turn % 7}"])
            state.set("tool:book:result", f"booked {turn}")
            i += 5
            for k in range(min(5, commits - i)):
                state.set(f"slot:{k}", turn * 10 + k)
                i += 1


def render_ms(page: Path) -> float | None:
    """The page's own drawing time in headless Chromium, or None without a browser."""
    if CHROMIUM is None or CHROMEDRIVER is None:
        return None
    from browser_support import chromium

    with chromium() as browser:
        browser.get(page.as_uri())
        value = browser.execute_script(
            "return document.documentElement.getAttribute('data-rendered-ms')"
        )
    return float(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a fast smoke run (as in CI)")
    args = parser.parse_args(argv)
    repeat = 2 if args.quick else 5
    commits = 10_000
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp)
        record(where / "call.db", commits)
        writes = []
        for _ in range(repeat):
            start = time.perf_counter()
            text = build(where / "call.db")
            (where / "call.html").write_text(text, encoding="utf-8")
            writes.append(time.perf_counter() - start)
        size = (where / "call.html").stat().st_size
        renders = [render_ms(where / "call.html") for _ in range(repeat)]
    print(f"slateflow timeline, a call of {commits:,} commits (Python {sys.version.split()[0]})")
    print(f"{'measure':48} {'value':>14}   target")
    print("-" * 80)
    print(f"{'HTML written (median)':48} {statistics.median(writes) * 1e3:>11.0f} ms   <= 1 s")
    print(f"{'  its size':48} {size / 1e6:>11.2f} MB")
    drawn = [r for r in renders if r is not None]
    if drawn:
        print(f"{'rendered in Chromium (median, in the page)':48} "
              f"{statistics.median(drawn):>11.0f} ms   <= 2 s")  # fmt: skip
    else:
        print(f"{'rendered in Chromium':48} {'no browser':>14}   (apt-get install chromium)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
