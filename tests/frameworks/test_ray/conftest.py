"""One local Ray for the session (``--framework ray``; installed in a CI step of its own).

Ray's servers listen on every interface whatever address they are given, so CI runs these
tests inside a private network namespace (``unshare -n`` with ``lo`` up); the run's summary
says which way they ran.
"""

from __future__ import annotations

import os
import socket
import sys
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    import ray

HERE = str(Path(__file__).resolve().parent)


def network() -> str:
    interfaces = sorted(name for _, name in socket.if_nameindex())  # this namespace's own
    if interfaces == ["lo"]:
        return "in a private network namespace (interfaces: lo)"
    return (
        f"on this machine's network (interfaces: {', '.join(interfaces) or 'unknown'}): Ray's "
        "servers listened on all of them; run under `unshare -n` as .ci/run does"
    )


def pytest_report_header() -> str:
    return f"Ray {ray.__version__}: these tests run {network()}"


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    terminalreporter.write_line(f"Ray {ray.__version__}: these tests ran {network()}")


@pytest.fixture(scope="session", autouse=True)
def ray_cluster() -> Iterator[None]:
    """A local Ray of two CPUs, no dashboard, its files in a temporary directory."""
    temp = tempfile.mkdtemp(prefix="ray")  # short: Ray's socket paths must fit in 107 bytes
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        _temp_dir=temp,
        log_to_driver=False,
        configure_logging=False,
        # The workers import the agents from the test modules, as they would a user's app.
        runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join([HERE, *sys.path])}},
    )
    try:
        yield
    finally:
        ray.shutdown()
