"""The device agent (docs/agent-protocol.md, native/src/agent.c, tuner/agent/): its protocol's robustness under
AddressSanitizer + UBSan (malformed frames, truncated links, a fuzzer over every message: BAD_REQUEST or a
closed link, never a crash), tcp:// with a token, the adb:// path against a stand-in ``adb``, and MobileNetV3-
Small end to end through the agent (tune, kill -9 mid-tune, resume, compile, run against onnxruntime)."""
from __future__ import annotations

import os
import random
import re
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import building_cpu


def _cpu_index(devices: list) -> int:
    """The agent's index of a CPU runtime that builds here (PoCL, else Intel's: ``building_cpu``)."""
    cpu = "Portable" if building_cpu() == "pocl" else "Intel"
    return next(i for i, d in enumerate(devices) if d["platform"].startswith(cpu))

import tuner
from tuner.agent import AgentLinkError, AgentRuntime
from tuner.agent import protocol as P
from tuner.errors import TunerError
from tuner.measure import MeasureInput, MeasureOptions
from tuner.measure.runtime_runner import RuntimeRunner

ROOT = Path(__file__).resolve().parent.parent
SUPPRESSIONS = ROOT / "native" / "asan" / "lsan.supp"

pytestmark = pytest.mark.skipif(shutil.which("make") is None or shutil.which("gcc") is None,
                                reason="the agent is built with make and gcc")




