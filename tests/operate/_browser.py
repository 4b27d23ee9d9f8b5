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


def png_rows(data: bytes) -> tuple[int, int, int, list[bytes]]:
    """Decode an 8-bit RGB/RGBA non-interlaced PNG (what Chromium writes): width, height,
    bytes per pixel, and each row's bytes, unfiltered."""
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
    prev = bytes(stride)
    rows: list[bytes] = []
    for y in range(height):
        ftype = raw[y * (stride + 1)]
        line = raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)]
        prev = _unfilter(ftype, line, prev, channels)
        rows.append(prev)
    return width, height, channels, rows


def _add(a: int, b: int, low: int, high: int) -> int:
    """The byte-by-byte sum (mod 256) of two rows held as integers, no carry between bytes:
    the low 7 bits of each byte add, the top bit is their xor."""
    return ((a & low) + (b & low)) ^ ((a ^ b) & high)


def _unfilter(ftype: int, line: bytes, prev: bytes, channels: int) -> bytes:
    """One row with PNG filter ``ftype`` undone (the row above: ``prev``). None and Up,
    most of Chromium's rows, and Sub are whole-row integer sums (Sub a prefix sum in
    log2(width) of them); Average and Paeth go byte by byte."""
    size = len(line)
    if ftype == 0:
        return line
    if ftype in (1, 2):
        low = int.from_bytes(b"\x7f" * size, "little")
        high = int.from_bytes(b"\x80" * size, "little")
        row = int.from_bytes(line, "little")
        if ftype == 2:
            row = _add(row, int.from_bytes(prev, "little"), low, high)
        else:  # each byte plus the whole-pixel prefix before it
            full = (1 << (8 * size)) - 1
            shift = channels
            while shift < size:
                row = _add(row, (row << (8 * shift)) & full, low, high)
                shift *= 2
        return row.to_bytes(size, "little")
    out = bytearray(line)
    for i in range(size):
        a = out[i - channels] if i >= channels else 0
        b = prev[i]
        if ftype == 3:
            out[i] = (out[i] + (a + b) // 2) & 0xFF
        else:
            c = prev[i - channels] if i >= channels else 0
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
            out[i] = (out[i] + pred) & 0xFF
    return bytes(out)


def share_near(data: bytes, rgb: tuple[int, int, int], tol: int = 6) -> float:
    """The share of a PNG's pixels whose R, G and B are each within ``tol`` of ``rgb``.

    Counted a whole channel at a time: each channel's bytes map to 1 (near) or 0, and a
    pixel counts when its three are 1."""
    width, height, channels, rows = png_rows(data)
    raw = b"".join(rows)
    near = -1  # every bit set: the first channel's flags pass as they are
    for k, want in enumerate(rgb):
        table = bytes(int(abs(v - want) <= tol) for v in range(256))
        near &= int.from_bytes(raw[k::channels].translate(table), "little")
    return near.bit_count() / (width * height)


def share(path: Path) -> None:
    """Copy a screenshot to ``$STEPSTONE_SCREENSHOTS`` (how docs/img is refreshed)."""
    target = os.environ.get("STEPSTONE_SCREENSHOTS")
    if target:
        shutil.copy(path, Path(target) / path.name)
