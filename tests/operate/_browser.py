"""Headless Chromium for the inspector tests: Debian's chromium driven by Playwright.

The browser is the system one (``/usr/bin/chromium``, installed with apt when missing and
we are root); Playwright never downloads one. Outside CI, a machine without them skips
with the reason; under ``CI=true`` the tests fail instead.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests._missing import missing

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def chromium_or_skip(path: str = CHROMIUM) -> str:
    """The path of a system Chromium (``path``), installing Debian's package when it is
    the system one, missing, and we are root."""
    if not Path(path).exists() and path == CHROMIUM and _can_install():
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True, timeout=600)
        subprocess.run(
            ["apt-get", "install", "-y", "-qq", "chromium"],
            env=env,
            capture_output=True,
            timeout=1200,
        )
    if not Path(path).exists():
        missing("the browser tests", f"no Chromium at {path} (install Debian's `chromium` package)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing("the browser tests", "the playwright package is missing (pip install -e '.[dev]')")
    return path


def _can_install() -> bool:
    return os.geteuid() == 0 and shutil.which("apt-get") is not None


def launch() -> Iterator[Any]:
    """A headless Chromium browser (Playwright's ``Browser``), closed afterwards."""
    executable = chromium_or_skip()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=executable, headless=True, args=ARGS)
        try:
            yield browser
        finally:
            browser.close()


def png_pixels(data: bytes) -> tuple[int, int, list[tuple[int, int, int]]]:
    """Decode an 8-bit RGB/RGBA non-interlaced PNG (what Chromium writes): w, h, pixels."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat = 8, b""
    width = height = channels = 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        ctype, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if ctype == b"IHDR":
            width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and color in (2, 6) and interlace == 0, (depth, color)
            channels = 3 if color == 2 else 4
        elif ctype == b"IDAT":
            idat += body
    raw = zlib.decompress(idat)
    stride = width * channels
    prev = bytearray(stride)
    pixels: list[tuple[int, int, int]] = []
    for y in range(height):
        ftype = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - channels] if i >= channels else 0
            b = prev[i]
            c = prev[i - channels] if i >= channels else 0
            if ftype == 1:
                line[i] = (line[i] + a) & 0xFF
            elif ftype == 2:
                line[i] = (line[i] + b) & 0xFF
            elif ftype == 3:
                line[i] = (line[i] + (a + b) // 2) & 0xFF
            elif ftype == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                line[i] = (line[i] + pred) & 0xFF
        pixels.extend((line[x], line[x + 1], line[x + 2]) for x in range(0, stride, channels))
        prev = line
    return width, height, pixels


def share(path: Path) -> None:
    """Copy a screenshot to ``$STEPSTONE_SCREENSHOTS`` (how docs/img is refreshed)."""
    target = os.environ.get("STEPSTONE_SCREENSHOTS")
    if target:
        shutil.copy(path, Path(target) / path.name)