def _asan_env(cl_env):
    return dict(cl_env, ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:exitcode=23",
                LSAN_OPTIONS=f"suppressions={SUPPRESSIONS}:print_suppressions=0",
                UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1")


def _sanitizer_reports(text: str) -> list:
    return re.findall(r"ERROR: (?:Address|Leak)Sanitizer.*|runtime error:.*", text)


class RawAgent:
    """An agent on --stdio spoken to frame by frame (no AgentRuntime: frames it would never send)."""

    def __init__(self, exe, env, work_dir):
        self.err = open(Path(work_dir) / "agent.log", "w+")
        self.proc = subprocess.Popen([exe, "--stdio", "--work-dir", str(work_dir)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.err, env=env, bufsize=0)
        self.rid = 0

    def send_raw(self, data: bytes) -> None:
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def send(self, typ: int, body: bytes = b"", deadline_ms: int = 20_000) -> int:
        self.rid += 1
        self.send_raw(P.Frame(typ, self.rid, deadline_ms, body).encode())
        return self.rid

    def _read(self, n: int, timeout: float) -> bytes | None:
        buf = b""
        end = time.monotonic() + timeout
        while len(buf) < n:
            ready, _, _ = select.select([self.proc.stdout], [], [], max(0.0, end - time.monotonic()))
            if not ready:
                raise TimeoutError(f"no reply within {timeout} s")
            chunk = os.read(self.proc.stdout.fileno(), n - len(buf))
            if not chunk:
                return None
            buf += chunk
        return buf

    def reply(self, timeout: float = 60.0):
        """``(type, request id, status, body)``, or None when the agent closed the link."""
        head = self._read(P.HEADER.size, timeout)
        if head is None:
            return None
        typ, rid, status, n = P.parse_header(head)
        body = self._read(n, timeout) if n else b""
        return typ, rid, status, body

    def call(self, typ: int, body: bytes = b"", deadline_ms: int = 20_000):
        rid = self.send(typ, body, deadline_ms)
        r = self.reply()
        assert r is not None, f"the agent closed the link on {P.NAMES.get(typ, typ)}"
        assert r[1] == rid and r[0] == typ, r
        return r[2], r[3]

    def finish(self, timeout: float = 60.0) -> tuple:
        """Close stdin; ``(exit status, log)``."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        code = self.proc.wait(timeout)
        self.err.seek(0)
        return code, self.err.read()


def _msg(body: bytes) -> str:
    return P.Reader(body, "test").str()


# -- protocol robustness (the ASan agent) ------------------------------------------------------------------

HEADERS = {
    "magic": struct.pack("<4sHHIIQ", b"HTTP", 1, P.PING, 1, 0, 0),
    "version": struct.pack("<4sHHIIQ", P.MAGIC, 2, P.PING, 1, 0, 0),
    "oversized": struct.pack("<4sHHIIQ", P.MAGIC, 1, P.WRITE, 1, 0, (1 << 30) + 1),
    "huge": struct.pack("<4sHHIIQ", P.MAGIC, 1, P.WRITE, 1, 0, (1 << 64) - 1),
}


@pytest.mark.parametrize("what", sorted(HEADERS))
def test_a_bad_header_is_refused_and_the_link_closed(native, cl_env, tmp_path, what):
    a = RawAgent(native["agent_asan"], _asan_env(cl_env), tmp_path)
    a.send_raw(HEADERS[what])
    typ, rid, status, body = a.reply()
    assert status == P.BAD_REQUEST and rid == 1, (status, body)
    assert a.reply() is None  # then the link is closed
    code, log = a.finish()
    assert code == 0 and not _sanitizer_reports(log), log


def test_truncated_frames_end_the_link_quietly(native, cl_env, tmp_path):
    for cut in (b"TNR1\x01", P.Frame(P.HELLO, 1, 0, P.Writer().str("x" * 100).done()).encode()[:40]):
        a = RawAgent(native["agent_asan"], _asan_env(cl_env), tmp_path)
        a.send_raw(cut)
        code, log = a.finish()
        assert a.reply(5) is None
        assert code == 0 and not _sanitizer_reports(log), log


def test_malformed_bodies_are_bad_request_and_the_link_stays(native, cl_env, tmp_path):
    a = RawAgent(native["agent_asan"], _asan_env(cl_env), tmp_path)
    status, body = a.call(99)
    assert status == P.BAD_REQUEST and "unknown message type 99" in _msg(body)
    status, body = a.call(P.PING, b"\0\0\0")
    assert status == P.BAD_REQUEST and "left over" in _msg(body)
    status, body = a.call(P.HELLO, struct.pack("<I", 1000) + b"abc")  # a str longer than the body
    assert status == P.BAD_REQUEST and "ends inside" in _msg(body)
    status, body = a.call(P.HELLO, P.Writer().str("").done() + b"\xff")
    assert status == P.BAD_REQUEST
    status, body = a.call(P.ALLOC, P.Writer().u32(0).u64(64).u32(0).u32(0).u32(0).done())
    assert status == P.BAD_REQUEST and "OPEN" in _msg(body)  # before a device is open
    assert a.call(P.PING) == (P.OK, b"")
    assert a.call(P.BYE) == (P.OK, b"")
    code, log = a.finish()
    assert code == 0 and not _sanitizer_reports(log), log


KERNEL = "__kernel void twice(__global float *a) { a[get_global_id(0)] *= 2.0f; }"
NUMBERS = (0, 1, 2, 3, 4, 7, 64, 1 << 20, (1 << 31) + 5, (1 << 32) - 1)


def _fuzz_body(rnd: random.Random, typ: int, handles: list, device: int) -> bytes:
    """A body for ``typ``: random bytes, or the right fields with hostile values."""
    if rnd.random() < 0.3:
        return bytes(rnd.getrandbits(8) for _ in range(rnd.randrange(0, 48)))
    w = P.Writer()

    def num():
        return rnd.choice(handles) if rnd.random() < 0.5 else rnd.choice(NUMBERS)
    if typ == P.OPEN:
        # the open device again, or none (another device is another driver, with bugs of its own under ASan)
        w.u32(rnd.choice((device, 9, (1 << 32) - 1)))
    elif typ == P.BUILD:
        w.str(rnd.choice((KERNEL, "", "__kernel void broken( {", KERNEL.replace("twice", "other")))).str(
            rnd.choice(("", "-cl-fast-relaxed-math", "-not-an-option"))).u32(rnd.choice((0, 1, 2)))
    elif typ == P.ALLOC:
        w.u32(rnd.choice((0, 1, 2))).u64(rnd.choice((0, 4, 64, 1 << 20, 1 << 62))).u32(num() % 70000).u32(
            num() % 70000).u32(rnd.choice((0, 1, 5)))
    elif typ == P.WRITE:
        w.u32(num()).u32(rnd.choice((0, 1, 2))).u32(rnd.choice((0, 1, 2))).bytes(bytes(rnd.choice((0, 4, 32, 100))))
    elif typ == P.READ:
        w.u32(num()).u32(rnd.choice((0, 1, 2))).u32(rnd.choice((0, 1, 2))).u64(rnd.choice((0, 4, 32, 1 << 40)))
    elif typ == P.FREE:
        w.u32(rnd.choice((0, 1, 2, 3))).u32(num())
    elif typ == P.KERNEL:
        n = rnd.choice((0, 1, 2, 5000))
        w.u32(num()).str(rnd.choice(("twice", "other", "", "nope"))).u32(n)
        for _ in range(min(n, 3)):
            w.u32(num())
        for _ in range(6):
            w.u32(rnd.choice((0, 1, 2, 4, 16, 3)))
    elif typ == P.RUN:
        mode = rnd.choice((0, 1, 2, 7))
        n = rnd.choice((0, 1, 2, 9000))
        w.u32(mode).u32(n)
        for _ in range(min(n, 2)):
            w.u32(num())
        if mode == 2 or rnd.random() < 0.2:
            w.u32(rnd.choice((0, 1, 2))).u32(rnd.choice((0, 1, 3, 1 << 31))).f64(
                rnd.choice((0.0, 1e-4, -1.0, float("nan"), float("inf")))).u32(rnd.choice((0, 5, (1 << 32) - 1)))
    return w.done()


def test_fuzzed_requests_never_crash_the_agent(native, cl_env, tmp_path):
    """Hundreds of requests of every type with hostile fields, against an open device with real programs,
    memory and launches: each is answered (OK, BAD_REQUEST, COMPILE or RUNTIME); no CRASHED, no TIMEOUT, no
    sanitizer report in either process."""
    a = RawAgent(native["agent_asan"], _asan_env(cl_env), tmp_path)
    status, body = a.call(P.HELLO, P.Writer().str("").done())
    assert status == P.OK, _msg(body)
    import json
    devices = json.loads(P.Reader(body, "HELLO").str())["devices"]
    pocl = _cpu_index(devices)
    assert a.call(P.OPEN, P.Writer().u32(pocl).done())[0] == P.OK
    status, body = a.call(P.BUILD, P.Writer().str(KERNEL).str("").u32(0).done())
    assert status == P.OK, _msg(body)
    prog = P.Reader(body, "BUILD").u32()
    status, body = a.call(P.ALLOC, P.Writer().u32(0).u64(64).u32(0).u32(0).u32(0).done())
    mem = P.Reader(body, "ALLOC").u32()
    status, body = a.call(P.KERNEL, P.Writer().u32(prog).str("twice").u32(1).u32(mem).u32(16).u32(1).u32(1)
                          .u32(4).u32(1).u32(1).done())
    assert status == P.OK, _msg(body)
    launch = P.Reader(body, "KERNEL").u32()
    handles = [prog, mem, launch, 0, 99]
    rnd = random.Random(1)
    seen: dict = {}
    for _ in range(1500):
        typ = rnd.choice((P.OPEN, P.BUILD, P.ALLOC, P.WRITE, P.READ, P.FREE, P.KERNEL, P.RUN, P.RESET, P.PING))
        if typ == P.RESET and rnd.random() < 0.8:
            typ = P.RUN
        status, body = a.call(typ, _fuzz_body(rnd, typ, handles, pocl))
        assert status in (P.OK, P.BAD_REQUEST, P.COMPILE, P.RUNTIME, P.NO_DEVICE), (P.NAMES[typ], status, body[:300])
        seen[status] = seen.get(status, 0) + 1
        if status == P.OK and typ in (P.BUILD, P.ALLOC, P.KERNEL) and len(body) >= 4:
            handles.append(P.Reader(body, "h").u32())
    assert seen.get(P.OK, 0) > 10 and seen.get(P.BAD_REQUEST, 0) > 100, seen
    assert a.call(P.PING) == (P.OK, b"")
    code, log = a.finish()
    assert code == 0 and not _sanitizer_reports(log), log[-3000:]


def test_handles_do_not_survive_a_crash_and_the_device_is_reopened(native, cl_env, tmp_path):
    """A launch killed at its deadline: TIMEOUT naming the message; its handles are gone (BAD_REQUEST), and the
    next request runs in a new executor on the same device (OPEN replayed)."""
    import json

    a = RawAgent(native["agent"], cl_env, tmp_path)
    status, body = a.call(P.HELLO, P.Writer().str("").done())
    devices = json.loads(P.Reader(body, "HELLO").str())["devices"]
    assert a.call(P.OPEN, P.Writer().u32(_cpu_index(devices)).done())[0] == P.OK
    endless = "__kernel void spin(__global float *a) { for (;;) { a[0] += 1.0f; } }"
    status, body = a.call(P.BUILD, P.Writer().str(endless).str("").u32(0).done())
    assert status == P.OK, _msg(body)
    prog = P.Reader(body, "BUILD").u32()
    mem = P.Reader(a.call(P.ALLOC, P.Writer().u32(0).u64(4).u32(0).u32(0).u32(0).done())[1], "ALLOC").u32()
    status, body = a.call(P.KERNEL, P.Writer().u32(prog).str("spin").u32(1).u32(mem).u32(1).u32(1).u32(1)
                          .u32(0).u32(0).u32(0).done())
    launch = P.Reader(body, "KERNEL").u32()
    status, body = a.call(P.RUN, P.Writer().u32(0).u32(1).u32(launch).done(), deadline_ms=1500)
    assert status == P.TIMEOUT and "RUN did not finish within 1500 ms" in _msg(body)
    status, body = a.call(P.RUN, P.Writer().u32(0).u32(1).u32(launch).done())
    assert status == P.BAD_REQUEST and "not prepared" in _msg(body)
    status, body = a.call(P.ALLOC, P.Writer().u32(0).u64(4).u32(0).u32(0).u32(0).done())
    assert status == P.OK  # the device is open in the new executor
    code, log = a.finish()
    assert code == 0


def test_binary_cache_and_a_refused_binary(native, cl_env, tmp_path):
    """BUILD with flag 1 keeps the binary under WORK/binaries/<device>/<sha256>.bin; the next BUILD of that
    source comes from it; a binary the driver refuses is deleted and rebuilt from source (and kept again);
    without the flag nothing is written."""
    import hashlib
    import json

    a = RawAgent(native["agent"], cl_env, tmp_path)
    devices = json.loads(P.Reader(a.call(P.HELLO, P.Writer().str("").done())[1], "HELLO").str())["devices"]
    assert a.call(P.OPEN, P.Writer().u32(_cpu_index(devices)).done())[0] == P.OK

    def build(source, flags):
        status, body = a.call(P.BUILD, P.Writer().str(source).str("").u32(flags).done())
        assert status == P.OK, _msg(body)
        r = P.Reader(body, "BUILD")
        _prog, _log, seconds, cached = r.u32(), r.str(), r.f64(), r.u32()
        r.end()
        assert seconds >= 0
        return cached
    assert build(KERNEL.replace("twice", "once"), 0) == 0
    assert not list(tmp_path.glob("binaries/*/*.bin"))  # no flag, no binary
    assert build(KERNEL, 1) == 0
    path, = tmp_path.glob("binaries/*/*.bin")
    assert path.stem == hashlib.sha256(b"\0" + KERNEL.encode()).hexdigest()
    assert build(KERNEL, 0) == 1  # a cached binary serves any BUILD
    garbage = b"\x7fELF not a program binary" * 40
    path.write_bytes(f"tuner-native-clbin 2\n{len(garbage)} {hashlib.sha256(garbage).hexdigest()} "
                     f"{path.parent.name}/{path.stem}\n".encode() + garbage)
    assert build(KERNEL, 1) == 0  # refused: built from source
    assert garbage not in path.read_bytes()  # and kept again
    assert build(KERNEL, 0) == 1
    status, body = a.call(P.BUILD, P.Writer().str(KERNEL).str("").u32(4).done())
    assert status == P.BAD_REQUEST and "flags" in _msg(body)
    assert a.finish()[0] == 0


def test_a_link_planted_in_the_work_folder_is_not_followed(native, cl_env, tmp_path):
    """A symbolic link planted at the name under which a BUILD writes its binary (WORK/binaries/<device>/
    <sha256>.bin.<executor pid>.tmp) was followed, and the file it points to overwritten. The cache now writes
    only new files of its own (O_EXCL, O_NOFOLLOW): the link is left alone, the build still answers, and the
    cache folders are 0700."""
    import hashlib
    import json

    a = RawAgent(native["agent"], cl_env, tmp_path)
    hello = json.loads(P.Reader(a.call(P.HELLO, P.Writer().str("").done())[1], "HELLO").str())
    assert a.call(P.OPEN, P.Writer().u32(_cpu_index(hello["devices"])).done())[0] == P.OK

    def build(source):
        status, body = a.call(P.BUILD, P.Writer().str(source).str("").u32(1).done())
        assert status == P.OK, _msg(body)
        return body

    build(KERNEL.replace("twice", "once"))  # makes the device's cache folder
    folder, = (tmp_path / "binaries").iterdir()
    assert folder.stat().st_mode & 0o077 == 0 and (tmp_path / "binaries").stat().st_mode & 0o077 == 0
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    name = hashlib.sha256(b"\0" + KERNEL.encode()).hexdigest()
    planted = folder / f"{name}.bin.{hello['executor_pid']}.tmp"
    planted.symlink_to(victim)
    build(KERNEL)
    assert victim.read_text() == "precious" and planted.is_symlink()
    assert not (folder / f"{name}.bin").exists()  # nothing cached this time
    assert a.finish()[0] == 0


# -- tcp:// with a token -----------------------------------------------------------------------------------

TOKEN = "s3cret-s3cret-s3cret"  # at least 16 bytes (issue 54)


def _token_file(tmp_path, token=TOKEN) -> str:
    """A token file as the agent and the tuner take it: this user's, mode 0600."""
    path = tmp_path / "token"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.write(fd, f"{token}\n".encode())
    os.close(fd)
    return str(path)


def _listen(exe, env, tmp_path, *args) -> tuple:
    args = tuple(_token_file(tmp_path) if a == "@token" else a for a in args)
    log = open(tmp_path / "listen.log", "w+")
    proc = subprocess.Popen([exe, "--listen", "127.0.0.1:0", "--work-dir", str(tmp_path), *args],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log, env=env)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        m = re.search(r"listening on 127\.0\.0\.1:(\d+)", (tmp_path / "listen.log").read_text())
        if m:
            return proc, int(m.group(1))
        assert proc.poll() is None, (tmp_path / "listen.log").read_text()
        time.sleep(0.05)
    proc.kill()
    raise AssertionError("the agent did not listen")


def _one_config(rt) -> object:
    t = tuner.get_template("conv2d")
    wl = t.workload((1, 4, 6, 6), (4, 4, 3, 3), padding=1)
    r = RuntimeRunner(rt, MeasureOptions(repeats=2, min_seconds=0.001, n_parallel=1))
    try:
        return r.measure([MeasureInput("conv2d", wl, t.fallback(wl, rt.info))])[0]
    finally:
        r.close()


def test_cooldown_between_measurements(native, monkeypatch):
    """``MeasureOptions.cooldown_s`` is slept between two measurements on the device: not before the first,
    not for a config that fails on the host, and across batches."""
    import tuner.measure.runtime_runner as RR
    slept = []

    class Clock:
        perf_counter = staticmethod(time.perf_counter)
        sleep = staticmethod(slept.append)
    monkeypatch.setattr(RR, "time", Clock)
    t = tuner.get_template("conv2d")
    wl = t.workload((1, 4, 6, 6), (4, 4, 3, 3), padding=1)
    with AgentRuntime(f"exec://{native['agent']}") as rt:
        cfg = t.fallback(wl, rt.info)
        runner = RuntimeRunner(rt, MeasureOptions(repeats=1, min_seconds=0.0, n_parallel=1, cooldown_s=0.5))
        good, bad = MeasureInput("conv2d", wl, cfg), MeasureInput("no.such:TEMPLATE", wl, cfg)
        first = runner.measure([good, bad, good])
        assert slept == [0.5]
        second = runner.measure([good])
        runner.close()
    assert [r.ok for r in first + second] == [True, False, True, True]
    assert slept == [0.5, 0.5]


def test_tcp_with_a_token(native, cl_env, tmp_path, monkeypatch):
    monkeypatch.delenv("TUNER_AGENT_TOKEN", raising=False)
    proc, port = _listen(native["agent"], cl_env, tmp_path, "--token-file", "@token")
    try:
        for bad in ("?token=wrong-wrong-wrong", ""):
            with pytest.raises(AgentLinkError, match="token"):
                AgentRuntime(f"tcp://127.0.0.1:{port}{bad}")
        with AgentRuntime(f"tcp://127.0.0.1:{port}?token_file={tmp_path / 'token'}") as rt:
            assert rt.hello["protocol"] == 1
            res = _one_config(rt)
            assert res.ok, res.error_msg
        with AgentRuntime(f"tcp://127.0.0.1:{port}?token={TOKEN}") as rt:  # still read, for old command lines
            rt.ping()
        monkeypatch.setattr("tuner.agent.transport._env_token", None)
        monkeypatch.setenv("TUNER_AGENT_TOKEN", TOKEN)
        with AgentRuntime(f"tcp://127.0.0.1:{port}") as rt:  # the next connection, the token from the environment
            rt.ping()
        assert proc.poll() is None  # a refused or finished connection does not end the agent
    finally:
        proc.kill()
        proc.wait()
    # beyond loopback a token is required
    r = subprocess.run([native["agent"], "--listen", "0.0.0.0:0"], capture_output=True, text=True, env=cl_env,
                       timeout=30)
    assert r.returncode == 2 and "--token-file" in r.stderr


@pytest.mark.parametrize("spec", ["127.0.0.1:99999", "127.0.0.1:65536", "127.0.0.1:7x", "127.0.0.1:-1"])
def test_listen_refuses_a_port_out_of_range(native, cl_env, spec):
    """Issue 36: 127.0.0.1:99999 listened on 34463 (the port wrapped)."""
    r = subprocess.run([native["agent"], "--listen", spec, "--once"], capture_output=True, text=True,
                       env={**cl_env, "TUNER_AGENT_TOKEN": TOKEN}, timeout=30)
    assert r.returncode == 2 and "the port must be a number from 1 to 65535" in r.stderr


def test_listen_requires_a_token_on_loopback_too(native, cl_env, monkeypatch):
    """Issue 36: a loopback agent had no token, and any local process (on a phone, any app) could open it and
    BUILD a source that #includes a file its build log then quotes. Every --listen now requires a token."""
    env = {k: v for k, v in cl_env.items() if k != "TUNER_AGENT_TOKEN"}
    for spec in ("127.0.0.1:0", "localhost:0"):
        r = subprocess.run([native["agent"], "--listen", spec, "--once"], capture_output=True, text=True, env=env,
                           timeout=30)
        assert r.returncode == 2 and "needs a token" in r.stderr and "every local process" in r.stderr, r.stderr


def test_listen_without_a_token_checks_the_resolved_address(native, cl_env):
    """Without a token, the refusal says who could reach the port, judged on the address the host resolves to,
    not its spelling: this machine's own non-loopback address (any numeric one) is reachable from other
    machines, as 0.0.0.0 is."""
    import socket
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))  # no packet is sent: the route picks the local address
            own = s.getsockname()[0]
    except OSError:
        pytest.skip("this machine has no non-loopback IPv4 route (the 0.0.0.0 case above still runs)")
    if own.startswith("127."):
        pytest.skip("the only route is loopback here")
    r = subprocess.run([native["agent"], "--listen", f"{own}:0", "--once"], capture_output=True, text=True,
                       env=cl_env, timeout=30)
    assert r.returncode == 2 and "resolves to a non-loopback address" in r.stderr


