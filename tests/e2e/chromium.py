"""Headless Debian chromium driven by selenium through the system chromedriver.

Selenium Manager is never asked to download a browser or a driver: both paths
are given, so the tests run offline against the packages installed by apt.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.support.wait import WebDriverWait

CHROME_FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--disable-extensions",
)


def find_chromium() -> tuple[str | None, str | None]:
    """(chromium binary, chromedriver binary), each ``None`` when not installed."""
    return shutil.which("chromium") or shutil.which("chromium-browser"), shutil.which("chromedriver")


@contextmanager
def open_chromium(
    chrome: str, driver: str, width: int = 1600, height: int = 1200
) -> Iterator[webdriver.Chrome]:
    """One headless Chromium session with a throw-away profile."""
    profile = tempfile.mkdtemp(prefix="steadytune-chrome-")
    options = webdriver.ChromeOptions()
    options.binary_location = chrome
    for flag in (*CHROME_FLAGS, f"--window-size={width},{height}", f"--user-data-dir={profile}"):
        options.add_argument(flag)
    try:
        browser = webdriver.Chrome(options=options, service=Service(executable_path=driver))
    except Exception:
        shutil.rmtree(profile, ignore_errors=True)
        raise
    try:
        yield browser
    finally:
        browser.quit()
        shutil.rmtree(profile, ignore_errors=True)


def wait_js(browser: webdriver.Chrome, script: str, timeout: float = 15.0, interval: float = 0.1) -> Any:
    """Poll a JS expression (``return ...``) until it is truthy; returns its value."""
    return WebDriverWait(browser, timeout, poll_frequency=interval).until(
        lambda d: d.execute_script(script), message=f"timed out waiting for: {script}"
    )


def screenshot(browser: webdriver.Chrome, path: Path) -> Path:
    """Save a PNG of the window at ``path`` (folders made) and return the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not browser.save_screenshot(str(path)):
        raise RuntimeError(f"chromium could not write a screenshot to {path}")
    return path
