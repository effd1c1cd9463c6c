"""A minimal W3C WebDriver client for Debian's chromium + chromedriver (stdlib only).

Enough to open a page, run JavaScript, wait for a condition and take a
screenshot. Traffic goes only to the local chromedriver on 127.0.0.1.
"""

from __future__ import annotations

import base64
import json
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

CHROME_FLAGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--disable-extensions",
    "--window-size=1600,1200",
]


def find_chromium() -> tuple[str | None, str | None]:
    """(chromium binary, chromedriver binary), each ``None`` when not installed."""
    chrome = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    return chrome, driver


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Browser:
    """One headless Chromium session, driven through chromedriver."""

    def __init__(self, chrome: str, driver: str, width: int = 1600, height: int = 1200) -> None:
        self.port = _free_port()
        self.profile = tempfile.mkdtemp(prefix="steadytune-chrome-")
        self.proc = subprocess.Popen(
            [driver, f"--port={self.port}", "--allowed-ips=127.0.0.1"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.base = f"http://127.0.0.1:{self.port}"
        self._wait_ready()
        flags = [f for f in CHROME_FLAGS if not f.startswith("--window-size")]
        caps = {
            "capabilities": {
                "alwaysMatch": {
                    "browserName": "chrome",
                    "goog:chromeOptions": {
                        "binary": chrome,
                        "args": [
                            *flags,
                            f"--window-size={width},{height}",
                            f"--user-data-dir={self.profile}",
                        ],
                    },
                }
            }
        }
        try:
            self.session = self._call("POST", "/session", caps)["sessionId"]
        except Exception:
            self.close()
            raise

    def _wait_ready(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.base + "/status", timeout=2) as r:
                    if json.loads(r.read())["value"].get("ready"):
                        return
            except (OSError, ValueError, KeyError):
                pass
            time.sleep(0.1)
        raise RuntimeError("chromedriver did not become ready")

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body or {}).encode() if method == "POST" else None
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})  # fmt: skip
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return json.loads(r.read())["value"]
        except urllib.error.HTTPError as exc:
            raise RuntimeError(f"webdriver {method} {path}: {exc.read()[:500]!r}") from None

    def _s(self, path: str) -> str:
        return f"/session/{self.session}{path}"

    def get(self, url: str) -> None:
        self._call("POST", self._s("/url"), {"url": url})

    def js(self, script: str, *args: Any) -> Any:
        return self._call("POST", self._s("/execute/sync"), {"script": script, "args": list(args)})

    def wait_for(self, script: str, timeout: float = 15.0, interval: float = 0.1) -> Any:
        """Poll a JS expression (``return ...``) until it is truthy; returns its value."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            last = self.js(script)
            if last:
                return last
            time.sleep(interval)
        raise TimeoutError(f"timed out waiting for: {script} (last: {last!r})")

    def screenshot(self, path: Path) -> Path:
        png = base64.b64decode(self._call("GET", self._s("/screenshot")))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(png)
        return path

    def close(self) -> None:
        try:
            if getattr(self, "session", None):
                self._call("DELETE", self._s(""))
        except Exception:
            pass
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
