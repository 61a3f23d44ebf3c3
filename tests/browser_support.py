"""A real headless Chromium (Debian's ``chromium`` and ``chromium-driver``) for the page tests.

Selenium drives the Debian binaries directly (no driver download: that fails offline).
Without them the tests skip with the reason, except under ``CI=true``, where a missing
browser is a failure. The browser is kept off the network: no background services, no
component updates; pages come from ``file://`` or 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import struct
import zlib
from collections.abc import Iterator
from typing import Any

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")


def need_chromium() -> tuple[str, str]:
    """The browser and driver binaries, or skip (fail under CI=true) saying how to install."""
    if CHROMIUM is None or CHROMEDRIVER is None:
        why = "Chromium is not installed (apt-get install -y chromium chromium-driver)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{why}; CI must run the page tests")
        pytest.skip(why)
    pytest.importorskip("selenium", reason="selenium is in the dev extra")
    return CHROMIUM, CHROMEDRIVER


@contextlib.contextmanager
def chromium(width: int = 1200, height: int = 800) -> Iterator[Any]:
    """A headless Chromium under Selenium, closed when the block ends."""
    binary, driver_path = need_chromium()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in (
        "--headless=new",
        "--no-sandbox",  # root in a container
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-default-apps",
        "--disable-sync",
        "--no-first-run",
        "--no-default-browser-check",
        f"--window-size={width},{height}",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def distinct_colours(png: bytes, limit: int = 64) -> int:
    """How many distinct pixel values a PNG screenshot holds (up to ``limit``): a blank page
    has one or two. (A small PNG reader: 8-bit RGB or RGBA, the five row filters.)"""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    at, data, width, channels = 8, b"", 0, 4
    while at < len(png):
        (length,) = struct.unpack(">I", png[at : at + 4])
        kind, body = png[at + 4 : at + 8], png[at + 8 : at + 8 + length]
        if kind == b"IHDR":
            width = struct.unpack(">I", body[:4])[0]
            channels = {2: 3, 6: 4}[body[9]]
        elif kind == b"IDAT":
            data += body
        at += 12 + length
    raw, stride = zlib.decompress(data), width * channels
    previous = bytearray(stride)
    seen: set[bytes] = set()
    for row in range(len(raw) // (stride + 1)):
        start = row * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1 : start + 1 + stride])
        for i in range(stride):
            left = line[i - channels] if i >= channels else 0
            up = previous[i]
            corner = previous[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + left) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + up) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 0xFF
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                best = left if pa <= pb and pa <= pc else up if pb <= pc else corner
                line[i] = (line[i] + best) & 0xFF
        if row % 9 == 0:
            for i in range(0, stride, channels * 3):
                seen.add(bytes(line[i : i + channels]))
            if len(seen) >= limit:
                return len(seen)
        previous = line
    return len(seen)
