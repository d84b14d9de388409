"""The agent protocol's frames and bodies (docs/agent-protocol.md), checked as they arrive: a frame with
another magic or version, an oversized body, or a body with bytes missing or left over is a ProtocolError,
never a hang or a huge allocation."""
from __future__ import annotations

import struct
from dataclasses import dataclass

from tuner.errors import TunerError

MAGIC = b"TNR1"
VERSION = 1
HEADER = struct.Struct("<4sHHIIQ")  # magic, version, type, request id, deadline ms / status, body length
MAX_BODY = 1 << 30
MAX_STR = 16 << 20

HELLO, OPEN, BUILD, ALLOC, WRITE, READ, FREE, KERNEL, RUN, RESET, PING, BYE, SENSORS, CHALLENGE = range(1, 15)
NONCE = 32  # CHALLENGE's nonces (issue 54); HELLO then carries HMAC_PREFIX and the host's proof in hex
HMAC_PREFIX, AGENT_LABEL, HOST_LABEL = "hmac-sha256:", b"tuner-agent v1 agent", b"tuner-agent v1 host"
NAMES = {v: k for k, v in dict(HELLO=HELLO, OPEN=OPEN, BUILD=BUILD, ALLOC=ALLOC, WRITE=WRITE, READ=READ, FREE=FREE,
                               KERNEL=KERNEL, RUN=RUN, RESET=RESET, PING=PING, BYE=BYE, SENSORS=SENSORS,
                               CHALLENGE=CHALLENGE).items()}
RUN_ONCE, RUN_PROFILE, RUN_TIME = 0, 1, 2
BUILD_KEEP = 1  # BUILD flags: keep the program's binary in the agent's cache
SENSOR_CLOCK, SENSOR_TEMP = 1, 2  # SENSORS reply flags: which values the agent read
SENSOR_CLOCK_MAX_HZ = 10 ** 11  # the agent's bounds (native/src/agent.c; tuner.measure.sensors reads the same)
SENSOR_TEMP_MIN_C, SENSOR_TEMP_MAX_C = -60.0, 200.0
MAX_SENSOR_SOURCE = 2048  # characters of SENSORS' description of the nodes it read
OK, BAD_REQUEST, COMPILE, RUNTIME, TIMEOUT, CRASHED, NO_DEVICE, AUTH = range(8)
STATUS = {BAD_REQUEST: "BAD_REQUEST", COMPILE: "COMPILE", RUNTIME: "RUNTIME", TIMEOUT: "TIMEOUT",
          CRASHED: "CRASHED", NO_DEVICE: "NO_DEVICE", AUTH: "AUTH"}


class ProtocolError(TunerError):
    """A frame that breaks docs/agent-protocol.md (or a link that ended inside one)."""


@dataclass
class Frame:
    type: int
    request_id: int
    word: int  # deadline in ms (requests) or status (replies)
    body: bytes

    def encode(self) -> bytes:
        return HEADER.pack(MAGIC, VERSION, self.type, self.request_id, self.word, len(self.body)) + self.body


def parse_header(data: bytes) -> tuple:
    """``(type, request id, word, body length)`` of a 24-byte header, checked."""
    magic, version, typ, rid, word, n = HEADER.unpack(data)
    if magic != MAGIC:
        raise ProtocolError(f"not an agent frame (magic {magic!r}): is the other end a tuner-agent?")
    if version != VERSION:
        raise ProtocolError(f"the agent speaks protocol version {version}, this tuner {VERSION}: rebuild the agent "
                            f"with `tuner native build` and push it again")
    if n > MAX_BODY:
        raise ProtocolError(f"frame body of {n} bytes, more than the {MAX_BODY} allowed")
    return typ, rid, word, n


