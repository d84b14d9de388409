"""Conformance of the device agent (docs/agent-protocol.md) with the local backend: the same measurements,
the same error codes, the same answers. Each test runs on the local Measurer (worker processes on the
device) and on RuntimeRunner over AgentRuntime, the agent reached two ways: ``exec://build/native/tuner-agent``,
and ``adb://`` through the stand-in adb (tests/stand_in_adb.py: the agent pushed to a "phone" folder and started
there with its launch token on its standard input, the link a TCP connection with the HMAC challenge handshake);
the agent's ``?device=`` picks the same device by its ``tuner devices`` index. The tests: a good config, a build
error, a wrong answer, a kernel that never ends, a kernel that crashes its process, and (the agent, both links)
its link dropped mid-measurement.

The default device runs in every test; Intel's CPU runtime, where installed, too (marked slow: about 20 s
more). About 35 s (exec://) and 30 s more (adb://) on the default device here.

``TUNER_TEST_AGENT`` names another agent as exec:// takes it (``PATH [ARGS][?device=N]``: ``--stdio`` goes after
PATH), e.g. ``native/cross/arm64-agent``, the arm64 agent under qemu-aarch64 (native/cross/qemu-arm64.sh): then
the agent-side tests run on that agent and its own default device, and the local-backend ones are skipped (its
device is not one of this machine's, so there is no local twin to compare with). The adb:// runs then need
``TUNER_TEST_ADB_AGENT``, the agent program to push, and ``TUNER_TEST_ADB_RUN``, what the stand-in phone runs it
with (``native/cross/qemu-arm64.sh run`` and the linux-arm64 build: qemu-arm64.sh check sets both); without
them they are skipped. Without ``TUNER_TEST_AGENT`` they push this machine's build."""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path
import shutil
import signal
import threading
import time

import pytest

import tuner
from tuner.errors import ErrorCode, TunerError
from tuner.ir.builder import Builder
from tuner.ir.stmt import seq
from tuner.measure import MeasureInput, MeasureOptions, Measurer
from tuner.measure.runtime_runner import RuntimeRunner
from tuner.templates.conv2d_nchw4c import TEMPLATE as CONV2D
from tuner.templates.conv2d_nchw4c import conv2d_nchw4c

from tests import stand_in_adb

pytestmark = pytest.mark.skipif(shutil.which("make") is None or shutil.which("gcc") is None,
                                reason="the agent is built with make and gcc")


def _wild_store(wl, cfg):
    """Stores far outside the output (about 2 GiB past it): the kernel's process dies of SIGSEGV."""
    k = conv2d_nchw4c(wl, cfg)
    Y = k.params[-1]
    b = Builder()
    b.store(Y, (1 << 22, 0, 0, 0), 1.0)
    return k.replace(body=seq(b.get(), k.body))


KERNEL_CRASH = dataclasses.replace(CONV2D, build=_wild_store, space_file="conv2d")
CRASH = "tests.test_agent_conformance:KERNEL_CRASH"
COMPILE_ERROR = "tests.faulty_templates:COMPILE_ERROR"
WRONG_ANSWER = "tests.faulty_templates:WRONG_ANSWER"
RUN_FOREVER = "tests.faulty_templates:RUN_FOREVER"

# TUNER_TEST_RUN_TIMEOUT: a slower run deadline, for an agent under emulation (qemu: PoCL's LLVM specializes each
# kernel on its first run, which takes seconds there)
OPTIONS = MeasureOptions(build_timeout=120, run_timeout=float(os.environ.get("TUNER_TEST_RUN_TIMEOUT") or 4),
                         repeats=2, min_seconds=0.001, n_parallel=1)
WL = CONV2D.workload((1, 4, 6, 6), (4, 4, 3, 3), padding=1)


EXTERNAL_AGENT = os.environ.get("TUNER_TEST_AGENT", "").strip()
external_only = pytest.mark.skipif(bool(EXTERNAL_AGENT), reason="TUNER_TEST_AGENT: the agent side only")
# adb://: the agent program pushed to the stand-in phone, and what the phone runs it with (an emulator)
ADB_AGENT = os.environ.get("TUNER_TEST_ADB_AGENT", "").strip()
ADB_RUN = os.environ.get("TUNER_TEST_ADB_RUN", "").strip()
adb_agent_known = pytest.mark.skipif(bool(EXTERNAL_AGENT) and not ADB_AGENT,
                                     reason="TUNER_TEST_AGENT without TUNER_TEST_ADB_AGENT: no agent to push")


@pytest.fixture(scope="session")
def agent_path():
    """The agent as exec:// takes it: TUNER_TEST_AGENT, else this machine's build."""
    if EXTERNAL_AGENT:
        return EXTERNAL_AGENT
    from tuner.native import build
    return build()["agent"]


