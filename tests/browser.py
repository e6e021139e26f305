"""Headless Chromium for the tests that check a page as a user sees it (the run report, Ray's
dashboard). A missing Chromium is a failure: `apt-get install -y chromium` (tests/machine.sh)."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.fail("headless Chromium is needed to open the pages under test: "
                    "`apt-get install -y chromium` (Debian; .ci/run installs it)")
    return path


def run_chromium(tmp_path: Path, *args: str) -> str:
    """Headless Chromium with a throwaway profile; its stdout (a DOM dump with --dump-dom)."""
    command = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
               "--disable-extensions", "--disable-background-networking", "--disable-component-update",
               f"--user-data-dir={tmp_path / 'chromium-profile'}", *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def page_text(dom: str) -> str:
    """A DOM dump's text, tags removed and spaces collapsed."""
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", dom))
