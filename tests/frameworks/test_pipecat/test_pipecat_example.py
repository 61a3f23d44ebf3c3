"""``examples/pipecat_booking.py`` runs offline (no keys, no audio) and says what happened."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_the_pipecat_example_books_once_and_hangs_up_after_the_goodbye() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "pipecat_booking.py")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "To confirm: Saturday at 19:00 for 4. Shall I book it?" in out
    assert out.rstrip().splitlines()[-3:] == [
        "  bot:    You're all booked. Thank you for calling, goodbye!",
        "booked: 1 time(s); the call is over: True",
        "the bot spoke over the caller: 0 time(s)",
    ]
