"""``examples/livekit_booking.py`` runs offline (no keys, no room) and says what happened."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_the_livekit_example_books_once_and_hangs_up_after_the_goodbye() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "livekit_booking.py")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "tool book_table: Refused: 'book_table' is not permitted yet" in out
    assert "agent: Good news, that time is free." in out
    assert out.rstrip().splitlines()[-2:] == [
        "  agent: You're all booked. Thank you for calling, goodbye!",
        "booked: 1 time(s); the call is over: True",
    ]