# -- adb:// against a stand-in adb -------------------------------------------------------------------------

# the stand-in (tests/stand_in_adb.py), shared with the conformance suite's adb:// runs
from tests.stand_in_adb import script as _fake_adb  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_adb_through_a_stand_in(native, cl_env, tmp_path, monkeypatch):
    adb = tmp_path / "adb"
    adb.write_text(_fake_adb())
    adb.chmod(0o755)
    phone = tmp_path / "phone"
    phone.mkdir()
    monkeypatch.setenv("ADB", str(adb))
    monkeypatch.setenv("FAKE_PHONE_ROOT", str(phone))
    monkeypatch.setenv("TUNER_AGENT_ANDROID", native["agent"])
    monkeypatch.setenv("TUNER_AGENT_PORT", str(_free_port()))
    for k in ("TUNER_OPENCL_LIB", "OCL_ICD_VENDORS", "PYOPENCL_HOME"):  # the "phone's" OpenCL
        if k in cl_env:
            monkeypatch.setenv(k, cl_env[k])
    rt = AgentRuntime("adb://emulator-5554")
    try:
        assert "adb://emulator-5554" in rt.link.name
        res = _one_config(rt)
        assert res.ok, res.error_msg
        server = rt.link.server
    finally:
        rt.close()
    assert server.wait(10) == 0  # --once: the agent on the phone ends with its connection
    log = (phone / "adb.log").read_text().splitlines()
    assert (phone / "data/local/tmp/tuner/tuner-agent").is_file()
    assert any(x.startswith("push ") for x in log) and any(x.startswith("forward tcp:0 tcp:") for x in log)
    assert any(x.startswith("forward --remove tcp:") for x in log)
    assert any("--listen 127.0.0.1:" in x and "--once" in x for x in log)
    # no adb at all: the error says what to install
    monkeypatch.setenv("ADB", "")
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    with pytest.raises(TunerError, match="adb"):
        AgentRuntime("adb://")


