"""``slateflow replay``: the timeline of a durable file, read back the way a person reads it."""

from __future__ import annotations

import io
import json
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

import pytest

from slateflow import State
from slateflow.__main__ import main
from slateflow.replay import render, replay, timeline
from slateflow.state.policy import Policy, Rule
from slateflow.stores import MemoryStore, SQLiteStore


def record(path: Path) -> None:
    """A short call: a set with provenance, an update, a change, a removal, a transaction."""
    ticks = iter(range(1_750_000_000, 1_750_000_100))
    with State.open(path, clock=lambda: float(next(ticks))) as state:
        state.set("booking:party_size", 4, source="extraction", writer="slots", confidence=0.9)
        state.update({"booking:date": "Saturday", "user:card": "4111 1111 1111 1111"})
        state.set("booking:party_size", 5, source="user", meta={"turn": 3}, confidence=1.0)
        state.remove("booking:date")
        with state.transaction():
            state.set("booking:time", "19:30", source="agent", writer="booker")
            state.set("booking:status", "confirmed", source="agent", writer="booker")


@pytest.fixture
def call(tmp_path: Path) -> Path:
    path = tmp_path / "call.db"
    record(path)
    return path


def compacted(path: Path) -> Path:
    """Three keys compacted at seq 3, then two more commits."""
    ticks = iter(range(1_750_000_000, 1_750_000_100))
    with State.open(path, clock=lambda: float(next(ticks))) as state:
        state.set("user:name", "Ada", source="extraction", writer="slots", confidence=0.8)
        state.set("user:card", "4111 1111 1111 1111")
        state.set("booking:time", "19:00")
        assert state.journal.compact() == 3
        state.set("booking:time", "19:30", source="user", writer="caller")
        state.remove("user:card")
    return path


def replay_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["replay", *args])
    out, err = capsys.readouterr()
    return code, out, err


def seqs(out: str) -> list[int]:
    return [int(line.split()[1]) for line in out.splitlines() if line.startswith("seq ")]


# -- the timeline ----------------------------------------------------------------------------


def test_every_commit_in_order_with_old_and_new_values_and_provenance(
    call: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = replay_cli(capsys, str(call))
    assert (code, err) == (0, "")
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
        # confidence 1.0 is the default certainty: not shown
        '  booking:party_size  4 -> 5  v2  user {"turn":3}',
        "",
        "seq 4  2025-06-15T15:06:43.000Z  remove",
        '  booking:date  "Saturday" -> (removed)  user',
        "",
        "seq 5  2025-06-15T15:06:44.000Z  commit",
        '  booking:time  (new) -> "19:30"  v1  agent/booker',
        '  booking:status  (new) -> "confirmed"  v1  agent/booker',
    ]


def test_times_are_utc_and_cut_not_rounded_to_the_millisecond() -> None:
    store = MemoryStore()  # any Store: the timeline reads the seam, not SQLite
    store.append((1, 1_750_000_000_999_999_999, "set", (("a", 1, 1, "user", None, None, None),)))
    found = timeline(store)
    assert found.commits[0].at.isoformat() == "2025-06-15T15:06:40.999999+00:00"
    assert "seq 1  2025-06-15T15:06:40.999Z  set" in list(render(found, "mem"))


