"""The HTML report in a real browser: headless Chromium (Debian's, installed by the fixture when missing),
driven over the DevTools protocol. The page must load with no console error, no failed request and no
exception, decode every embedded figure, and a full-page screenshot must show them.

The DevTools client is a few lines of stdlib websocket (RFC 6455) so that the test needs no browser
automation package.
"""
from __future__ import annotations

import base64
import io
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from tuner.analysis import load_logs, write_report

pytestmark = [pytest.mark.slow,
              pytest.mark.xdist_group("browser")]  # one Chromium (and one apt-get when missing), tests/conftest.py

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--hide-scrollbars", "--remote-debugging-port=0"]


# ------------------------------------------------------------------------------------------- chromium

def _install_chromium() -> str:
    """Debian's chromium through apt (the test machine runs as root); one retry after `apt-get update`,
    since a fresh image has no package lists."""
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "--no-install-recommends", "-o", "DPkg::Lock::Timeout=300", "chromium"]
    log = []
    for cmd in (install, ["apt-get", "update", "-o", "DPkg::Lock::Timeout=300"], install):
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
        except subprocess.TimeoutExpired:
            pytest.fail(f"`{' '.join(cmd)}` did not finish in 15 minutes")
        log.append(f"$ {' '.join(cmd)}\n{res.stdout[-2000:]}{res.stderr[-2000:]}")
        if cmd == install and res.returncode == 0 and shutil.which("chromium"):
            return shutil.which("chromium")
    pytest.fail("could not install chromium with apt-get:\n" + "\n".join(log))


@pytest.fixture(scope="session")
def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    if not shutil.which("apt-get"):
        pytest.skip("chromium is not installed and apt-get is unavailable to install it")
    return _install_chromium()


class DevTools:
    """A minimal Chrome DevTools Protocol client over one websocket: ``call`` sends a command and returns its
    result; events that arrive meanwhile are kept in ``events``."""

    def __init__(self, ws_url: str):
        host, _, path = ws_url.removeprefix("ws://").partition("/")
        name, port = host.split(":")
        self.sock = socket.create_connection((name, int(port)), timeout=60)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET /{path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                           f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(4096)
            assert chunk, "DevTools closed the connection during the handshake"
            head += chunk
        assert head.startswith(b"HTTP/1.1 101"), head[:200]
        self.buffer = head.split(b"\r\n\r\n", 1)[1]
        self.next_id, self.events = 0, []

    def _recv(self, n: int) -> bytes:
        while len(self.buffer) < n:
            chunk = self.sock.recv(1 << 20)
            assert chunk, "DevTools closed the connection"
            self.buffer += chunk
        out, self.buffer = self.buffer[:n], self.buffer[n:]
        return out

    def _send_frame(self, opcode: int, payload: bytes) -> None:
        mask = os.urandom(4)  # client frames are masked (RFC 6455 5.3)
        n = len(payload)
        head = bytes([0x80 | opcode]) + (bytes([0x80 | n]) if n < 126 else
                                         bytes([0x80 | 126]) + struct.pack(">H", n) if n < 1 << 16 else
                                         bytes([0x80 | 127]) + struct.pack(">Q", n))
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.sock.sendall(head + mask + masked)

    def _message(self) -> dict:
        data = b""
        while True:
            b0, b1 = self._recv(2)
            n = b1 & 0x7F
            n = struct.unpack(">H", self._recv(2))[0] if n == 126 else struct.unpack(">Q", self._recv(8))[0] if n == 127 else n
            payload = self._recv(n)
            opcode = b0 & 0x0F
            if opcode == 0x9:  # ping
                self._send_frame(0xA, payload)
                continue
            assert opcode != 0x8, "DevTools closed the websocket"
            data += payload
            if b0 & 0x80:  # FIN: the message is complete
                return json.loads(data)

    def call(self, method: str, **params) -> dict:
        self.next_id += 1
        self._send_frame(0x1, json.dumps({"id": self.next_id, "method": method, "params": params}).encode())
        while True:
            msg = self._message()
            if msg.get("id") == self.next_id:
                assert "error" not in msg, f"{method}: {msg['error']}"
                return msg["result"]
            self.events.append(msg)

    def wait_for(self, method: str, timeout: float = 60) -> dict:
        end = time.monotonic() + timeout
        while not any(e.get("method") == method for e in self.events):
            assert time.monotonic() < end, f"no {method} within {timeout} s"
            self.events.append(self._message())
        return next(e for e in self.events if e.get("method") == method)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture(scope="module")
def browser(chromium, tmp_path_factory):
    """A headless Chromium with DevTools on a free port; yields a function that opens a fresh page."""
    profile = tmp_path_factory.mktemp("chromium-profile")
    log = open(profile / "chromium.log", "w")
    proc = subprocess.Popen([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "about:blank"],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    port_file = profile / "DevToolsActivePort"
    end = time.monotonic() + 60
    while not (port_file.exists() and port_file.read_text().count("\n") >= 1):
        if proc.poll() is not None or time.monotonic() > end:
            log.flush()
            pytest.fail(f"chromium did not start (exit {proc.poll()}):\n{(profile / 'chromium.log').read_text()[-3000:]}")
        time.sleep(0.1)
    port = int(port_file.read_text().split()[0])

    def new_page() -> DevTools:
        req = urllib.request.Request(f"http://127.0.0.1:{port}/json/new?about:blank", method="PUT")
        target = json.loads(urllib.request.urlopen(req, timeout=30).read())
        page = DevTools(target["webSocketDebuggerUrl"])
        for domain in ("Page", "Runtime", "Log", "Network"):
            page.call(f"{domain}.enable")
        return page

    yield new_page
    os.killpg(proc.pid, signal.SIGTERM)  # the browser we started and its helper processes
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    log.close()


def problems(page: DevTools) -> list[str]:
    """Console errors and warnings, uncaught exceptions, browser log errors and failed requests so far."""
    out = []
    for e in page.events:
        m, p = e.get("method"), e.get("params", {})
        if m == "Runtime.consoleAPICalled" and p["type"] in ("error", "assert", "warning"):
            out.append(f"console.{p['type']}: " + " ".join(str(a.get("value", a.get("description"))) for a in p["args"]))
        elif m == "Runtime.exceptionThrown":
            out.append("exception: " + p["exceptionDetails"].get("text", ""))
        elif m == "Log.entryAdded" and p["entry"]["level"] in ("error", "warning"):
            out.append(f"log {p['entry']['level']}: {p['entry']['text']}")
        elif m == "Network.loadingFailed":
            out.append(f"failed request: {p.get('errorText')}")
    return out


def open_page(page: DevTools, url: str) -> dict:
    page.call("Page.navigate", url=url)
    page.wait_for("Page.loadEventFired")
    script = """JSON.stringify({
        images: document.images.length,
        decoded: [...document.images].filter(i => i.complete && i.naturalWidth > 0).length,
        sections: [...document.querySelectorAll('h2')].map(h => h.textContent),
        height: document.documentElement.scrollHeight})"""
    return json.loads(page.call("Runtime.evaluate", expression=script, returnByValue=True)["result"]["value"])


def screenshot(page: DevTools, height: int) -> np.ndarray:
    from PIL import Image
    page.call("Emulation.setDeviceMetricsOverride", width=1200, height=min(height, 16000), deviceScaleFactor=1,
              mobile=False)
    png = base64.b64decode(page.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)["data"])
    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))


