"""A page as a person sees it: Debian's Chromium, headless, renders it; we get the DOM it
built, every console message it logged, and a screenshot, with the share of the picture
that is not background."""

from __future__ import annotations

import shutil
import subprocess
import zlib
from dataclasses import dataclass
from pathlib import Path

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
MISSING = ("Debian's chromium is not installed (apt-get install chromium); .ci/run installs "
           "it, so CI runs these")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         "--no-first-run", "--disable-extensions", "--window-size=1280,1600"]


@dataclass(frozen=True)
class Seen:
    dom: str
    console: list[str]  # every console message (these pages have no script: none expected)
    screenshot: Path
    inked: int  # different byte values in its pixel data: a blank page has a handful


def render(page: Path, screenshot: Path) -> Seen:
    url = page.resolve().as_uri()
    dumped = subprocess.run([CHROMIUM, *FLAGS, "--enable-logging=stderr", "--v=0",
                             "--dump-dom", url], capture_output=True, text=True, timeout=90)
    shot = subprocess.run([CHROMIUM, *FLAGS, f"--screenshot={screenshot}", url],
                          capture_output=True, text=True, timeout=90)
    assert shot.returncode == 0 and screenshot.exists(), shot.stderr[-2000:]
    console = [line for line in dumped.stderr.splitlines() if ":CONSOLE" in line]
    return Seen(dumped.stdout, console, screenshot, inked(screenshot))


def inked(png: Path) -> int:
    """How many different byte values the screenshot's pixel data holds, as PNG stores it
    (each row filtered against the one above): a blank page gives a handful, a drawn one
    well over a hundred."""
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    at, idat = 8, b""
    while at < len(data):
        length = int.from_bytes(data[at:at + 4], "big")
        if data[at + 4:at + 8] == b"IDAT":
            idat += data[at + 8:at + 8 + length]
        at += 12 + length
    return len(set(zlib.decompress(idat)))
