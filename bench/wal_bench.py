"""What a damaged -wal does at open: random bit flips and truncations of the write-ahead log a
killed process left, each reopened; counted as detected (StoreCorruptError), whole (every
commit back), or silently shorter (fewer commits, no error).

    python bench/wal_bench.py [--quick]

A writer process commits with durability="sync" and is killed (SIGKILL) while its -wal holds
the newest commits. Each round copies the file and its -wal, damages the copy of the -wal and
opens it with State.open. Damage in the log's last frame, and a log cut short, cannot be told
from the torn tail a crash leaves: those open shorter by design (see slateflow.stores.wal).
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from slateflow import State
from slateflow.errors import StoreCorruptError

COMMITS = 60

WRITER = """
import os, signal, sys
from slateflow import State
state = State.open(sys.argv[1], durability="sync")
for i in range({n}):
    state.set("call:step", i)
    state.set(f"note:{{i}}", "x" * 300)
os.kill(os.getpid(), signal.SIGKILL)
"""


def crashed_file(folder: Path) -> Path:
    path = folder / "call.db"
    code = WRITER.format(n=COMMITS)
    proc = subprocess.run([sys.executable, "-c", code, str(path)], check=False)
    assert proc.returncode == -signal.SIGKILL, proc.returncode
    assert Path(f"{path}-wal").stat().st_size > 0
    return path


def outcome(original: Path, damage: object, where: Path) -> str:
    copy = where / "copy.db"
    for suffix in ("", "-wal"):
        shutil.copyfile(f"{original}{suffix}", f"{copy}{suffix}")
    with contextlib_suppress():
        os.remove(f"{copy}-shm")
    wal = Path(f"{copy}-wal")
    data = bytearray(wal.read_bytes())
    kind, spots = damage  # type: ignore[misc]
    if kind == "flip":
        for at, bit in spots:
            data[at] ^= 1 << bit
    else:
        del data[spots:]
    wal.write_bytes(bytes(data))
    try:
        with State.open(copy) as state:
            commits = state.journal.cursor
    except StoreCorruptError:
        return "detected"
    finally:
        for suffix in ("", "-wal", "-shm", "-wal.damaged"):
            with contextlib_suppress():
                os.remove(f"{copy}{suffix}")
    return "whole" if commits == 2 * COMMITS else "silently shorter"


class contextlib_suppress:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return exc[0] is not None and issubclass(exc[0], OSError)  # type: ignore[arg-type]


def main() -> None:
    quick = "--quick" in sys.argv
    rng = random.Random(26)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        original = crashed_file(folder)
        size = Path(f"{original}-wal").stat().st_size
        page = 4096 + 24
        frames = (size - 32) // page
        last = 32 + (frames - 1) * page
        rounds: dict[str, list[object]] = {
            "1-3 bit flips, anywhere but the last frame": [],
            "1 bit flip in the last frame": [],
            "1 bit flip in the header": [],
            "truncation": [],
        }
        n = 8 if quick else 48
        for _ in range(n):
            spots = [(rng.randrange(32, last), rng.randrange(8)) for _ in range(rng.randint(1, 3))]
            rounds["1-3 bit flips, anywhere but the last frame"].append(("flip", spots))
        for _ in range(4 if quick else 16):
            spot = (rng.randrange(last, size), rng.randrange(8))
            rounds["1 bit flip in the last frame"].append(("flip", [spot]))
            rounds["1 bit flip in the header"].append(
                ("flip", [(rng.randrange(0, 32), rng.randrange(8))])
            )
        for _ in range(8 if quick else 32):
            rounds["truncation"].append(("cut", rng.randrange(32, size)))
        print(f"-wal of a killed writer: {frames} frames, {2 * COMMITS} commits (durability=sync)")
        print(f"{'damage':<46}{'rounds':>7}{'detected':>10}{'whole':>7}{'shorter':>9}")
        for name, damages in rounds.items():
            counts = {"detected": 0, "whole": 0, "silently shorter": 0}
            for damage in damages:
                counts[outcome(original, damage, folder)] += 1
            print(
                f"{name:<46}{len(damages):>7}{counts['detected']:>10}{counts['whole']:>7}"
                f"{counts['silently shorter']:>9}"
            )


if __name__ == "__main__":
    main()
