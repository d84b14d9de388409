"""``AgentRuntime``: a ``Runtime`` whose device sits behind a ``tuner-agent`` (docs/agent-protocol.md).

Every method is one request and its reply. The device's profile comes from ``OPEN`` and is checked like any
profile (``tuner.target``), so fingerprints, search-space constraints and records are those of a local
device. When the agent's executor is killed (a kernel that did not end: ``TimeoutError``) or dies
(``DeviceCrashed``), every handle made before is void: using one is an error, and new ones work.

Memory, programs and launches are freed on the agent when their handles are garbage-collected here: the
``FREE`` requests wait in a list and go out in front of the next request, in the same write (their replies are
read and dropped), so freeing costs no round trip of its own."""
from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import math
import secrets
import threading
import warnings
import weakref
from dataclasses import dataclass, field

import numpy as np

from tuner.errors import CompileError, DeviceCrashed, TunerError
from tuner.runtime.base import Runtime, probe_source
from tuner.target import DeviceInfo

from . import protocol as P
from .transport import AgentLinkError, connect

FREE_MEM, FREE_PROGRAM, FREE_LAUNCH = 0, 1, 2
MAX_RUNS = 10_000  # Runtime.time's cap on timed runs


class AgentStatusError(TunerError):
    """A request the agent answered with an error status (``status``) that has no exception of its own."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, eq=False)
class Mem:
    """A buffer or image on the agent, seen through a physical shape. A view shares its pool's ``id`` and
    keeps the pool (``owner``) alive."""
    id: int
    epoch: int
    scope: str
    physical_shape: tuple
    dtype: np.dtype
    owner: object = field(default=None, repr=False)

    @property
    def is_texture(self) -> bool:
        return self.scope.startswith("texture")


@dataclass(frozen=True, eq=False)
class Handle:
    """A program or a launch on the agent; a launch keeps its program and memory (``refs``) alive."""
    id: int
    epoch: int
    refs: tuple = field(default=(), repr=False)


def _rank(d: dict) -> tuple:
    """As ``tuner.runtime.choice.default_order`` ranks local devices: a GPU, else PoCL, else another CPU, never a
    simulator unless it is all there is."""
    sim = "oclgrind" in f"{d.get('platform', '')} {d.get('name', '')}".lower()
    kind = 0 if d.get("type") == "GPU" else 1 if "portable computing language" in str(d.get("platform", "")).lower() \
        else 2 if d.get("type") == "CPU" else 3
    return (sim, kind)



class AgentRuntime(Runtime):
    """Connect to the agent ``spec`` names (``exec://``, ``tcp://``, ``adb://``; ``?device=N`` picks a device
    by its index in the agent's list (as ``tuner devices`` numbers them there) or by a name, ``?token_file=PATH``
    authenticates, ``?timeout=S`` bounds a run) and open its device. ``build_timeout`` and ``run_timeout``:
    the deadlines of BUILD and of RUN/READ, which the agent enforces by killing its executor."""

    def __init__(self, spec: str, build_timeout: float = 60.0, run_timeout: float = 30.0):
        self.spec = spec
        self.link, opts = connect(spec)
        self.build_timeout = build_timeout
        self.fixed_run_timeout = "timeout" in opts
        self.run_timeout = float(opts["timeout"]) if "timeout" in opts else run_timeout
        self._ids = itertools.count(1)
        self.epoch = 0
        self._frees: list = []
        self._lock = threading.Lock()
        self.calls: dict = {}  # requests sent, by message name
        try:
            hello = json.loads(self._handshake(spec, opts))  # a silent peer is no agent: ~30 s at most
            if not isinstance(hello, dict):
                raise P.ProtocolError(f"{self.link.name}: HELLO's reply is not a JSON object")
            self.hello = hello
            devices = hello.get("devices") or []
            if not devices:
                why = hello.get("opencl_error") or hello.get("opencl_library") or "no OpenCL library"
                if "TUNER_OPENCL_LIB" in why:  # the loader's error: every path it tried, and the fix
                    raise TunerError(f"{self.link.name}: the agent found no OpenCL device: {why}")
                raise TunerError(f"{self.link.name}: the agent found no OpenCL device ({why}); on Android set "
                                 f"TUNER_OPENCL_LIB for the agent to the vendor's libOpenCL.so")
            want = opts.get("device")
            if want is None or want == "":
                index = self._open_default(devices)
            else:
                index = self._pick(want, devices)
                self._open(index)
        except BaseException:
            self.link.close()
            raise
        self.device_index = index

    def _open(self, index: int) -> None:
        r = self._call(P.OPEN, P.Writer().u32(index).done(), 120.0, "OPEN")
        self.info = _profile(r.str(), self.link.name)
        r.end()

    def _open_default(self, devices: list) -> int:
        """The agent's default device, as ``tuner.runtime.choice`` picks a local one: in ``_rank``'s order, the
        first that builds the probe (``tuner.runtime.base.probe_source``). PoCL 3.0 cannot compile for every CPU
        (on AMD Zen 5 its LLVM 14 fails), and a device that builds nothing is no default. None builds: the
        first, whose build errors then say why."""
        order = sorted(range(len(devices)), key=lambda i: (_rank(devices[i]), i))
        refused = []
        for index in order:
            self._open(index)
            try:
                source = probe_source(self.info.image_support)
                self._call(P.BUILD, P.Writer().str(source).str("").u32(0).done(), self.build_timeout, "BUILD")
            except CompileError as e:
                refused.append(f"{self.info.label}: {str(e).splitlines()[-1].strip() if str(e).strip() else e}")
                continue
            finally:
                self._call(P.RESET, b"", 60.0, "RESET").end()
            if refused:
                warnings.warn(f"{self.link.name}: the agent's default device is {self.info.label}; "
                              + "; ".join(refused) + " (cannot build OpenCL programs); pick one with ?device=N",
                              stacklevel=3)
            return index
        self._open(order[0])
        return order[0]

    def _pick(self, want, devices: list) -> int:
        if str(want).isdigit():
            i = int(want)
            if i >= len(devices):
                raise TunerError(f"{self.link.name}: device={i}, but the agent lists {len(devices)} device(s): "
                                 + "; ".join(f"[{k}] {d.get('platform')} / {d.get('name')}" for k, d in
                                             enumerate(devices)))
            return i
        for i, d in enumerate(devices):
            hay = " ".join(str(d.get(k, "")) for k in ("platform", "name", "type", "fingerprint")).lower()
            if str(want).lower() in hay:
                return i
        raise TunerError(f"{self.link.name}: no device of the agent matches {want!r}: "
                         + "; ".join(f"[{k}] {d.get('platform')} / {d.get('name')}" for k, d in enumerate(devices)))

    def set_timeouts(self, build: float | None = None, run: float | None = None) -> None:
        """The deadlines of BUILD and RUN (``MeasureOptions``' build and run timeouts); a ``?timeout=`` in the
        spec keeps the run deadline it set."""
        if build is not None:
            self.build_timeout = float(build)
        if run is not None and not self.fixed_run_timeout:
            self.run_timeout = float(run)

    # -- the link --------------------------------------------------------------------------------------
    def _free_later(self, kind: int, hid: int, epoch: int) -> None:
        with self._lock:
            self._frees.append((kind, hid, epoch))

    def _free_frames(self) -> list:
        with self._lock:
            frees, self._frees = self._frees, []
        out = []
        for kind, hid, epoch in frees:
            if epoch == self.epoch:  # older handles died with their executor
                out.append(P.Frame(P.FREE, next(self._ids), 10_000, P.Writer().u32(kind).u32(hid).done()))
        return out

    def _recv(self, timeout: float) -> tuple:
        head = self.link.recv_exact(P.HEADER.size, timeout)
        try:
            rtyp, rrid, status, n = P.parse_header(head)
        except P.ProtocolError as e:
            raise AgentLinkError(f"{self.link.name}: {e}") from None
        data = self.link.recv_exact(n, timeout) if n else b""
        return rtyp, rrid, status, data

    def _handshake(self, spec: str, opts: dict) -> str:
        """CHALLENGE and HELLO; HELLO's reply text. Over tcp:// a link that the agent ends before HELLO is answered
        (its handshake slot went to a crowd of strangers, issue 54) is opened again, up to 3 times."""
        for attempt in range(3):
            try:
                return self._call(P.HELLO, P.Writer().str(self._prove(opts.get("token") or "")).done(), 15.0,
                                  "HELLO").str()
            except AgentLinkError as e:
                if attempt == 2 or not spec.startswith("tcp://") or "the link ended" not in str(e):
                    raise
                self.link.close()
                self.link, _ = connect(spec)
        raise AssertionError("unreachable")

    def _prove(self, token: str) -> str:
        """HELLO's string (issue 54): CHALLENGE first, the agent proves it holds the token over both nonces (a
        process that merely took the port learns nothing), then HELLO carries the host's proof, never the token;
        a captured HELLO proves nothing on another connection. Without a token, "" (the agent says what to do)."""
        if not token:
            return ""
        key = token.encode()
        mine = secrets.token_bytes(P.NONCE)
        try:
            r = self._call(P.CHALLENGE, P.Writer().bytes(mine).done(), 15.0, "CHALLENGE")
            theirs, proof = r.bytes(), r.bytes()
            r.end()
        except AgentStatusError as e:
            raise AgentLinkError(f"{self.link.name}: the agent did not answer CHALLENGE ({e}); an agent older than the "
                                 f"challenge handshake: rebuild it with `tuner native build`") from None
        if len(theirs) != P.NONCE or not hmac.compare_digest(
                proof, hmac.new(key, P.AGENT_LABEL + mine + theirs, hashlib.sha256).digest()):
            self.link.close()
            raise AgentLinkError(f"{self.link.name}: the agent could not prove it holds the token: it is not the agent "
                                 f"you started with that token (another process may hold the port), or the token "
                                 f"differs; nothing was sent")
        return P.HMAC_PREFIX + hmac.new(key, P.HOST_LABEL + mine + theirs, hashlib.sha256).hexdigest()

    def _call(self, typ: int, body: bytes, timeout: float, what: str) -> P.Reader:
        rid = next(self._ids)
        frees = self._free_frames() if typ not in (P.HELLO, P.OPEN, P.BYE) else []
        frame = P.Frame(typ, rid, max(1, int(timeout * 1000)), body)
        self.calls[what] = self.calls.get(what, 0) + 1
        self.link.send(b"".join(f.encode() for f in frees) + frame.encode())
        wait = timeout + 15.0  # the agent answers TIMEOUT at the deadline; beyond this the link itself stalled
        lost = None  # the executor died on a FREE: the request went to a new one, without the handles it names
        for f in frees:
            rtyp, rrid, fstatus, fdata = self._recv(wait)
            if rrid != f.request_id:
                raise AgentLinkError(f"{self.link.name}: a reply to request {rrid} while waiting for {f.request_id} "
                                     f"(FREE); the link is out of step")
            if fstatus in (P.TIMEOUT, P.CRASHED) and lost is None:
                self.epoch += 1
                lost = P.Reader(fdata, "FREE").str() if fdata else "the executor died"
        rtyp, rrid, status, data = self._recv(wait)
        if rrid != rid or rtyp != typ:
            raise AgentLinkError(f"{self.link.name}: a reply to request {rrid} ({P.NAMES.get(rtyp, rtyp)}) while "
                                 f"waiting for {rid} ({what}); the link is out of step")
        r = P.Reader(data, f"{self.link.name} {what}")
        if status == P.OK:
            return r
        if lost is not None and status not in (P.TIMEOUT, P.CRASHED):
            raise DeviceCrashed(f"the agent's executor died freeing memory before {what} ({lost}); the agent "
                                f"starts another on the next request")
        try:
            msg = r.str() if data else ""
        except P.ProtocolError:
            msg = repr(bytes(data[:200]))
        if status in (P.TIMEOUT, P.CRASHED):
            self.epoch += 1  # the executor was replaced: every handle before is void
            if status == P.TIMEOUT:
                raise TimeoutError(f"{what} did not finish within {timeout:g} s on the agent's device; the agent "
                                   f"killed its executor and starts another on the next request ({msg})")
            raise DeviceCrashed(f"{what} crashed the agent's executor ({msg}); the agent starts another on the next "
                                f"request")
        if status == P.COMPILE:
            label = self.info.label if hasattr(self, "info") else "the agent's device"
            raise CompileError(f"OpenCL build failed on {label} (through {self.link.name}):\n{msg}", log=msg)
        if status == P.AUTH:
            self.link.close()
            raise AgentLinkError(f"{self.link.name}: the agent refused the connection ({msg}); give its token in a file "
                                 f"only you can read, ?token_file=PATH, or in $TUNER_AGENT_TOKEN")
        raise AgentStatusError(f"{self.link.name}: {what} failed: {P.STATUS.get(status, status)}: {msg}", status)

    def _check(self, *handles) -> None:
        for h in handles:
            if h.epoch != self.epoch:
                raise TunerError("a handle from before the agent's executor restarted (a kernel timed out or "
                                 "crashed): build and allocate again")

    def ping(self) -> None:
        self._call(P.PING, b"", 10.0, "PING").end()

    def sensors(self) -> tuple:
        """``(GPU clock in Hz or None, degrees C or None, the nodes read)`` on the agent's device (``SENSORS``:
        the agent reads sysfs under its ``--sysfs-root``; ``tuner.measure.sensors`` documents the nodes). An
        agent built before SENSORS answers BAD_REQUEST: it has no sensors for this tuner, asked once."""
        if getattr(self, "_no_sensors", False):
            return None, None, ""
        try:
            r = self._call(P.SENSORS, b"", 10.0, "SENSORS")
        except AgentStatusError as e:
            if e.status != P.BAD_REQUEST:
                raise
            self._no_sensors = True
            return None, None, ""
        return P.parse_sensors(r)

    def reset(self) -> None:
        """Free every handle on the agent (the handles held here become void)."""
        self._call(P.RESET, b"", 60.0, "RESET").end()
        self.epoch += 1

    def close(self) -> None:
        if getattr(self, "_closed", False):
            return
        self._closed = True
        try:
            self._call(P.BYE, b"", 5.0, "BYE")
        except (TunerError, OSError):
            pass
        self.link.close()

    def __enter__(self) -> "AgentRuntime":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- Runtime ------------------------------------------------------------------------------------------
    def _owned(self, obj, kind: int):
        weakref.finalize(obj, self._free_later, kind, obj.id, obj.epoch)
        return obj

    def build(self, source, cache_dir=None, stats=None):
        """A program; with ``cache_dir`` (a model's load) the agent also keeps its binary in its work directory
        (a tuning run, which builds each source once, does not ask: the driver may compile again for it)."""
        flags = P.BUILD_KEEP if cache_dir is not None else 0
        r = self._call(P.BUILD, P.Writer().str(source).str("").u32(flags).done(), self.build_timeout, "BUILD")
        pid, _log, _seconds, cached = r.u32(), r.str(), r.f64(), r.u32()
        r.end()
        if stats is not None:
            key = "binary" if cached else "source"
            stats[key] = stats.get(key, 0) + 1
        return self._owned(Handle(pid, self.epoch), FREE_PROGRAM)

    def alloc(self, scope, physical_shape, dtype):
        dtype, shape = np.dtype(dtype), tuple(int(v) for v in physical_shape)
        if not shape or any(s <= 0 for s in shape):
            raise TunerError(f"physical shape {shape} must be non-empty with positive extents")
        w = P.Writer()
        if scope.startswith("texture"):
            if len(shape) != 3 or shape[2] != 4 or dtype not in (np.float32, np.float16):
                raise TunerError(f"texture of shape {shape} {dtype}: expected (height, width, 4) float32/float16")
            if not self.info.image_support:
                raise TunerError(f"this device ({self.info.label}: {self.info.name}) has no image support: use a "
                                 f"buffer scope")
            w.u32(1).u64(0).u32(shape[1]).u32(shape[0]).u32(0 if dtype == np.float32 else 1)
        elif scope == "global":
            nbytes = math.prod(shape) * dtype.itemsize
            if nbytes > self.info.max_mem_alloc_bytes:
                raise TunerError(f"buffer of {nbytes} bytes exceeds this device's max allocation "
                                 f"{self.info.max_mem_alloc_bytes} bytes ({self.info.label})")
            w.u32(0).u64(nbytes).u32(0).u32(0).u32(0)
        else:
            raise TunerError(f"scope {scope!r} cannot be allocated from the host")
        r = self._call(P.ALLOC, w.done(), 60.0, "ALLOC")
        mid = r.u32()
        r.end()
        return self._owned(Mem(mid, self.epoch, scope, shape, dtype), FREE_MEM)

    def view(self, pool, scope, physical_shape, dtype):
        return Mem(pool.id, pool.epoch, scope, tuple(int(v) for v in physical_shape), np.dtype(dtype),
                   owner=pool.owner or pool)

    def _region(self, mem: Mem) -> tuple:
        return (mem.physical_shape[1], mem.physical_shape[0]) if mem.is_texture else (0, 0)

    def upload(self, mem, host, staged: bool = False):
        self._check(mem)
        host = np.asarray(host)
        if tuple(host.shape) != mem.physical_shape:
            raise TunerError(f"upload of shape {tuple(host.shape)} into {mem.physical_shape}: shapes differ")
        data = np.ascontiguousarray(host, dtype=mem.dtype)
        w, h = self._region(mem)
        timeout = max(60.0, data.nbytes / 5e6)  # a slow link: 5 MB/s
        self._call(P.WRITE, P.Writer().u32(mem.id).u32(w).u32(h).bytes(memoryview(data).cast("B")).done(), timeout,
                   "WRITE").end()

    def download(self, mem, staged: bool = False):
        self._check(mem)
        w, h = self._region(mem)
        n = math.prod(mem.physical_shape) * mem.dtype.itemsize
        r = self._call(P.READ, P.Writer().u32(mem.id).u32(w).u32(h).u64(n).done(),
                       max(self.run_timeout, n / 5e6), "READ")
        data = r.bytes()
        r.end()
        if len(data) != n:
            raise AgentLinkError(f"{self.link.name} READ: {len(data)} bytes for {n}")
        return np.frombuffer(data, dtype=mem.dtype).reshape(mem.physical_shape).copy()

    def prepare(self, program, kernel, args, global_size, local_size):
        self._check(program, *args)
        g = [int(v) for v in global_size] + [1] * (3 - len(global_size))
        lo = [int(v) for v in local_size] if local_size else []
        lo = lo + [1] * (3 - len(lo)) if lo else [0, 0, 0]
        if len(g) != 3 or len(lo) != 3:
            raise TunerError(f"launch of {kernel}: global {tuple(global_size)}, local {tuple(local_size or ())}: at "
                             f"most 3 dimensions")
        w = P.Writer().u32(program.id).str(kernel).u32(len(args))
        for a in args:
            w.u32(a.id)
        for v in (*g, *lo):
            w.u32(v)
        r = self._call(P.KERNEL, w.done(), 60.0, "KERNEL")
        lid = r.u32()
        r.end()
        return self._owned(Handle(lid, self.epoch, refs=(program, *args)), FREE_LAUNCH)

    def _run(self, mode: int, launches, extra: bytes = b"", timeout: float | None = None) -> P.Reader:
        self._check(*launches)
        w = P.Writer().u32(mode).u32(len(launches))
        for h in launches:
            w.u32(h.id)
        return self._call(P.RUN, w.done() + extra, timeout or self.run_timeout, "RUN")

    def submit(self, launches):
        if launches:
            self._run(P.RUN_ONCE, launches).end()

    def finish(self):
        pass  # every request returns when the agent's queue has done it

    def profile(self, launches):
        if not launches:
            return []
        r = self._run(P.RUN_PROFILE, launches)
        out = [r.f64() for _ in range(r.u32())]
        r.end()
        return out

    def time(self, launches, warmup=1, repeats=5, min_seconds=0.0):
        extra = P.Writer().u32(warmup).u32(repeats).f64(min_seconds).u32(MAX_RUNS).done()
        r = self._run(P.RUN_TIME, launches, extra)
        out = [r.f64() for _ in range(r.u32())]
        r.end()
        return out


def _profile(text: str, where: str) -> DeviceInfo:
    from tuner.target import load_profile
    try:
        d = json.loads(text)
    except ValueError:
        raise P.ProtocolError(f"{where}: the device profile is not JSON") from None
    if isinstance(d, dict):
        d = {k: v for k, v in d.items() if k != "extensions"}
    return load_profile(d)
