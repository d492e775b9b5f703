"""Headless Debian Chromium driven through ChromeDriver's W3C WebDriver API (JSON over HTTP):
load a page, set a cookie, run a script, read the console log, take a screenshot.

Both come from Debian (``chromium``, ``chromium-driver``; deploy/install-tools.sh installs
them). If either is missing the fixture fails loudly: a browser test never skips.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tests.join_helpers import free_port

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
# as the machine notes say: without the background-networking flags Chromium keeps trying
# hosts this closed network refuses
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage", "--window-size=1280,1600"]


class Browser:
    def __init__(self) -> None:
        for path in (CHROMIUM, CHROMEDRIVER):
            assert Path(path).exists(), f"{path} is missing: run deploy/install-tools.sh (apt-get install chromium chromium-driver)"
        self.port = free_port()
        self.profile = tempfile.mkdtemp(prefix="banditstream-chromium-")
        self.driver = subprocess.Popen([CHROMEDRIVER, f"--port={self.port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.base = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                if self._call("GET", "/status")["value"]["ready"]:
                    break
            except (urllib.error.URLError, ConnectionError):
                pass
            assert self.driver.poll() is None and time.monotonic() < deadline, "chromedriver did not start"
            time.sleep(0.1)
        capabilities = {"browserName": "chrome", "goog:loggingPrefs": {"browser": "ALL"},
                        "goog:chromeOptions": {"binary": CHROMIUM, "args": [*ARGS, f"--user-data-dir={self.profile}"]}}
        self.session = self._call("POST", "/session", {"capabilities": {"alwaysMatch": capabilities}})["value"]["sessionId"]

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"} if data else {})
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            raise AssertionError(f"webdriver {method} {path}: {exc.code} {exc.read()[:500]!r}") from None

    def _session(self, method: str, path: str, body: Any = None) -> Any:
        return self._call(method, f"/session/{self.session}{path}", body)["value"]

    def get(self, url: str) -> None:
        self._session("POST", "/url", {"url": url})

    def add_cookie(self, name: str, value: str) -> None:
        self._session("POST", "/cookie", {"cookie": {"name": name, "value": value, "path": "/"}})

    def run(self, script: str, *args: Any) -> Any:
        """Run ``script`` (a function body; ``return`` gives the value) in the page."""
        return self._session("POST", "/execute/sync", {"script": script, "args": list(args)})

    def console(self) -> list[dict[str, Any]]:
        """The browser console's entries since the last call (level, message)."""
        return self._session("POST", "/se/log", {"type": "browser"})

    def screenshot(self, path: Path) -> Path:
        path.write_bytes(base64.b64decode(self._session("GET", "/screenshot")))
        return path

    def close(self) -> None:
        try:
            self._call("DELETE", f"/session/{self.session}")
        finally:
            self.driver.terminate()
            try:
                self.driver.wait(10)
            except subprocess.TimeoutExpired:
                self.driver.kill()
            shutil.rmtree(self.profile, ignore_errors=True)