def test_adb_a_stranger_that_connects_first_gets_nothing(native, cl_env, tmp_path, monkeypatch):
    """adb:// raced: between `adb forward` and the tuner's connect, another local client connected first, sent
    HELLO and OPEN, and read the agent's answers. Now the agent starts with a token made for this launch: the
    stranger's HELLO is refused (AUTH, no device names), its connection does not end the --once agent, and the
    tuner, connecting next, is served."""
    adb = tmp_path / "adb"
    adb.write_text(_fake_adb())
    adb.chmod(0o755)
    phone = tmp_path / "phone"
    phone.mkdir()
    port = _free_port()
    for k, v in (("ADB", str(adb)), ("FAKE_PHONE_ROOT", str(phone)), ("TUNER_AGENT_ANDROID", native["agent"]),
                 ("TUNER_AGENT_PORT", str(port))):
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("TUNER_AGENT_TOKEN", raising=False)
    for k in ("TUNER_OPENCL_LIB", "OCL_ICD_VENDORS", "PYOPENCL_HOME"):
        if k in cl_env:
            monkeypatch.setenv(k, cl_env[k])
    got, served = {}, threading.Event()
    # the stranger connects first, as the test says: the tuner's connect waits until the stranger has its answer
    # (else, under load, the tuner may win the race and the stranger waits in the backlog for the whole session)
    from tuner.agent import transport
    connect = transport.TcpTransport.__init__

    def after_the_stranger(self, *args, **kwargs):
        served.wait(60)
        connect(self, *args, **kwargs)
    monkeypatch.setattr(transport.TcpTransport, "__init__", after_the_stranger)

    def stranger():
        try:
            knock()
        finally:
            served.set()

    def knock():
        end = time.monotonic() + 60
        while time.monotonic() < end:
            try:
                s = socket.create_connection(("127.0.0.1", port), timeout=0.2)
            except OSError:
                time.sleep(0.005)
                continue
            with s:
                if s.getsockname() == s.getpeername():  # reached itself (TCP simultaneous open): not the agent
                    continue
                s.settimeout(20)
                s.sendall(P.Frame(P.HELLO, 1, 20_000, P.Writer().str("").done()).encode())
                data = b""
                while chunk := s.recv(65536):
                    data += chunk
                got["reply"] = data
            return

    t = threading.Thread(target=stranger)
    t.start()
    time.sleep(0.05)  # the stranger is polling before the agent listens
    rt = AgentRuntime("adb://emulator-5554")
    t.join(60)
    try:
        res = _one_config(rt)
        assert res.ok, res.error_msg
    finally:
        rt.close()
    typ, rid, status, n = P.parse_header(got["reply"][:P.HEADER.size])
    assert (typ, status) == (P.HELLO, P.AUTH) and b"devices" not in got["reply"]
    log = (phone / "adb.log").read_text()
    # issue 54: the token reaches the agent on its standard input, never in an `adb shell` argument
    assert "--token-fd 0" in log and "--token " not in log and rt.link.token not in log