def test_a_range_starts_from_the_state_before_it(
    call: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = replay_cli(capsys, str(call), "--from", "3", "--to", "4")
    assert code == 0
    assert out.startswith(f"{call}: seq 3 to 4, 2 commit(s) shown\n")
    assert seqs(out) == [3, 4]
    assert "booking:party_size  4 -> 5" in out  # the old value comes from commits 1 and 2
    assert '"Saturday" -> (removed)' in out
    _, one, _ = replay_cli(capsys, str(call), "--from", "4", "--to", "4")
    assert seqs(one) == [4]


def test_a_range_past_the_newest_commit_says_so(
    call: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = replay_cli(capsys, str(call), "--from", "9")
    assert code == 0
    assert out == f"{call}: no commits from seq 9: the newest is seq 5\n"
    _, out, _ = replay_cli(capsys, str(call), "--from", "4", "--to", "99")
    assert out.startswith(f"{call}: seq 4 to 5, 2 commit(s) shown\n")


def test_key_globs_keep_only_matching_changes(
    call: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, out, _ = replay_cli(capsys, str(call), "--key", "booking:party_*", "--key", "user:*")
    assert seqs(out) == [1, 2, 3]  # commits 4 and 5 touch no matching key
    assert out.startswith(f"{call}: seq 1 to 5, 3 commit(s) shown\n")
    assert "booking:date" not in out
    assert '  user:card  (new) -> "4111 1111 1111 1111"  v1  user' in out
    _, out, _ = replay_cli(capsys, str(call), "--key", "nothing:*")
    assert seqs(out) == []


def test_redacted_keys_never_show_their_values(
    call: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, out, _ = replay_cli(capsys, str(call), "--redact", "user:card")
    assert "4111 1111" not in out
    assert "  user:card  (new) -> ***  v1  user" in out
    _, out, _ = replay_cli(capsys, str(call), "--redact", "user:*", "--json")
    assert "4111 1111" not in out
    change = json.loads(out.splitlines()[1])["changes"][1]
    assert (change["key"], change["old"], change["new"]) == ("user:card", None, "***")


def test_a_policy_s_secret_keys_are_masked_from_python(call: Path) -> None:
    # The file does not record which keys are secret (policies are code); Python callers can
    # hand replay the same policy the State used.
    policy = Policy([Rule("user:card", secret=True)])
    lines = replay(call, secret=policy.is_secret, keys="user:card")  # one glob, as a str
    assert "  user:card  (new) -> ***  v1  user" in lines
    assert not any("4111 1111" in line for line in lines)


def test_json_lines_for_tools(call: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = replay_cli(capsys, str(call), "--json")
    commits = [json.loads(line) for line in out.splitlines()]
    assert [c["seq"] for c in commits] == [1, 2, 3, 4, 5]
    assert {c["kind"] for c in commits} == {"commit"}
    assert commits[0]["at"] == "2025-06-15T15:06:40.000+00:00"
    assert commits[0]["at_ns"] == 1_750_000_000 * 10**9
    assert commits[0]["origin"] == "set"
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
            "confidence": 1.0,
            "meta": {"turn": 3},
        }
    ]
    removal = commits[3]["changes"][0]
    assert (removal["old"], removal["new"], removal["removed"]) == ("Saturday", None, True)
    assert commits[0]["changes"][0]["created"] is True
    _, ranged, _ = replay_cli(capsys, str(call), "--json", "--from", "3", "--key", "booking:*")
    assert [json.loads(line)["seq"] for line in ranged.splitlines()] == [3, 4, 5]


def test_long_values_are_shortened_unless_full(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "long.db"
    with State.open(path) as state:
        state.set("turn:transcript", "word " * 100, meta={"note": "x" * 200})
    _, out, _ = replay_cli(capsys, str(path))
    line = out.splitlines()[-1]
    assert line.count("…") == 2  # the value and the meta
    assert len(line) < 160
    _, out, _ = replay_cli(capsys, str(path), "--full")
    assert "…" not in out
    assert ("word " * 100).strip() in out
    assert "x" * 200 in out


def test_unprintable_characters_are_escaped_not_sent_to_the_terminal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "odd.db"
    with State.open(path) as state:
        state.set("note", "a\x1b[2Jb\u202ec\ud800d é")  # ANSI, bidi override, lone surrogate
    code, out, _ = replay_cli(capsys, str(path))
    assert code == 0
    assert '  note  (new) -> "a\\u001b[2Jb\\u202ec\\ud800d é"  v1  user' in out
    assert "\x1b" not in out
    _, out, _ = replay_cli(capsys, str(path), "--json")
    assert json.loads(out)["changes"][0]["new"] == "a\x1b[2Jb\u202ec\ud800d é"


def test_an_output_that_cannot_encode_a_value_gets_escapes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "name.db"
    with State.open(path) as state:
        state.set("name", "Zoë")
    buffer = io.BytesIO()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(buffer, encoding="ascii"))
    assert main(["replay", str(path)]) == 0
    assert '  name  (new) -> "Zo\\xeb"  v1  user' in buffer.getvalue().decode("ascii")


# -- compacted files -------------------------------------------------------------------------


def test_a_compacted_file_lists_what_it_starts_from(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = compacted(tmp_path / "compacted.db")
    _, out, _ = replay_cli(capsys, str(path))
    assert out.splitlines() == [
        f"{path}: seq 1 to 5, 2 commit(s) shown",
        "(history up to seq 3 was compacted: the file starts from these 3 key(s), as they "
        "were then)",
        '  booking:time  "19:00"  v1  user  (seq 3)',
        '  user:card  "4111 1111 1111 1111"  v1  user  (seq 2)',
        '  user:name  "Ada"  v1  extraction/slots conf 0.8  (seq 1)',
        "",
        "seq 4  2025-06-15T15:06:43.000Z  set",
        '  booking:time  "19:00" -> "19:30"  v2  user/caller',  # old value from the base
        "",
        "seq 5  2025-06-15T15:06:44.000Z  remove",
        '  user:card  "4111 1111 1111 1111" -> (removed)  user',
    ]


def test_a_compacted_base_obeys_quiet_key_and_redact(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = compacted(tmp_path / "compacted.db")
    _, out, _ = replay_cli(capsys, str(path), "--quiet-base")
    assert "(history up to seq 3 was compacted: the file starts from the 3 key(s) as they" in out
    assert "Ada" not in out
    _, out, _ = replay_cli(capsys, str(path), "--key", "user:*", "--redact", "user:card")
    assert "these 3 key(s), 2 shown" in out
    assert "  user:card  ***  v1  user  (seq 2)" in out
    assert "  user:card  *** -> (removed)  user" in out
    assert "booking:time" not in out
    assert "4111 1111" not in out


def test_a_compacted_base_in_json_is_one_line_before_the_commits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = compacted(tmp_path / "compacted.db")
    _, out, _ = replay_cli(capsys, str(path), "--json", "--redact", "user:card")
    base, *commits = [json.loads(line) for line in out.splitlines()]
    assert (base["kind"], base["seq"], base["size"]) == ("base", 3, 3)
    assert [(e["key"], e["value"]) for e in base["entries"]] == [
        ("booking:time", "19:00"),
        ("user:card", "***"),
        ("user:name", "Ada"),
    ]
    assert [(c["kind"], c["seq"]) for c in commits] == [("commit", 4), ("commit", 5)]


def test_a_range_after_the_compaction_does_not_repeat_the_base(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = compacted(tmp_path / "compacted.db")
    _, out, _ = replay_cli(capsys, str(path), "--from", "5")
    assert "history up to" not in out
    assert seqs(out) == [5]
    assert '"4111 1111 1111 1111" -> (removed)' in out  # the old value is still right
    _, out, _ = replay_cli(capsys, str(path), "--from", "2", "--to", "4")
    assert "history up to seq 3 was compacted" in out  # seq 2 is gone: say where it starts
    assert seqs(out) == [4]


# -- files that are not what they should be --------------------------------------------------


def test_a_missing_file_is_an_error_and_is_not_created(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "nope.db"
    code, out, err = replay_cli(capsys, str(path))
    assert (code, out) == (2, "")
    assert err == (
        f"slateflow replay: no store at '{path}': give the path of a file State.open wrote\n"
    )
    assert list(tmp_path.iterdir()) == []  # no file, no -wal, no -lock


def test_a_directory_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = replay_cli(capsys, str(tmp_path))
    assert code == 2
    assert f"'{tmp_path}' is not a file" in err


def other_sqlite(path: Path) -> None:
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("CREATE TABLE t (x)")
        conn.commit()


def edited(sql: str) -> Callable[[Path], None]:
    def make(path: Path) -> None:
        with State.open(path) as state:
            state.set("a", 1)
            state.set("b", 2)
            state.set("c", 3)
        with closing(sqlite3.connect(path)) as conn:
            conn.execute(sql)
            conn.commit()
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    return make


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda p: p.write_bytes(b"not a database"), "not a SQLite file"),
        (lambda p: p.write_bytes(b"x"), "not a SQLite file"),
        (lambda p: p.write_bytes(b""), "is empty, not a slateflow store"),
        (lambda p: p.write_bytes(b"SQLite format 3\x00" + b"\x00" * 200), "not a readable"),
        (other_sqlite, "a SQLite file but not a slateflow store"),
        (edited("UPDATE commits SET changes = '[1,2' WHERE seq = 2"), "commit 2 does not match"),
        (edited("DELETE FROM commits WHERE seq = 2"), "commit 2 is missing"),
        (edited("UPDATE meta SET value = '99' WHERE name = 'version'"), "upgrade slateflow"),
    ],
    ids=["garbage", "one-byte", "empty", "bad-sqlite", "other-db", "bad-json", "gap", "newer"],
)
def test_a_file_that_is_not_a_readable_store_is_an_error_and_left_alone(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    make: Callable[[Path], None],
    says: str,
) -> None:
    path = tmp_path / "other.db"
    make(path)
    content = path.read_bytes()
    code, out, err = replay_cli(capsys, str(path))
    assert (code, out) == (2, "")
    assert err.startswith("slateflow replay: ")
    assert err.count("\n") == 1  # one line, no traceback
    assert str(path) in err
    assert says in err
    assert path.read_bytes() == content


def test_replay_leaves_a_store_file_as_it_was(
    call: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    content, stamp = call.read_bytes(), call.stat().st_mtime_ns
    assert replay_cli(capsys, str(call))[0] == 0
    assert (call.read_bytes(), call.stat().st_mtime_ns) == (content, stamp)
    with State.open(call) as again:  # no lock left behind: a writer can open it
        assert again.get("booking:status") == "confirmed"


def test_replay_leaves_no_files_beside_a_closed_store(
    call: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = sorted(call.parent.iterdir())
    assert replay_cli(capsys, str(call))[0] == 0
    assert sorted(call.parent.iterdir()) == before


def test_a_range_that_is_not_one_is_an_error(
    call: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = replay_cli(capsys, str(call), "--from", "4", "--to", "2")
    assert code == 2
    assert err == (
        "slateflow replay: --from 4 --to 2 is not a range of commits: give 1 <= from <= to\n"
    )
    with pytest.raises(SystemExit) as exc:
        main(["replay", str(call), "--from", "0"])
    assert exc.value.code == 2
    assert "0 is not a commit seq (seqs start at 1)" in capsys.readouterr().err


def test_a_file_being_written_can_be_read(tmp_path: Path) -> None:
    path = tmp_path / "live.db"
    with State.open(path) as state:
        state.set("a", 1)
        state.sync()
        assert replay(path)[-1] == "  a  (new) -> 1  v1  user"
        state.set("a", 2)
        state.sync()
        assert replay(path)[-1] == "  a  1 -> 2  v2  user"
        store = SQLiteStore(path, readonly=True)
        try:
            assert [c.seq for c in timeline(store).commits] == [1, 2]
        finally:
            store.close()


# -- the installed command -------------------------------------------------------------------


def test_the_command_line_runs(call: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "slateflow", "replay", str(call), "--key", "booking:status"],
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert proc.stdout.splitlines()[-2:] == [
        "seq 5  2025-06-15T15:06:44.000Z  commit",
        '  booking:status  (new) -> "confirmed"  v1  agent/booker',
    ]


def test_a_masked_keys_provenance_meta_is_masked_too(tmp_path: Path) -> None:
    path = tmp_path / "meta.db"
    with State.open(path) as state:
        state.set("pay:result", "declined", source="tool", meta={"card": "4111 1111"})
        state.set("pay:note", "ok", source="tool", meta={"shown": "yes"})
    lines = replay(path, secret=Policy([Rule("pay:result", secret=True)]).is_secret)
    text = "\n".join(lines)
    assert "4111 1111" not in text
    assert '"card":"***"' in text.replace(" ", "")
    assert "yes" in text  # another key's meta is shown as written


def test_replay_masks_the_keys_the_state_declared_secret_unless_asked(tmp_path: Path) -> None:
    path = tmp_path / "call.db"
    state = State.open(path)
    state.set("patient:dob", "1985-03-03")
    state.policy("patient:*", secret=True)  # declared after a value was written
    state.set("patient:dob", "1985-03-04")
    state.set("booking:slot", "Tuesday")
    state.close()
    shown = "\n".join(replay(path))
    assert "1985" not in shown  # the file records which keys are secret: masked by default
    assert '"Tuesday"' in shown
    assert "policy:secret" in shown
    revealed = "\n".join(replay(path, show_secrets=True))
    assert '"1985-03-03" -> "1985-03-04"' in revealed
