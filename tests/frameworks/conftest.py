"""The tests of large frameworks (pipecat and LiveKit, asyncio-only; Ray): each is installed in
its own CI step, so these run only when asked: ``pytest tests/frameworks/test_pipecat
--framework pipecat``."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