# -- MobileNetV3-Small end to end ----------------------------------------------------------------------------

@pytest.mark.slow
def test_mobilenet_v3_small_through_the_agent_survives_a_kill(native, tmp_path):
    """tune_model through the agent, its agent killed -9 mid-tune: a clean AgentLinkError naming the link;
    the re-run (a new agent) resumes: every planned measurement is in the log once (nothing lost, nothing
    measured twice). Then compile_model and run through the agent match onnxruntime."""
    import onnxruntime as ort

    from tuner.zoo.models import write_model
    from tuner.logs import load_records
    model = write_model("mobilenet_v3_small", tmp_path / "m.onnx", input_size=32, num_classes=10)
    log, storage = tmp_path / "mnv3.jsonl", f"journal:{tmp_path / 'studies.journal'}"
    options = MeasureOptions(repeats=2, min_seconds=0.001)
    spec = f"exec://{native['agent']}"
    kw = dict(log=str(log), trials=37, scope="buffer", compare_scopes=False, min_trials=1, sampler="random",
              storage=storage, progress=False, options=options)

    def lines() -> int:
        return len(log.read_text().splitlines()) if log.exists() else 0

    rt = AgentRuntime(spec)
    killed = threading.Event()

    def kill_after(n: int):
        deadline = time.monotonic() + 300
        while lines() < n and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(rt.link.pid, signal.SIGKILL)
        killed.set()
    threading.Thread(target=kill_after, args=(8,), daemon=True).start()
    start = time.monotonic()
    with pytest.raises(AgentLinkError, match=r"exec://.*signal 9"):
        tuner.tune_model(model, device=rt, **kw)
    assert killed.is_set() and time.monotonic() - start < 240
    rt.close()
    first = lines()
    assert 8 <= first < 37  # its 37 tasks' fallbacks: one config each (--trials is a limit)

    with AgentRuntime(spec) as rt:
        result = tuner.tune_model(model, device=rt, **kw)
        recs = load_records(str(log))
        keys = [(r.template, repr(sorted(r.workload.items())), repr(sorted(r.scopes.items())),
                 repr(sorted(r.config.items()))) for r in recs]
        assert len(keys) == len(set(keys)), "a config was measured twice"
        assert len(recs) == first + result.measured  # the first run's records kept, the rest measured now
        tasks = {k[:3] for k in keys}
        assert len(tasks) == len(recs) == len(result.tasks)  # as many trials as tasks: one config each, all there
        assert all(r.device == rt.info.fingerprint for r in recs)
        assert sum(r.error_name == "NO_ERROR" for r in recs) >= len(tasks) - 2

        mod = tuner.compile_model(model, log=str(log), device=rt, scope="buffer")
        x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
        y, = mod.run([x])
    want = ort.InferenceSession(model).run(None, {"input": x})[0]
    assert np.abs(y - want).max() <= 1e-4 * max(1.0, float(np.abs(want).max()))


