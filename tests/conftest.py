"""Shared fixtures: every ``@pytest.mark.anyio`` test runs on asyncio and on trio."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

# When a property fails, hypothesis's pytest plugin imports its patch writer, which may import
# libcst, which raises a DeprecationWarning at import time; under filterwarnings=error that turns
# the failure report into a pytest INTERNALERROR that hides the failure. Import it now, quietly.
with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    with contextlib.suppress(ImportError):
        import hypothesis.extra._patching  # noqa: F401


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


FRAMEWORKS = Path(__file__).resolve().parent / "frameworks"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--framework",
        action="append",
        default=[],
        help="run the tests of a large framework (pipecat, livekit, ray): each is installed in a "
        "CI step of its own",
    )


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    # tests/frameworks/test_<name>/ is collected only with --framework <name>.
    if FRAMEWORKS in collection_path.parents:
        folder = collection_path.relative_to(FRAMEWORKS).parts[0]
        if folder.startswith("test_") and folder[5:] not in config.getoption("framework"):
            return True
    return None


# Lines a test wants in the run's summary (corpus accuracy, redaction rates): see report().
_REPORTS: list[str] = []


def report(line: str) -> None:
    """Show ``line`` in the terminal summary of the test run."""
    _REPORTS.append(line)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _REPORTS:
        terminalreporter.section("corpus reports")
        for line in _REPORTS:
            terminalreporter.write_line(line)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # One marker for every hypothesis test, wherever it lives: `pytest -m properties`.
    for item in items:
        if getattr(getattr(item, "obj", None), "is_hypothesis_test", False):
            item.add_marker(pytest.mark.properties)


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real redis-server on 127.0.0.1 for the test session (no persistence); each test
    uses call ids of its own (see ``call_id``)."""
    from redis_support import redis_process

    with redis_process(tmp_path_factory.mktemp("redis")) as server:
        yield server.url


@pytest.fixture
def call_id(request: pytest.FixtureRequest) -> str:
    """A call id no other test uses."""
    import uuid

    name = "".join(ch if ch.isalnum() or ch in "_-." else "-" for ch in request.node.name[:40])
    return f"{name}-{uuid.uuid4().hex[:8]}"
