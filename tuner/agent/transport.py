"""Byte streams to a device agent (docs/agent-protocol.md, Transports): a child's stdin and stdout
(``exec://``), TCP (``tcp://``), and TCP through ``adb forward`` to an agent ``adb`` started on a phone
(``adb://``). Each offers ``send``, ``recv_exact(n, timeout)`` and ``close``; a link that ends or stalls
is an AgentLinkError naming the transport and what to do."""
from __future__ import annotations

import errno
import os
import selectors
import stat
import secrets
import shlex
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from tuner.errors import TunerError

SCHEMES = ("exec", "tcp", "adb")
ANDROID_DIR = "/data/local/tmp/tuner"
AGENT_PORT = 7390  # the agent's port on the phone (adb://); $TUNER_AGENT_PORT changes it
TOKEN_MIN, TOKEN_MAX = 16, 1024  # bytes, as the agent checks them
_env_token: str | None = None  # $TUNER_AGENT_TOKEN, once read (and removed from the environment)


class AgentLinkError(TunerError):
    """The link to an agent could not be made, or ended."""


def is_agent_spec(spec) -> bool:
    return isinstance(spec, str) and spec.split("://", 1)[0] in SCHEMES and "://" in spec


def parse_spec(spec: str) -> tuple:
    """``(scheme, target, options)``: ``exec://PATH [ARGS]``, ``tcp://HOST:PORT``, ``adb://[SERIAL]``, each
    with an optional ``?device=N&token_file=PATH&timeout=S`` (``device``: an index or a name; ``token=T`` is
    still read, but it stands on the command line where every local user sees it)."""
    scheme, rest = spec.split("://", 1)
    target, _, query = rest.partition("?")
    opts = {k: v[-1] for k, v in parse_qs(query, keep_blank_values=True).items()}
    unknown = set(opts) - {"device", "token", "token_file", "timeout"}
    if unknown:
        raise TunerError(f"--device {spec!r}: unknown option {sorted(unknown)[0]!r}; the options are device=N, "
                         f"token_file=PATH and timeout=SECONDS")
    if "token" in opts and "token_file" in opts:
        raise TunerError(f"--device {spec!r}: give one of token_file=PATH and token=T (token_file: the token stays "
                         f"off the command line)")
    if "token_file" in opts and not opts["token_file"].strip():
        raise TunerError(f"--device {spec!r}: token_file= needs the path of a file that holds the token (chmod 600)")
    if "device" in opts and not opts["device"].strip():
        raise TunerError(f"--device {spec!r}: device= needs a device index (as `tuner devices` numbers them on the "
                         f"agent's machine) or a name")
    if "timeout" in opts:
        try:
            ok = 0 < float(opts["timeout"]) <= 86400  # NaN compares false; inf and 1e400 are too many
        except ValueError:
            ok = False
        if not ok:
            raise TunerError(f"--device {spec!r}: timeout={opts['timeout']!r} is not a number of seconds above 0 and "
                             f"at most 86400")
    if scheme == "exec" and not target.strip():
        raise TunerError("--device exec://PATH needs the agent's path, e.g. exec://build/native/tuner-agent")
    if scheme == "tcp":
        try:
            u = urlsplit(f"tcp://{target}")  # raises ValueError itself on an unclosed '[' (IPv6)
            if not u.hostname or u.port is None:
                raise ValueError
        except ValueError:
            raise TunerError(f"--device {spec!r}: write tcp://HOST:PORT, e.g. tcp://127.0.0.1:7390") from None
    return scheme, target, opts


def _check_token(tok: str, where: str) -> str:
    """The token as the agent takes it: one line of printable ASCII, TOKEN_MIN to TOKEN_MAX bytes."""
    if len(tok) > TOKEN_MAX or not all("!" <= c <= "~" for c in tok):
        raise TunerError(f"{where}: the token must be one line of printable ASCII without spaces, at most "
                         f"{TOKEN_MAX} bytes")
    if len(tok) < TOKEN_MIN:
        raise TunerError(f"{where}: the token has {len(tok)} bytes; it needs at least {TOKEN_MIN} (make one with "
                         f"`python3 -c \"import secrets; print(secrets.token_urlsafe(24))\"`)")
    return tok