def _adb_runtime(folder: Path, agent_path: str, info=None):
    """AgentRuntime over adb:// through the stand-in adb: the agent pushed to the phone in ``folder`` and started
    there (under TUNER_TEST_ADB_RUN where set), with this machine's OpenCL environment."""
    from tuner.agent import AgentRuntime
    from tuner.native import opencl_env
    agent = ADB_AGENT or (None if EXTERNAL_AGENT else agent_path)
    env = stand_in_adb.install(folder, agent, ADB_RUN)
    cl = opencl_env()
    with pytest.MonkeyPatch.context() as mp:  # only while the agent starts: it takes the environment it starts with
        for k, v in env.items():
            mp.setenv(k, v)
        for k in ("TUNER_OPENCL_LIB", "OCL_ICD_VENDORS", "PYOPENCL_HOME"):
            if k in cl:
                mp.setenv(k, cl[k])
        mp.delenv("TUNER_AGENT_TOKEN", raising=False)  # adb:// makes its own, for the agent's standard input
        rt = AgentRuntime("adb://conformance" + ("" if info is None else f"?device={info.index}"))
    log = (folder / "phone" / "adb.log").read_text()
    assert "--token-fd 0" in log and rt.link.token not in log  # the token never on an adb command line
    return rt


def _local_index(which: str):
    from tuner.runtime.opencl.device import choose_device, list_devices
    if which == "default":
        return choose_device(None)
    found = [d for d in list_devices() if which in d.platform.lower() and d.type == "CPU"]
    if not found:
        pytest.skip(f"no {which} OpenCL device here")
    return found[0]


BACKENDS = [pytest.param(("local", "default"), marks=external_only), ("agent", "default"),
            pytest.param(("adb", "default"), marks=adb_agent_known),
            pytest.param(("local", "intel"), marks=[pytest.mark.slow, external_only]),
            pytest.param(("agent", "intel"), marks=[pytest.mark.slow, external_only])]


@pytest.fixture(scope="module", params=BACKENDS, ids=lambda p: "-".join(p))
def runner(request, agent_path, tmp_path_factory):
    kind, which = request.param
    info = None if EXTERNAL_AGENT else _local_index(which)
    if kind == "local":
        r = Measurer(info, OPTIONS)
        r.kind = "local"
    elif kind == "adb":
        rt = _adb_runtime(tmp_path_factory.mktemp("adb"), agent_path, info)
        assert info is None or rt.info.fingerprint == info.fingerprint
        r = RuntimeRunner(rt, OPTIONS)
        r.kind = "agent"
    else:
        from tuner.agent import AgentRuntime
        rt = AgentRuntime(f"exec://{agent_path}" if info is None else f"exec://{agent_path}?device={info.index}")
        assert info is None or rt.info.fingerprint == info.fingerprint  # the agent's profile is the local one
        r = RuntimeRunner(rt, OPTIONS)
        r.kind = "agent"
    yield r
    r.close()
    if kind in ("agent", "adb"):
        r.runtime.close()


def _measure(runner, *templates):
    # buffer scopes on every device: the faulty kernels store single floats, which a texture cannot take (a GPU's
    # fallback config keeps its operands in textures; lowering then refuses the faulty kernel as COMPILE)
    cfg = dataclasses.replace(CONV2D.fallback(WL, runner.info), input_scope="buffer", weight_scope="buffer",
                              output_scope="buffer")
    return runner.measure([MeasureInput(t, WL, cfg) for t in templates])


_good: dict = {}


def test_good_config_measured_and_checked(runner):
    res, = _measure(runner, "conv2d")
    assert res.ok, res.error_msg
    assert res.max_rel_error is not None and res.max_rel_error < 1e-4
    assert len(res.costs) >= OPTIONS.repeats and all(c > 0 for c in res.costs)
    seen = _good.setdefault(runner.info.fingerprint, {})
    seen[runner.kind] = res.max_rel_error
    if len(seen) == 2:  # the same kernel on the same device and inputs both ways: the same output, to the bit
        assert seen["local"] == seen["agent"], seen


def test_build_error_is_compile(runner):
    res, = _measure(runner, COMPILE_ERROR)
    assert res.error_code == ErrorCode.COMPILE and "no_such_opencl_builtin" in res.error_msg


def test_wrong_answer(runner):
    res, = _measure(runner, WRONG_ANSWER)
    assert res.error_code == ErrorCode.WRONG_ANSWER and res.max_rel_error > 1e-4, res.error_msg


