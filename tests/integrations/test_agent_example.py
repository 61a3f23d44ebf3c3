"""examples/openai_agent.py completes a booking against a real OpenAI-compatible server on
127.0.0.1 (a scripted agent model speaking the wire format), through the real SDK, offering the
model only the tools the flow admits each turn."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from chat_server import chat_server

pytest.importorskip("openai")

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_the_agent_example_books_a_table_against_a_local_server(backend: str) -> None:
    args = [sys.executable, str(ROOT / "examples" / "openai_agent.py")]
    if backend == "trio":
        args.append("--trio")
    with chat_server() as server:
        env = {
            **os.environ,
            "OPENAI_BASE_URL": server.url,
            "OPENAI_MODEL": "agent",
            "OPENAI_API_KEY": "unused",
        }
        env.pop("AVAILABILITY_URL", None)
        proc = subprocess.run(
            args, capture_output=True, text=True, timeout=120, check=False, env=env
        )
        requests = list(server.requests)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "[tool note_booking: done: noted: 4 people on 2026-12-01]" in out
    assert "agent:  We have 09:00, 09:30, 12:00." in out  # the background lookup's answer
    assert "To confirm: 4 people on 2026-12-01 at 09:30. Is that right?" in out
    assert "[tool book: done:" in out
    assert out.rstrip().endswith('booked: {"booked": true, "reference": "R-1042"}')
    offered = [sorted(t["function"]["name"] for t in r.get("tools") or []) for r in requests]
    assert offered[0] == ["note_booking"]  # the first turn: only what the flow admits
    assert all("book" not in o for o in offered[:4])  # no booking before the read-back


def test_the_agent_example_says_what_to_set_without_a_model() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "openai_agent.py")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )
    assert proc.returncode == 2
    assert "OPENAI_API_KEY" in proc.stdout