def read_token_file(path: str) -> str:
    """The token in ``path``: a regular file of this user's that no one else can read (0600 or 0400), opened
    without following a symbolic link and without waiting on a FIFO, one line of at most TOKEN_MAX bytes."""
    where = f"token_file={path}"
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
                     | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        why = "a symbolic link is not read" if e.errno == errno.ELOOP else e.strerror
        raise TunerError(f"{where}: {why}; give a file that holds the token, made with `umask 077`") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise TunerError(f"{where}: not a regular file")
        if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
            raise TunerError(f"{where}: the file belongs to another user (uid {st.st_uid}); it must be your own")
        if st.st_mode & 0o077:
            raise TunerError(f"{where}: the file is readable or writable by group or others (mode "
                             f"{stat.S_IMODE(st.st_mode):04o}); run `chmod 600 {path}`")
        if st.st_size > TOKEN_MAX + 2:
            raise TunerError(f"{where}: {st.st_size} bytes; a token file holds one line of at most {TOKEN_MAX} bytes")
        data = os.read(fd, TOKEN_MAX + 3)
    finally:
        os.close(fd)
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise TunerError(f"{where}: the token must be printable ASCII") from None
    return _check_token(text.removesuffix("\n").removesuffix("\r"), where)


def env_token() -> str | None:
    """``$TUNER_AGENT_TOKEN``: read once and removed from the environment, so that no child (a compiler, an
    ``exec://`` agent) inherits it; later calls return what was read."""
    global _env_token
    v = os.environ.pop("TUNER_AGENT_TOKEN", None)
    if v:
        _env_token = _check_token(v.strip(), "$TUNER_AGENT_TOKEN")
    return _env_token


def spec_token(spec: str, opts: dict) -> str | None:
    """The token a spec names: ``token_file=PATH``, else ``token=T`` (kept for old command lines; it stands in
    /proc/PID/cmdline, where every local user reads it), else None."""
    if opts.get("token_file"):
        return read_token_file(opts["token_file"])
    if opts.get("token"):
        return _check_token(opts["token"], f"--device {spec.split('?', 1)[0]}?token=...")
    return None


class _Stream:
    """The receive side shared by the transports: reads exactly n bytes, or fails naming the link."""

    name = "agent"

    def _read(self, n: int) -> bytes:  # pragma: no cover - per transport
        raise NotImplementedError

    def _wait(self, timeout: float) -> bool:  # pragma: no cover - per transport
        raise NotImplementedError

    def recv_exact(self, n: int, timeout: float | None) -> bytes:
        buf = bytearray()
        deadline = None if timeout is None else time.monotonic() + timeout
        while len(buf) < n:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0 or not self._wait(left):
                raise AgentLinkError(f"{self.name}: no reply within {timeout:.0f} s; the link or the agent stalled "
                                     f"(a re-run resumes from the log)")
            chunk = self._read(n - len(buf))
            if not chunk:
                raise AgentLinkError(f"{self.name}: the link ended{self._why()}; check the agent and reconnect "
                                     f"(a re-run resumes from the log)")
            buf += chunk
        return bytes(buf)

    def _why(self) -> str:
        return ""


