"""A damaged write-ahead log is refused, not silently cut short: after a writer was killed, its
-wal holds the newest commits; a flipped bit in any frame but the last, or in the log's header,
makes opening raise StoreCorruptError naming where, and a salvage open keeps what comes before
the damage. (bench/wal_bench.py measures random rounds of each kind of damage.)"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slateflow import State
from slateflow.errors import StoreCorruptError
from slateflow.stores.sqlite import SQLiteStore

pytestmark = pytest.mark.crash

COMMITS = 20
FRAME = 24 + 4096
WRITER = """
import os, signal, sys
from slateflow import State
state = State.open(sys.argv[1], durability="sync")
for i in range({n}):
    state.set("call:step", i)
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.fixture(scope="module")
def killed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("killed") / "call.db"
    run = subprocess.run([sys.executable, "-c", WRITER.format(n=COMMITS), str(path)], check=False)
    assert run.returncode == -signal.SIGKILL
    return path


def damaged(killed: Path, tmp_path: Path, flip_at: int | None = None) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    copy = tmp_path / "call.db"
    shutil.copyfile(killed, copy)
    wal = bytearray(Path(f"{killed}-wal").read_bytes())
    if flip_at is not None:
        wal[flip_at] ^= 0x10
    Path(f"{copy}-wal").write_bytes(bytes(wal))
    return copy


def frames(path: Path) -> int:
    return (Path(f"{path}-wal").stat().st_size - 32) // FRAME


def test_an_intact_log_of_a_killed_writer_opens_whole(killed: Path, tmp_path: Path) -> None:
    with State.open(damaged(killed, tmp_path)) as state:
        assert state.get("call:step") == COMMITS - 1
        assert state.journal.cursor == COMMITS


def test_a_flipped_bit_in_a_middle_frame_is_refused_naming_the_frame(
    killed: Path, tmp_path: Path
) -> None:
    n = frames(killed) // 2
    copy = damaged(killed, tmp_path, flip_at=32 + n * FRAME + 24 + 100)  # in frame n + 1's page
    before = (copy.read_bytes(), Path(f"{copy}-wal").read_bytes())
    with pytest.raises(StoreCorruptError, match=rf"damaged at frame {n + 1} of") as raised:
        State.open(copy)
    assert "salvage=True" in str(raised.value)
    assert (copy.read_bytes(), Path(f"{copy}-wal").read_bytes()) == before  # left as it was
    with State.open(damaged(killed, tmp_path / "again", flip_at=None)) as whole:
        assert whole.journal.cursor == COMMITS


def test_a_flipped_bit_in_the_log_header_is_refused(killed: Path, tmp_path: Path) -> None:
    for at in (3, 10, 18, 27):  # magic, page size, salt, checksum
        with pytest.raises(StoreCorruptError, match="damaged at its header"):
            State.open(damaged(killed, tmp_path / str(at), flip_at=at))


def test_a_salvage_open_keeps_the_commits_before_the_damage(killed: Path, tmp_path: Path) -> None:
    n = frames(killed) // 2
    copy = damaged(killed, tmp_path, flip_at=32 + n * FRAME + 24 + 100)
    with State(store=SQLiteStore(copy, salvage=True)) as state:
        assert 0 < state.journal.cursor < COMMITS  # the history ends before the damage
    assert Path(f"{copy}-wal.damaged").exists()  # the damaged log is kept


def test_a_refused_open_lets_the_file_go_so_a_salvage_open_follows(
    killed: Path, tmp_path: Path
) -> None:
    copy = damaged(killed, tmp_path, flip_at=32 + (frames(killed) // 2) * FRAME + 24 + 7)
    with pytest.raises(StoreCorruptError):
        State.open(copy)
    with State(store=SQLiteStore(copy, salvage=True)) as state:  # not "locked by this process"
        assert state.journal.cursor < COMMITS


def test_a_file_refused_as_no_store_is_refused_the_same_way_twice(tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    path.write_bytes(b"not a database, just notes\n" * 200)
    for _ in range(2):  # the first refusal left no lock behind
        with pytest.raises(StoreCorruptError, match="not a SQLite file"):
            State.open(path)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_any_bit_flipped_before_the_last_frame_is_refused(
    killed: Path, tmp_path: Path, data: st.DataObject
) -> None:
    last = 32 + (frames(killed) - 1) * FRAME
    at = data.draw(st.integers(0, last - 1), label="byte")
    bit = data.draw(st.integers(0, 7), label="bit")
    copy = damaged(killed, tmp_path / f"{at}-{bit}")
    wal = Path(f"{copy}-wal")
    raw = bytearray(wal.read_bytes())
    raw[at] ^= 1 << bit
    wal.write_bytes(bytes(raw))
    with pytest.raises(StoreCorruptError, match="write-ahead log"):
        State.open(copy)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_a_log_cut_short_opens_as_a_prefix_of_the_history(
    killed: Path, tmp_path: Path, data: st.DataObject
) -> None:
    size = Path(f"{killed}-wal").stat().st_size
    cut = data.draw(st.integers(0, size), label="cut")
    copy = damaged(killed, tmp_path / str(cut))
    wal = Path(f"{copy}-wal")
    wal.write_bytes(wal.read_bytes()[:cut])
    with State.open(copy) as state:
        n = state.journal.cursor
        assert 0 <= n <= COMMITS
        assert state.get("call:step", None) == (n - 1 if n else None)  # exactly commits 1..n
