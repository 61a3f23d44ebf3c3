"""pipecat is imported once here, quietly: its modules warn about their own deprecations
(``audioop``), which the test run turns into errors."""

from __future__ import annotations

import warnings

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    import pipecat.processors.aggregators.llm_context
    import pipecat.services.llm_service  # noqa: F401

    import slateflow.integrations.pipecat.testing  # noqa: F401