class ExecTransport(_Stream):
    """``PATH --stdio [ARGS]`` as a child process; its stderr goes to a log file named in errors. It runs with a
    token made for this launch (``TUNER_AGENT_TOKEN`` in its environment, or ``token`` when the spec gives one),
    which the host's HELLO then proves: no agent link goes unauthenticated, pipes included."""

    def __init__(self, command: str, token: str | None = None):
        try:
            argv = shlex.split(command)
        except ValueError as e:  # an unbalanced quote
            raise AgentLinkError(f"exec://{command}: cannot split the command ({e}); quote it as a shell would")
        if not argv:
            raise AgentLinkError("--device exec://PATH needs the agent's path, e.g. exec://build/native/tuner-agent")
        exe = shutil.which(argv[0]) or argv[0]
        if not os.path.isfile(exe) or not os.access(exe, os.X_OK):
            raise AgentLinkError(f"exec://{command}: no agent program at {argv[0]!r}; build it with "
                                 f"`tuner native build` (it prints `agent PATH`)")
        self.log = tempfile.NamedTemporaryFile(prefix="tuner-agent-", suffix=".log", delete=False)
        self.name = f"agent exec://{command} (its log: {self.log.name})"
        self.token = token or secrets.token_urlsafe(24)
        from tuner.native import opencl_env
        try:
            # OpenCL from the Python wheels here (tuner.native.opencl_env) unless TUNER_OPENCL_LIB says where;
            # a session of its own: Ctrl-C reaches the tuner, which ends the agent by closing its stdin
            self.proc = subprocess.Popen([exe, "--stdio", *argv[1:]], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=self.log, bufsize=0,
                                         env={**opencl_env(), "TUNER_AGENT_TOKEN": self.token},
                                         start_new_session=True)
        except OSError as e:
            raise AgentLinkError(f"exec://{command}: cannot start the agent: {e.strerror or e}") from None
        self.pid = self.proc.pid
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.proc.stdout, selectors.EVENT_READ)

    def send(self, data: bytes) -> None:
        try:
            self.proc.stdin.write(data)
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            raise AgentLinkError(f"{self.name}: the agent is gone{self._why()}") from None

    def _wait(self, timeout):
        return bool(self.sel.select(timeout))

    def _read(self, n):
        return os.read(self.proc.stdout.fileno(), min(n, 1 << 20))

    def _why(self) -> str:
        try:
            code = self.proc.wait(timeout=1)
        except subprocess.TimeoutExpired:
            return ""
        how = f"killed by signal {-code}" if code < 0 else f"exited with status {code}"
        return f" (the agent {how}; its log: {self.log.name})"

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired, ValueError):
                self.proc.kill()
                self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except (OSError, ValueError):
                pass
        self.sel.close()
        self.log.close()


class TcpTransport(_Stream):
    def __init__(self, host: str, port: int, connect_timeout: float = 10.0, label: str | None = None):
        self.name = label or f"agent tcp://{host}:{port}"
        self.pid = None
        try:
            self.sock = socket.create_connection((host, port), timeout=connect_timeout)
        except OSError as e:
            raise AgentLinkError(f"{self.name}: cannot connect ({e.strerror or e}); start it there with "
                                 f"`tuner-agent --listen {host}:{port}`") from None
        if self.sock.getsockname() == self.sock.getpeername():
            # TCP's simultaneous open: with nothing listening yet on a local port in the ephemeral range, the
            # connect can pick that very port as its own and reach itself; no agent answers such a link
            self.sock.close()
            raise AgentLinkError(f"{self.name}: cannot connect (nothing listens there yet); start it there with "
                                 f"`tuner-agent --listen {host}:{port}`")
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.settimeout(None)
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.sock, selectors.EVENT_READ)

    def send(self, data: bytes) -> None:
        try:
            self.sock.sendall(data)
        except OSError as e:
            raise AgentLinkError(f"{self.name}: the link ended ({e.strerror or e})") from None

    def _wait(self, timeout):
        return bool(self.sel.select(timeout))

    def _read(self, n):
        try:
            return self.sock.recv(min(n, 1 << 20))
        except OSError:
            return b""

    def close(self) -> None:
        self.sel.close()
        self.sock.close()


def agent_port() -> int:
    try:
        return int(os.environ.get("TUNER_AGENT_PORT") or AGENT_PORT)
    except ValueError:
        raise TunerError(f"$TUNER_AGENT_PORT={os.environ['TUNER_AGENT_PORT']!r} is not a port number") from None


def _adb(serial: str | None) -> list:
    adb = os.environ.get("ADB") or shutil.which("adb")
    if not adb:
        raise AgentLinkError("adb:// needs the adb program: install Android platform-tools (or Debian's adb) or "
                             "set $ADB to its path")
    return [adb, *(["-s", serial] if serial else [])]


def _run(cmd: list, what: str, timeout: float = 60) -> str:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise AgentLinkError(f"{what}: `{' '.join(cmd)}` failed ({e})") from None
    if p.returncode != 0:
        raise AgentLinkError(f"{what}: `{' '.join(cmd)}` exited {p.returncode}: {(p.stderr or p.stdout).strip()[-500:]}")
    return p.stdout