def test_the_default_device_is_one_that_builds(native, monkeypatch):
    """Without ``?device=``, the agent's device is picked as a local default is: in rank order, the first that
    builds a small kernel, with one warning naming the devices passed over. PoCL is made to fail its builds
    here (as PoCL 3.0 does on AMD Zen 5), so the pick is Intel's CPU runtime."""
    from tuner.runtime.opencl.device import choose_device, probe_device
    try:
        intel = choose_device("intel", check=False)
    except TunerError:
        pytest.skip("no Intel CPU runtime here: nothing to fall back to")
    if probe_device(intel) is not None:
        pytest.skip("Intel's CPU runtime does not build here")
    monkeypatch.setenv("POCL_EXTRA_BUILD_FLAGS", "-mcpu=no-such-cpu")
    monkeypatch.setenv("POCL_KERNEL_CACHE", "0")
    with pytest.warns(UserWarning, match=r"default device is intel.*pocl.*cannot build OpenCL programs"):
        with AgentRuntime(f"exec://{native['agent']}") as rt:
            assert rt.info.platform_tag == "intel"
            res = _one_config(rt)
            assert res.ok, res.error_msg


# -- before the token is proved (issue 36) ---------------------------------------------------------------------

def test_an_idle_connection_is_dropped_and_the_owner_served(native, cl_env, tmp_path, monkeypatch):
    """A client that connects and sends nothing held a token agent for as long as it liked (the owner's
    ``tuner devices`` failed after 31.6 s). Now it has the handshake deadline to prove the token, then the link
    is closed and the next connection is served."""
    monkeypatch.delenv("TUNER_AGENT_TOKEN", raising=False)
    proc, port = _listen(native["agent"], cl_env, tmp_path, "--token-file", "@token", "--handshake-timeout", "1")
    try:
        idle = socket.create_connection(("127.0.0.1", port), timeout=30)
        t0 = time.monotonic()
        with AgentRuntime(f"tcp://127.0.0.1:{port}?token_file={tmp_path / 'token'}") as rt:  # queued behind the idle one
            rt.ping()
        assert time.monotonic() - t0 < 15
        idle.settimeout(10)
        assert idle.recv(1) == b""  # closed by the agent, nothing sent
        idle.close()
        assert "no HELLO with the token within 1000 ms" in (tmp_path / "listen.log").read_text()
    finally:
        proc.kill()
        proc.wait()