class Writer:
    """A body, field by field."""

    def __init__(self):
        self.parts: list = []

    def u32(self, v: int) -> "Writer":
        self.parts.append(struct.pack("<I", v))
        return self

    def u64(self, v: int) -> "Writer":
        self.parts.append(struct.pack("<Q", v))
        return self

    def f64(self, v: float) -> "Writer":
        self.parts.append(struct.pack("<d", v))
        return self

    def str(self, s: str) -> "Writer":
        b = s.encode()
        self.parts.append(struct.pack("<I", len(b)) + b)
        return self

    def bytes(self, b) -> "Writer":
        b = bytes(b) if not isinstance(b, (bytes, bytearray, memoryview)) else b
        self.parts.append(struct.pack("<Q", len(b)))
        self.parts.append(b)
        return self

    def done(self) -> bytes:
        return b"".join(bytes(p) for p in self.parts)


class Reader:
    """A body read field by field; running past its end, or ``end()`` with bytes left, is a ProtocolError."""

    def __init__(self, body: bytes, what: str):
        self.b, self.i, self.what = memoryview(body), 0, what

    def _take(self, n: int) -> memoryview:
        if n > len(self.b) - self.i:
            raise ProtocolError(f"{self.what}: the reply ends early ({len(self.b)} bytes)")
        v = self.b[self.i:self.i + n]
        self.i += n
        return v

    def u32(self) -> int:
        return struct.unpack("<I", self._take(4))[0]

    def u64(self) -> int:
        return struct.unpack("<Q", self._take(8))[0]

    def f64(self) -> float:
        return struct.unpack("<d", self._take(8))[0]

    def str(self) -> str:
        n = self.u32()
        if n > MAX_STR:
            raise ProtocolError(f"{self.what}: a string of {n} bytes")
        try:
            return bytes(self._take(n)).decode()
        except UnicodeDecodeError:
            raise ProtocolError(f"{self.what}: a string that is not UTF-8") from None

    def bytes(self) -> bytes:
        return bytes(self._take(self.u64()))

    def end(self) -> None:
        if self.i != len(self.b):
            raise ProtocolError(f"{self.what}: {len(self.b) - self.i} bytes left over in the reply")


def parse_sensors(r: Reader) -> tuple:
    """SENSORS' reply body, checked: ``(GPU clock in Hz or None, degrees C or None, the nodes read)``. A flag
    this tuner does not know, a value beside a flag that says there is none, a clock or a temperature out of
    the agent's bounds, or a description longer than ``MAX_SENSOR_SOURCE`` is a ProtocolError: a reading
    that goes into the log is checked where it enters."""
    flags, hz, temp, source = r.u32(), r.u64(), r.f64(), r.str()
    r.end()
    if flags & ~(SENSOR_CLOCK | SENSOR_TEMP):
        raise ProtocolError(f"{r.what}: unknown flags {flags:#x} (1: clock, 2: temperature)")
    if flags & SENSOR_CLOCK:
        if not 1 <= hz <= SENSOR_CLOCK_MAX_HZ:
            raise ProtocolError(f"{r.what}: a GPU clock of {hz} Hz (at most {SENSOR_CLOCK_MAX_HZ:g})")
    elif hz:
        raise ProtocolError(f"{r.what}: a GPU clock of {hz} Hz without the clock flag")
    if flags & SENSOR_TEMP:
        if not SENSOR_TEMP_MIN_C <= temp <= SENSOR_TEMP_MAX_C:  # NaN fails too
            raise ProtocolError(f"{r.what}: a temperature of {temp!r} C (from {SENSOR_TEMP_MIN_C:g} to "
                                f"{SENSOR_TEMP_MAX_C:g})")
    elif temp != 0.0:
        raise ProtocolError(f"{r.what}: a temperature of {temp!r} C without the temperature flag")
    if len(source) > MAX_SENSOR_SOURCE or not source.isprintable():
        raise ProtocolError(f"{r.what}: the description of the nodes read is not a short printable text")
    return (hz if flags & SENSOR_CLOCK else None), (float(temp) if flags & SENSOR_TEMP else None), source