class AdbTransport(TcpTransport):
    """Push the agent built for Android (``agent``: its path on this host), start it on the phone listening on
    loopback, forward a free host port to it, and connect."""

    def __init__(self, serial: str | None, agent: str | None):
        adb = _adb(serial)
        where = f"adb://{serial or ''}"
        if agent is None or not Path(agent).is_file():
            raise AgentLinkError(f"{where}: no agent built for the phone; build it with `tuner native build --target "
                                 f"android-arm64 --ndk DIR` and set $TUNER_AGENT_ANDROID to the path it prints")
        _run([*adb, "shell", f"mkdir -p {ANDROID_DIR}"], where)
        _run([*adb, "push", agent, f"{ANDROID_DIR}/tuner-agent"], where, timeout=300)
        _run([*adb, "shell", f"chmod 755 {ANDROID_DIR}/tuner-agent"], where)
        remote = agent_port()
        # --once: the agent exits when this connection ends, so that no agent outlives its tuner on the phone.
        # A token made for this launch: every app on the phone reaches the forwarded loopback port, and one that
        # connects first gets nothing (and does not end the agent) without it.
        self.token = secrets.token_urlsafe(24)
        self.log = tempfile.NamedTemporaryFile(prefix="tuner-agent-adb-", suffix=".log", delete=False)
        # The token goes to the agent's standard input (--token-fd 0), never into the `adb shell` command line,
        # which every user of this host (ps) and every app of the phone could read.
        self.server = subprocess.Popen([*adb, "shell", f"{ANDROID_DIR}/tuner-agent --listen 127.0.0.1:{remote} "
                                        f"--once --token-fd 0 --work-dir {ANDROID_DIR}"],
                                       stdin=subprocess.PIPE, stdout=self.log, stderr=self.log,
                                       start_new_session=True)
        self.adb, self.port = adb, None
        try:
            try:
                self.server.stdin.write(f"{self.token}\n".encode())
                self.server.stdin.flush()
            except OSError:
                pass  # adb ended at once: its status and output are reported below
            out = _run([*adb, "forward", "tcp:0", f"tcp:{remote}"], where).strip()
            port = int(out) if out.isdigit() else 0
            if not port:
                raise AgentLinkError(f"{where}: `adb forward tcp:0 tcp:{remote}` gave no port ({out[:100]!r})")
            self.port = port
            last = None
            for _ in range(100):  # the agent needs a moment to listen
                if self.server.poll() is not None:
                    raise AgentLinkError(f"{where}: the agent on the phone exited with status {self.server.returncode} "
                                         f"(its output: {self.log.name})")
                try:
                    super().__init__("127.0.0.1", port, connect_timeout=2.0,
                                     label=f"agent {where} (forwarded 127.0.0.1:{port} -> phone:{remote})")
                    return
                except AgentLinkError as e:
                    last = e
                    time.sleep(0.1)
            raise last
        except BaseException:
            self._stop()
            raise

    def _stop(self) -> None:
        if self.port:
            subprocess.run([*self.adb, "forward", "--remove", f"tcp:{self.port}"], capture_output=True, timeout=30)
        if self.server.poll() is None:
            try:  # --once: with the connection closed the agent ends by itself once it has released the device
                self.server.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.server.terminate()
                try:
                    self.server.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self.server.kill()
                    self.server.wait()
        try:
            self.server.stdin.close()
        except OSError:
            pass
        self.log.close()

    def close(self) -> None:
        super().close()
        self._stop()


def connect(spec: str):
    """A transport for an agent spec, and its options."""
    scheme, target, opts = parse_spec(spec)
    if scheme == "exec":
        link = ExecTransport(target, spec_token(spec, opts))
        return link, {**opts, "token": link.token}
    if scheme == "tcp":
        u = urlsplit(f"tcp://{target}")
        token = spec_token(spec, opts) or env_token()
        link = TcpTransport(u.hostname, u.port)
        return link, {**opts, "token": token or ""}
    agent = os.environ.get("TUNER_AGENT_ANDROID")
    if not agent:  # what `tuner native build --target android-arm64` writes
        from tuner.native import default_build_dir
        built = default_build_dir() / "android-arm64" / "tuner-agent"
        agent = str(built) if built.is_file() else None
    link = AdbTransport(target or None, agent)
    return link, {**opts, "token": link.token}  # the token it started the agent with