# ----------------------------------------------------------------------------------------------- tests

def _hand_made_log(tmp_path, device) -> Path:
    """Two conv2d workloads, each tuned with texture and with buffer scopes, some failures."""
    import dataclasses

    from tuner.errors import ErrorCode
    from tuner.logs import Record, append_records
    from tuner.templates import get_template
    conv = get_template("conv2d")
    log = tmp_path / "log.jsonl"
    for i, (data, kernel) in enumerate((((1, 8, 8, 8), (8, 8, 3, 3)), ((1, 8, 8, 8), (16, 8, 1, 1)))):
        wl = conv.workload(data=data, kernel=kernel, padding=kernel[2] // 2)
        for scope, sampler, medians_ms in (("texture", "xgb", [5, 3, 2.5, 2, 2.2, 1.9]),
                                           ("buffer", "random", [4, 3.5, 3, 3.1, 2.9])):
            cfg = dataclasses.replace(conv.fallback(wl, device.info), input_scope=scope, weight_scope=scope,
                                      output_scope=scope)
            append_records(log, [Record.new("conv2d", wl, dataclasses.replace(cfg, tile_oh=1 + t % 2), device,
                                            costs=[m * 1e-3] * 3, trial=t, sampler=sampler)
                                 for t, m in enumerate(medians_ms)])
            append_records(log, [Record.new("conv2d", wl, cfg, device, error_code=ErrorCode.COMPILE,
                                            error_msg="clBuildProgram failed", sampler=sampler)] * (i + 1))
    return log


def test_report_renders_in_chromium(browser, tmp_path, device):
    profile = {"device": device.fingerprint, "total_s": 0.004, "rows": [
        {"node": "conv1", "op": "conv2d", "template": "conv2d", "scopes": "texture", "median_s": 0.0025},
        {"node": "relu", "op": "relu", "template": None, "scopes": None, "median_s": 0.0005},
        {"node": "conv2", "op": "conv2d", "template": "conv2d", "scopes": "buffer", "median_s": 0.001}]}
    (tmp_path / "artifact").mkdir()
    (tmp_path / "artifact" / "profile.json").write_text(json.dumps(profile))
    report = write_report(load_logs(_hand_made_log(tmp_path, device)), tmp_path / "report.html",
                          artifact=tmp_path / "artifact")
    page = browser()
    info = open_page(page, report.resolve().as_uri())
    assert problems(page) == []
    assert info["images"] == info["decoded"] == 5, info
    assert info["sections"] == ["Templates", "Where the time goes", "Convergence", "Texture against buffer",
                                "Errors", "Compiled model: per-layer latency", "Tasks"]
    shot = screenshot(page, info["height"])
    assert shot.shape[0] >= min(info["height"], 16000) - 1 and shot.shape[1] == 1200
    assert shot.std() > 20, "the screenshot is blank"
    # the figures are on screen: the texture bars' blue and the buffer bars' orange cover real areas
    for rgb in ((0x4C, 0x72, 0xB0), (0xDD, 0x84, 0x52)):
        near = (np.abs(shot.astype(int) - rgb).sum(axis=2) < 30).sum()
        assert near > 5000, f"colour {rgb} covers only {near} pixels"
    page.close()


def test_the_browser_check_sees_errors(browser, tmp_path):
    """The checks above are not vacuous: a page with a console error, an exception and a missing image."""
    bad = tmp_path / "bad.html"
    bad.write_text('<!DOCTYPE html><html><head><link rel="icon" href="data:,"></head><body>'
                   '<img src="missing.png"><script>console.error("boom"); undefined_function();</script>'
                   "</body></html>")
    page = browser()
    info = open_page(page, bad.resolve().as_uri())
    found = "\n".join(problems(page))
    assert "console.error: boom" in found and "exception" in found and "failed request" in found, found
    assert info["images"] == 1 and info["decoded"] == 0
    page.close()
