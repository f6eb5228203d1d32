"""Headless Chromium driven over its DevTools protocol on a pipe (``--remote-debugging-pipe``),
standard library only: one browser per test module, a fresh tab per page visited. A visit
returns the DOM after the page's scripts ran, every URL the page requested, its script
errors and console errors, and optionally a screenshot.

The pipe, not a port: nothing listens on the machine, and no driver is downloaded (Debian's
``chromium`` package is the browser; CI installs it in .ci/run).
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import fcntl
import json
import os
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

# Debian's package first; Google Chrome (GitHub's ubuntu runners have it) speaks the same protocol
CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
TIMEOUT_S = 30.0
TRAMPOLINE = (
    "import os, sys\n"
    "a, b = int(sys.argv[1]), int(sys.argv[2])\n"
    "os.dup2(a, 3); os.dup2(b, 4); os.close(a); os.close(b)\n"
    "os.execv(sys.argv[3], sys.argv[3:])\n"
)
WINDOW = (1400, 1000)


def chromium() -> str:
    """The browser's path. Missing: the test skips saying why, except in CI (``CI`` set), where
    a browser test that cannot run is a failure, never a silent skip."""
    for name in CANDIDATES:
        if found := shutil.which(name):
            return found
    why = "no chromium on PATH: install Debian's `chromium` package (apt-get install -y chromium)"
    if os.environ.get("CI"):
        pytest.fail(f"{why}; CI is set, so the browser tests must run (.ci/run installs it)")
    pytest.skip(why)


@dataclasses.dataclass
class Visit:
    dom: str
    requests: list[str]  # every URL the page asked for, its own first
    blocked: dict[str, str]  # URL -> why the browser refused it before it left ("csp")
    errors: list[str]  # uncaught script exceptions and console errors (a CSP refusal is one)
    screenshot: Path | None


class Browser:
    def __init__(self, executable: str, profile: Path) -> None:
        to_browser, self._write = os.pipe()
        self._read, from_browser = os.pipe()
        # the protocol's pipe is the browser's fd 3 (in) and 4 (out): a Python trampoline puts it
        # there and execs the browser (no preexec_fn: unsafe beside threads), from fds above 10
        # so that neither end is itself 3 or 4 and overwritten on the way
        ends = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_browser, from_browser)]
        for fd in (to_browser, from_browser):
            os.close(fd)
        args = [executable, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe"]
        # no background traffic of the browser's own: the machine may have no network at all
        args += ["--no-first-run", "--disable-background-networking", "--disable-component-update"]
        args += ["--disable-sync", "--mute-audio", f"--user-data-dir={profile}", "about:blank"]
        self._proc = subprocess.Popen(
            [sys.executable, "-c", TRAMPOLINE, *map(str, ends), *args],
            pass_fds=ends,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for fd in ends:
            os.close(fd)
        self._buffer = b""
        self._next = 0
        self._events: list[dict[str, Any]] = []

    def close(self) -> None:
        with contextlib.suppress(OSError, TimeoutError, RuntimeError):  # a browser already gone
            self._send("Browser.close")
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        os.close(self._write)
        os.close(self._read)

    def visit(self, url: str, screenshot: Path | None = None) -> Visit:
        target = self._send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self._send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Network", "Runtime", "Log"):
            self._send(f"{domain}.enable", session=session)
        width, height = WINDOW
        metrics = {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}
        self._send("Emulation.setDeviceMetricsOverride", metrics, session=session)
        self._events.clear()
        self._send("Page.navigate", {"url": url}, session=session)
        self._await_event("Page.loadEventFired", session)
        dom = self._send(
            "Runtime.evaluate",
            {"expression": "document.documentElement.outerHTML", "returnByValue": True},
            session=session,
        )["result"]["value"]
        if screenshot is not None:
            png = self._send("Page.captureScreenshot", {"format": "png"}, session=session)["data"]
            screenshot.write_bytes(base64.b64decode(png))
        events = [e for e in self._events if e.get("sessionId") == session]
        self._send("Target.closeTarget", {"targetId": target})
        return Visit(dom, _requests(events), _blocked(events), _errors(events), screenshot)

    def _send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> dict[str, Any]:
        self._next += 1
        message: dict[str, Any] = {"id": self._next, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        os.write(self._write, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._message()
            if reply.get("id") == self._next:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            if "method" in reply:
                self._events.append(reply)

    def _await_event(self, method: str, session: str) -> None:
        while not any(e["method"] == method and e.get("sessionId") == session for e in self._events):
            self._events.append(self._message())

    def _message(self) -> dict[str, Any]:
        deadline = time.monotonic() + TIMEOUT_S
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._read], [], [], left)[0]:
                raise TimeoutError(f"chromium said nothing for {TIMEOUT_S:.0f} s")
            chunk = os.read(self._read, 1 << 20)
            if not chunk:
                raise RuntimeError(f"chromium closed its pipe (exit status {self._proc.poll()})")
            self._buffer += chunk
        raw, _, self._buffer = self._buffer.partition(b"\0")
        return json.loads(raw)


def _requests(events: list[dict[str, Any]]) -> list[str]:
    return [e["params"]["request"]["url"] for e in events if e["method"] == "Network.requestWillBeSent"]


def _blocked(events: list[dict[str, Any]]) -> dict[str, str]:
    urls = {
        e["params"]["requestId"]: e["params"]["request"]["url"]
        for e in events
        if e["method"] == "Network.requestWillBeSent"
    }
    return {
        urls.get(e["params"]["requestId"], "?"): e["params"]["blockedReason"]
        for e in events
        if e["method"] == "Network.loadingFailed" and e["params"].get("blockedReason")
    }


def _errors(events: list[dict[str, Any]]) -> list[str]:
    found = []
    for e in events:
        p = e.get("params", {})
        if e["method"] == "Runtime.exceptionThrown":
            details = p["exceptionDetails"]
            found.append((details.get("exception") or {}).get("description") or details.get("text", "exception"))
        elif e["method"] == "Runtime.consoleAPICalled" and p.get("type") == "error":
            found.append(" ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
        elif e["method"] == "Log.entryAdded" and p["entry"].get("level") == "error":
            found.append(p["entry"].get("text", ""))
    return found
