"""``slateflow replay``: the timeline of a durable file, read back the way a person reads it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from slateflow import State
from slateflow.__main__ import main


def record(path: Path) -> None:
    """A short call: a set with provenance, an update, a change, a removal, a transaction."""
    ticks = iter(range(1_750_000_000, 1_750_000_100))
    with State.open(path, clock=lambda: float(next(ticks))) as state:
        state.set("booking:party_size", 4, source="extraction", writer="slots", confidence=0.9)
        state.update({"booking:date": "Saturday", "user:card": "4111 1111 1111 1111"})
        state.set("booking:party_size", 5, source="user", meta={"turn": 3})
        state.remove("booking:date")
        with state.transaction():
            state.set("booking:time", "19:30", source="agent", writer="booker")
            state.set("booking:status", "confirmed", source="agent", writer="booker")


@pytest.fixture
def call(tmp_path: Path) -> Path:
    path = tmp_path / "call.db"
    record(path)
    return path


def replay(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["replay", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_every_commit_in_order_with_old_and_new_values_and_provenance(
    call: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = replay(capsys, str(call))
    assert code == 0
    assert out.splitlines() == [
        f"{call}: seq 1 to 5, 5 commit(s) shown",
        "",
        "seq 1  2025-06-15T15:06:40.000Z  set",
        "  booking:party_size  (new) -> 4  v1  extraction/slots conf 0.9",
        "",
        "seq 2  2025-06-15T15:06:41.000Z  update",
        '  booking:date  (new) -> "Saturday"  v1  user',
        '  user:card  (new) -> "4111 1111 1111 1111"  v1  user',
        "",
        "seq 3  2025-06-15T15:06:42.000Z  set",
        '  booking:party_size  4 -> 5  v2  user {"turn":3}',
        "",
        "seq 4  2025-06-15T15:06:43.000Z  remove",
        '  booking:date  "Saturday" -> (removed)  user',
        "",
        "seq 5  2025-06-15T15:06:44.000Z  commit",
        '  booking:time  (new) -> "19:30"  v1  agent/booker',
        '  booking:status  (new) -> "confirmed"  v1  agent/booker',
    ]


def test_a_range_starts_from_the_state_before_it(
    call: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = replay(capsys, str(call), "--from", "3", "--to", "4")
    assert code == 0
    assert f"{call}: seq 3 to 4, 2 commit(s) shown" in out
    assert "booking:party_size  4 -> 5" in out  # the old value comes from commits 1 and 2
    assert '"Saturday" -> (removed)' in out
    assert "seq 2 " not in out
    assert "seq 5 " not in out


def test_key_globs_keep_only_matching_changes(
    call: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, out, _ = replay(capsys, str(call), "--key", "booking:party_*", "--key", "user:*")
    assert [line.split("  ")[0] for line in out.splitlines() if line.startswith("seq")] == [
        "seq 1",
        "seq 2",
        "seq 3",
    ]
    assert "booking:date" not in out
    assert "user:card" in out


def test_redacted_keys_never_show_their_values(
    call: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, out, _ = replay(capsys, str(call), "--redact", "user:card")
    assert "4111" not in out
    assert "user:card  (new) -> ***  v1  user" in out
    _, out, _ = replay(capsys, str(call), "--redact", "user:*", "--json")
    assert "4111" not in out


def test_json_lines_for_tools(call: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = replay(capsys, str(call), "--json")
    commits = [json.loads(line) for line in out.splitlines()]
    assert [c["seq"] for c in commits] == [1, 2, 3, 4, 5]
    assert commits[0]["at"] == "2025-06-15T15:06:40.000+00:00"
    assert commits[2]["changes"] == [
        {
            "key": "booking:party_size",
            "old": 4,
            "new": 5,
            "created": False,
            "removed": False,
            "version": 2,
            "source": "user",
            "writer": None,
            "confidence": None,
            "meta": {"turn": 3},
        }
    ]
    assert commits[3]["changes"][0]["removed"] is True


def test_long_values_are_shortened_unless_full(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "long.db"
    with State.open(path) as state:
        state.set("turn:transcript", "word " * 100)
    _, out, _ = replay(capsys, str(path))
    assert "…" in out
    assert len(max(out.splitlines(), key=len)) < 120
    _, out, _ = replay(capsys, str(path), "--full")
    assert "…" not in out
    assert ("word " * 100).strip() in out


def test_a_compacted_file_says_where_its_history_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "compacted.db"
    with State.open(path) as state:
        state.set("a", 1)
        state.set("b", 2)
        state.compact()
        state.set("a", 3)
    _, out, _ = replay(capsys, str(path))
    assert "(history up to seq 2 was compacted: the file starts from the 2 key(s)" in out
    assert "a  1 -> 3  v2  user" in out  # the old value comes from the compacted base


def test_a_missing_file_is_an_error_and_is_not_created(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "nope.db"
    code, out, err = replay(capsys, str(path))
    assert code == 2
    assert out == ""
    assert "no store at" in err
    assert str(path) in err
    assert not path.exists()


@pytest.mark.parametrize("content", [b"not a database", b"x"])
def test_a_file_that_is_not_a_store_is_an_error_and_left_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes
) -> None:
    path = tmp_path / "other.db"
    path.write_bytes(content)
    code, _, err = replay(capsys, str(path))
    assert code == 2
    assert str(path) in err
    assert "not a SQLite file" in err
    assert "Traceback" not in err
    assert path.read_bytes() == content


def test_a_backwards_range_is_an_error(call: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = replay(capsys, str(call), "--from", "4", "--to", "2")
    assert code == 2
    assert "not a range" in err


def test_the_command_line_runs(call: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "slateflow", "replay", str(call), "--key", "booking:status"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert '  booking:status  (new) -> "confirmed"  v1  agent/booker' in proc.stdout
