"""livekit-agents is imported once here, quietly: its modules may warn about their own
deprecations at import time, which the test run turns into errors."""

from __future__ import annotations

import warnings

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    import livekit.agents  # noqa: F401

    import slateflow.integrations.livekit.testing  # noqa: F401