def test_a_large_frame_before_hello_is_refused_unread(native, cl_env, tmp_path, monkeypatch):
    """An unauthenticated client that announced a 1 GiB body grew the supervisor to 961 MiB. Before HELLO a body
    is at most 64 KiB: the announcement is refused (AUTH) and the link closed, nothing allocated or read."""
    monkeypatch.delenv("TUNER_AGENT_TOKEN", raising=False)
    proc, port = _listen(native["agent"], cl_env, tmp_path, "--token-file", "@token")
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        s.sendall(P.HEADER.pack(P.MAGIC, P.VERSION, P.HELLO, 1, 20_000, 1 << 30))
        s.settimeout(20)
        head = b""
        while len(head) < P.HEADER.size:
            chunk = s.recv(P.HEADER.size - len(head))
            assert chunk, "closed without an answer"
            head += chunk
        typ, rid, status, n = P.parse_header(head)
        body = b""
        while len(body) < n:
            body += s.recv(n - len(body))
        assert (typ, rid, status) == (P.HELLO, 1, P.AUTH) and "at most 65536 bytes" in _msg(body)
        assert s.recv(1) == b""
        s.close()
        with AgentRuntime(f"tcp://127.0.0.1:{port}?token_file={tmp_path / 'token'}") as rt:  # the owner is served next
            rt.ping()
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("value", ["0", "-1", "x", "5000"])
def test_handshake_timeout_is_checked(native, cl_env, value):
    r = subprocess.run([native["agent"], "--listen", "127.0.0.1:0", "--handshake-timeout", value],
                       capture_output=True, text=True, env=cl_env, timeout=30)
    assert r.returncode == 2 and "--handshake-timeout takes seconds" in r.stderr