def test_endless_kernel_times_out_then_the_next_config_measures(runner):
    start = time.monotonic()
    endless, good = _measure(runner, RUN_FOREVER, "conv2d")
    assert endless.error_code == ErrorCode.RUN_TIMEOUT, endless.error_msg
    assert good.ok, good.error_msg
    assert time.monotonic() - start < OPTIONS.run_timeout + 60


def test_crashing_kernel_is_unknown_then_the_next_config_measures(runner):
    """A CPU device's process dies of SIGSEGV; a GPU's driver reports the fault and loses the queue (NVIDIA:
    CL_INVALID_COMMAND_QUEUE). Either way the config is UNKNOWN and the next one runs in a fresh process that opens
    the device again (on NVIDIA the next config failed too, on both backends, before they started afresh)."""
    crash, good = _measure(runner, CRASH, "conv2d")
    assert crash.error_code == ErrorCode.UNKNOWN, crash.error_msg
    assert any(w in crash.error_msg for w in ("died", "crash", "device faulted")), crash.error_msg
    assert good.ok, good.error_msg


@pytest.mark.parametrize("via", ["exec", pytest.param("adb", marks=adb_agent_known)])
def test_agent_link_dropped_mid_measurement(agent_path, via, tmp_path):
    """kill -9 of the agent during a run: a clean AgentLinkError naming the link, at once (no hang); the
    executor does not outlive its supervisor."""
    from tuner.agent import AgentLinkError, AgentRuntime
    rt = AgentRuntime(f"exec://{agent_path}") if via == "exec" else _adb_runtime(tmp_path, agent_path)
    runner = RuntimeRunner(rt, dataclasses.replace(OPTIONS, run_timeout=60))
    pid = rt.link.pid if via == "exec" else _adb_agent_pid(rt.link.server.pid)
    executor = None
    try:
        killer = threading.Timer(1.5, os.kill, (pid, signal.SIGKILL))
        killer.start()
        start = time.monotonic()
        with pytest.raises(AgentLinkError) as e:
            _measure(runner, RUN_FOREVER)
        assert time.monotonic() - start < 30
        assert isinstance(e.value, TunerError)
        if via == "exec":
            assert "exec://" in str(e.value) and "link" in str(e.value) and "signal 9" in str(e.value)
        else:  # the phone's agent is not this host's child: the link (adb forward's TCP connection) ends
            assert "adb://conformance" in str(e.value) and "the link ended" in str(e.value)
        executor = rt.hello.get("executor_pid")
    finally:
        runner.close()
        rt.close()
    # the executor serving HELLO was replaced after nothing; any executor of this agent dies with it
    deadline = time.monotonic() + 10
    children = [p for p in os.listdir("/proc") if p.isdigit() and _parent(p) == pid]
    while children and time.monotonic() < deadline:
        time.sleep(0.1)
        children = [p for p in children if os.path.exists(f"/proc/{p}") and _parent(p) == pid]
    assert not children, f"executors {children} outlived the agent (pid {pid}); HELLO's was {executor}"


def _adb_agent_pid(root: int) -> int:
    """The stand-in phone's agent: the process nearest ``root`` (the `adb shell` of adb://) whose command line
    is the agent's (``tuner-agent ... --listen``), not a shell that starts it (its executor, a fork, is deeper)."""
    def cmdline(pid):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                return f.read().split(b"\0")
        except OSError:
            return []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        level = [str(root)]
        while level:
            for p in level:
                argv = cmdline(p)
                if argv and os.path.basename(argv[0]) not in (b"sh", b"dash", b"bash") \
                        and any(a.endswith(b"tuner-agent") for a in argv) and b"--listen" in argv:
                    return int(p)
            level = [c for c in os.listdir("/proc") if c.isdigit() and str(_parent(c)) in level]
        time.sleep(0.1)
    raise AssertionError(f"no agent process under the adb shell (pid {root})")


def _parent(pid: str) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return -1


@external_only
def test_local_worker_killed_mid_measurement():
    """The local backend's counterpart: its run worker killed -9 mid-run is a failed config (UNKNOWN), and
    the runner goes on."""
    m = Measurer(None, dataclasses.replace(OPTIONS, run_timeout=60))
    try:
        def kill():
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                proc = getattr(m.runner, "proc", None)
                if proc is not None and proc.poll() is None:
                    time.sleep(3.0)  # inside the endless run by now
                    os.kill(proc.pid, signal.SIGKILL)
                    return
                time.sleep(0.05)
        t = threading.Thread(target=kill)
        t.start()
        endless, good = _measure(m, RUN_FOREVER, "conv2d")
        t.join()
        assert endless.error_code == ErrorCode.UNKNOWN, endless.error_msg
        assert good.ok, good.error_msg
    finally:
        m.close()