def test_exec_starts_its_agent_with_a_token_of_its_own(native, monkeypatch, tmp_path):
    """exec:// (issue 36: every agent link authenticated) starts its agent with a token made for the launch, in
    the agent's environment, and proves it in HELLO; a token in the spec is used instead. Issue 54: the agent
    wipes it from its environment once read, so /proc/PID/environ no longer shows it."""
    monkeypatch.delenv("TUNER_AGENT_TOKEN", raising=False)
    tokens = []
    for spec in (f"exec://{native['agent']}", f"exec://{native['agent']}?token_file={_token_file(tmp_path)}"):
        with AgentRuntime(spec) as rt:
            rt.ping()
            environ = Path(f"/proc/{rt.link.pid}/environ").read_bytes()
            assert rt.link.token.encode() not in environ
            assert len(rt.link.token) >= 24 or rt.link.token == TOKEN
            tokens.append(rt.link.token)
    assert tokens[1] == TOKEN


def test_tcp_link_that_reached_itself_is_no_agent(monkeypatch):
    """With nothing listening on a local port of the ephemeral range, a connect can pick that very port as its
    own and succeed against itself (TCP simultaneous open). The link says nothing listens instead of sending the
    agent's frames to itself and waiting for answers."""
    from tuner.agent import transport

    def self_connected(address, timeout=None):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        s.connect(("127.0.0.1", s.getsockname()[1]))
        return s
    monkeypatch.setattr(transport.socket, "create_connection", self_connected)
    with pytest.raises(AgentLinkError, match="nothing listens there yet"):
        transport.TcpTransport("127.0.0.1", 1)
