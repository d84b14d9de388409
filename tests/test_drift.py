"""Measurements a phone can be trusted for (issue 53, item 5): the GPU clock and the temperature read from sysfs
(tuner.measure.sensors, and the agent's SENSORS on the same nodes), carried by every result and record, and
``DriftGuard``: a reference config re-timed every N measurements and every measurement's clock compared with the
baseline's; on a drift it waits for the device and redoes what was measured since the last good check, and the
log then counts the redone measurements instead of the drifted ones. The end-to-end test drops the fake clock
in the middle of a tune through the C agent under exec:// and shows the drift detected, the wait, the redo."""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from pathlib import Path

import pytest

import tuner
from tuner.errors import ErrorCode, TunerError
from tuner.logs import Record, append_records, apply_history_best, best_records, load_records
from tuner.logs.index import LogIndex, current
from tuner.logs.io import find_records
from tuner.logs.record import InvalidRecordError
from tuner.measure import MeasureInput, MeasureOptions, MeasureResult, Runner
from tuner.measure import sensors as S
from tuner.measure.drift import DriftGuard
from tuner.measure.runner import now
from tuner.search.loop import record_of
from tuner.target import load_profile

PROFILE = {"index": 0, "platform": "ARM Platform", "name": "Mali-G78", "type": "GPU",
           "driver_version": "v1.r32p1", "opencl_version": "OpenCL 3.0 v1.r32p1", "image_support": True,
           "image2d_max_width": 65536, "image2d_max_height": 65536, "max_work_group_size": 512,
           "max_work_item_sizes": [512, 512, 512], "local_mem_bytes": 32768, "global_mem_bytes": 7 << 30,
           "max_mem_alloc_bytes": 1 << 30, "compute_units": 20, "fp16": True, "half_images": True}
HIGH, LOW = 585_000_000, 257_000_000
agent = pytest.mark.skipif(shutil.which("make") is None or shutil.which("gcc") is None,
                           reason="the agent is built with make and gcc")


# -- a fake sysfs -------------------------------------------------------------------------------------------

def write(root: Path, rel: str, text) -> Path:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(f"{text}\n")
    os.replace(tmp, p)  # atomic: a reader (the agent) never sees a half-written node
    return p


def zone(root: Path, n: int, kind: str, milli) -> None:
    write(root, f"sys/class/thermal/thermal_zone{n}/type", kind)
    write(root, f"sys/class/thermal/thermal_zone{n}/temp", milli)


def phone(root: Path, clock=HIGH, gpu_milli=41_000) -> Path:
    """An Adreno phone: kgsl's gpuclk, a CPU zone hotter than the GPU zone, and a zone that reads garbage."""
    write(root, "sys/class/kgsl/kgsl-3d0/gpuclk", clock)
    zone(root, 0, "cpu-0-0-usr", 55_000)
    zone(root, 1, "gpuss-0-usr", gpu_milli)
    zone(root, 2, "battery", "garbage")
    return root


# -- sensors ------------------------------------------------------------------------------------------------

def test_adreno_kgsl_and_the_gpu_zone(tmp_path):
    r = S.read(phone(tmp_path))
    assert r.gpu_clock_hz == HIGH
    assert r.temp_c == 41.0  # the GPU zone, though the CPU zone is hotter
    assert r.source == "sys/class/kgsl/kgsl-3d0/gpuclk; sys/class/thermal/thermal_zone1/temp (gpu)"


def test_adreno_devfreq_when_gpuclk_is_absent_or_garbage(tmp_path):
    write(tmp_path, "sys/class/kgsl/kgsl-3d0/gpuclk", "fast")
    write(tmp_path, "sys/class/kgsl/kgsl-3d0/devfreq/cur_freq", 400_000_000)
    assert S.read(tmp_path).gpu_clock_hz == 400_000_000


def test_mali_devfreq(tmp_path):
    write(tmp_path, "sys/class/misc/mali0/device/devfreq/13000000.mali/cur_freq", 848_000_000)
    write(tmp_path, "sys/class/devfreq/soc:gpu/cur_freq", 1)  # Mali's comes first
    r = S.read(tmp_path)
    assert r.gpu_clock_hz == 848_000_000 and "mali0" in r.source


def test_generic_devfreq_named_like_a_gpu(tmp_path):
    write(tmp_path, "sys/class/devfreq/ddr/cur_freq", 2_000_000_000)  # not a GPU
    write(tmp_path, "sys/class/devfreq/fb000000.GPU/cur_freq", 800_000_000)
    assert S.read(tmp_path).gpu_clock_hz == 800_000_000


def test_every_zone_when_none_names_a_gpu(tmp_path):
    zone(tmp_path, 0, "cpu", 47_500)
    zone(tmp_path, 1, "skin", 33_000)
    zone(tmp_path, 10, "modem", -5_000)
    r = S.read(tmp_path)
    assert r.temp_c == 47.5 and r.gpu_clock_hz is None and r.source == "sys/class/thermal/thermal_zone0/temp"


@pytest.mark.parametrize("text", ["", "abc", "12 34", "0x1f", "-5", "0", "9" * 30, "1e9", "585000000 Hz",
                                  str(10 ** 12)])
def test_a_clock_that_is_no_clock_is_none(tmp_path, text):
    write(tmp_path, "sys/class/kgsl/kgsl-3d0/gpuclk", text)
    assert S.read(tmp_path).gpu_clock_hz is None


@pytest.mark.parametrize("text", ["", "hot", "-273150", "6553500", "41.5"])
def test_a_temperature_out_of_range_or_garbage_is_none(tmp_path, text):
    zone(tmp_path, 0, "gpu", text)
    assert S.read(tmp_path).temp_c is None


def test_nothing_there_is_an_empty_reading(tmp_path):
    assert S.read(tmp_path) == S.Reading() and S.read(tmp_path / "missing") == S.Reading()
    assert S.Reading().empty and S.Reading().describe() == "no sensors"


def test_the_environment_names_the_root(tmp_path, monkeypatch):
    phone(tmp_path)
    monkeypatch.setenv(S.ENV, str(tmp_path))
    assert S.read().gpu_clock_hz == HIGH
    assert S.root_dir() == str(tmp_path) and S.root_dir("/x") == "/x"


def test_a_fifo_a_folder_or_a_huge_node_never_blocks_nor_raises(tmp_path):
    node = tmp_path / "sys/class/kgsl/kgsl-3d0/gpuclk"
    node.parent.mkdir(parents=True)
    os.mkfifo(node)  # no writer: a blocking open would hang forever
    t0 = time.monotonic()
    assert S.read(tmp_path).gpu_clock_hz is None
    assert time.monotonic() - t0 < 5
    node.unlink()
    node.mkdir()
    assert S.read(tmp_path).gpu_clock_hz is None
    node.rmdir()
    node.write_text("5" * 100 + " " * 1000)  # longer than a node holds
    assert S.read_node(str(node)) is None and S.read(tmp_path).gpu_clock_hz is None


def test_the_bounds_agree_with_the_record_and_the_protocol():
    from tuner.agent import protocol as P
    from tuner.logs import record as R
    assert S.CLOCK_MAX_HZ == R.CLOCK_MAX_HZ == P.SENSOR_CLOCK_MAX_HZ
    assert (S.TEMP_MIN_C, S.TEMP_MAX_C) == (R.TEMP_MIN_C, R.TEMP_MAX_C) == (P.SENSOR_TEMP_MIN_C,
                                                                           P.SENSOR_TEMP_MAX_C)


# -- the agent's SENSORS --------------------------------------------------------------------------------------

TREES = {
    "adreno": phone,
    "mali": lambda r: (write(r, "sys/class/misc/mali0/device/devfreq/gpufreq/cur_freq", 848_000_000),
                       zone(r, 3, "gpu0-thermal", 52_300), zone(r, 4, "gpu1-thermal", 52_300), r)[-1],
    "devfreq": lambda r: (write(r, "sys/class/devfreq/13000000.gpu/cur_freq", " 300000000 "),
                          zone(r, 0, "soc", 38_000), zone(r, 1, "soc2", "x"), r)[-1],
    "garbage": lambda r: (write(r, "sys/class/kgsl/kgsl-3d0/gpuclk", "-1"), zone(r, 0, "gpu", "1e5"), r)[-1],
    "none": lambda r: r,
}


@agent
def test_the_agent_reads_what_the_host_reads(native, cl_env, tmp_path):
    """The C agent (``--sysfs-root``; SENSORS is the supervisor's, no device opened) and tuner.measure.sensors
    read the same nodes the same way, tree after tree under one agent."""
    from tuner.agent import protocol as P
    from test_agent import RawAgent
    root = tmp_path / "sysfs"
    root.mkdir()
    a = RawAgent(native["agent"], dict(cl_env, TUNER_SYSFS_ROOT=str(root)), tmp_path)  # the root, as --sysfs-root
    for name in sorted(TREES):
        shutil.rmtree(root)
        root.mkdir()
        TREES[name](root)
        status, body = a.call(P.SENSORS)
        assert status == P.OK, name
        host = S.read(root)
        assert P.parse_sensors(P.Reader(body, "SENSORS")) == (host.gpu_clock_hz, host.temp_c, host.source), name
    assert a.finish()[0] == 0


NODE_TEXTS = [b"585000000\n", b"  41000  ", b"-5000", b"+7", b"0", b"", b"\n", b"12\x0034", b"\xff\xfe", b"1e9",
              b"9" * 18, b"9" * 19, b"0" * 17 + b"1", b"- 5", b"5 5", b"41000\t\r\n", b"\x0b42\x0c", b"x" * 300,
              b"7" * 257, b"3\n4"]


@agent
def test_random_nodes_read_the_same_in_c_and_python(native, cl_env, tmp_path):
    """Random node contents (garbage, NUL bytes, signs, lengths at and past the limits, zone types with and
    without a GPU, a FIFO): the ASan agent and tuner.measure.sensors agree on every one, and the agent reports
    nothing under AddressSanitizer + UBSan."""
    import random
    from tuner.agent import protocol as P
    from test_agent import RawAgent, _asan_env, _sanitizer_reports
    root = tmp_path / "sysfs"
    root.mkdir()
    a = RawAgent(native["agent_asan"], dict(_asan_env(cl_env), TUNER_SYSFS_ROOT=str(root)), tmp_path)
    rnd = random.Random(53)
    kinds = set()
    paths = ["sys/class/kgsl/kgsl-3d0/gpuclk", "sys/class/kgsl/kgsl-3d0/devfreq/cur_freq",
             "sys/class/misc/mali0/device/devfreq/a/cur_freq", "sys/class/devfreq/x-gpu/cur_freq"]
    for i in range(120):
        shutil.rmtree(root)
        root.mkdir()
        for rel in rnd.sample(paths, rnd.randrange(len(paths) + 1)):
            p = root / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            if rnd.random() < 0.05:
                os.mkfifo(p)
            else:
                p.write_bytes(rnd.choice(NODE_TEXTS + [str(rnd.randrange(-10 ** 6, 10 ** 12)).encode()]))
        for z in rnd.sample(range(12), rnd.randrange(5)):
            d = root / f"sys/class/thermal/thermal_zone{z}"
            d.mkdir(parents=True)
            (d / "temp").write_bytes(rnd.choice(NODE_TEXTS + [str(rnd.randrange(-70_000, 210_000)).encode()]))
            (d / "type").write_bytes(rnd.choice([b"gpu-usr", b"GPU0", b"cpu", b"x\x00gpu", b"skin", b"\xffgpu"]))
        status, body = a.call(P.SENSORS)
        assert status == P.OK
        host = S.read(root)
        kinds.add((host.gpu_clock_hz is None, host.temp_c is None, "(gpu)" in host.source))
        assert P.parse_sensors(P.Reader(body, "SENSORS")) == (host.gpu_clock_hz, host.temp_c, host.source), \
            (i, sorted(str(p.relative_to(root)) for p in root.rglob("*")))
        if i % 10 == 0:  # and a body the agent must refuse, the link staying
            status, body = a.call(P.SENSORS, bytes(rnd.randrange(1, 40)))
            assert status == P.BAD_REQUEST
    code, log = a.finish()
    assert code == 0 and not _sanitizer_reports(log), log[-3000:]
    assert len(kinds) == 6, kinds  # clock or none, by temperature: none, a GPU zone's, any zone's


@agent
def test_sensors_through_the_asan_agent_and_bad_bodies(native, cl_env, tmp_path):
    """SENSORS under AddressSanitizer: answered by the supervisor (no device opened), a body with bytes is
    BAD_REQUEST and the link stays; a reply the host would refuse is a ProtocolError."""
    import subprocess
    from tuner.agent import protocol as P
    from test_agent import RawAgent, _asan_env, _sanitizer_reports
    root = phone(tmp_path / "sysfs")
    env = dict(_asan_env(cl_env), TUNER_SYSFS_ROOT=str(root))
    a = RawAgent(native["agent_asan"], env, tmp_path)
    status, body = a.call(P.SENSORS)
    assert status == P.OK
    assert P.parse_sensors(P.Reader(body, "SENSORS")) == (HIGH, 41.0, S.read(root).source)
    status, body = a.call(P.SENSORS, b"\0")
    assert status == P.BAD_REQUEST and "left over" in P.Reader(body, "t").str()
    (root / "sys/class/kgsl/kgsl-3d0/gpuclk").unlink()
    os.mkfifo(root / "sys/class/kgsl/kgsl-3d0/gpuclk")  # never waited on
    status, body = a.call(P.SENSORS)
    assert status == P.OK and P.parse_sensors(P.Reader(body, "SENSORS"))[0] is None
    assert a.call(P.PING) == (P.OK, b"")
    code, log = a.finish()
    assert code == 0 and not _sanitizer_reports(log), log
    r = subprocess.run([native["agent"], "--stdio", "--sysfs-root", str(tmp_path / "nowhere")], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 2 and "--sysfs-root" in r.stderr and "not a folder" in r.stderr
    for bad in (P.Writer().u32(4).u64(0).f64(0).str(""), P.Writer().u32(1).u64(0).f64(0).str(""),
                P.Writer().u32(0).u64(5).f64(0).str(""), P.Writer().u32(2).u64(0).f64(float("nan")).str(""),
                P.Writer().u32(2).u64(0).f64(900.0).str(""), P.Writer().u32(0).u64(0).f64(0).str("a\x1bb"),
                P.Writer().u32(1).u64(HIGH).f64(0)):
        with pytest.raises(P.ProtocolError):
            P.parse_sensors(P.Reader(bad.done(), "SENSORS"))


@agent
def test_an_agent_without_sensors_reads_none(native, tmp_path, monkeypatch):
    """An agent built before SENSORS answers BAD_REQUEST (unknown type): no reading, asked once."""
    from tuner.agent import AgentRuntime
    from tuner.agent import protocol as P
    with AgentRuntime(f"exec://{native['agent']}") as rt:
        monkeypatch.setattr(P, "SENSORS", 99)  # a type the agent does not know, as an old agent SENSORS
        assert rt.sensors() == (None, None, "")
        assert rt.sensors() == (None, None, "") and rt.calls["SENSORS"] == 1
        rt.ping()


@agent
def test_runtime_runner_fills_each_result(native, tmp_path):
    from tuner.agent import AgentRuntime
    from tuner.measure.runtime_runner import RuntimeRunner
    root = phone(tmp_path / "sysfs", gpu_milli=44_500)
    t = tuner.get_template("conv2d")
    wl = t.workload((1, 4, 6, 6), (4, 4, 3, 3), padding=1)
    with AgentRuntime(f"exec://{native['agent']} --sysfs-root {root}") as rt:
        runner = RuntimeRunner(rt, MeasureOptions(repeats=1, min_seconds=0.0, n_parallel=1))
        good, bad = MeasureInput("conv2d", wl, t.fallback(wl, rt.info)), MeasureInput("no.such:T", wl, None)
        res = runner.measure([good, bad])
        runner.close()
    assert res[0].ok and (res[0].gpu_clock_hz, res[0].temp_c) == (HIGH, 44.5)
    assert not res[1].ok and (res[1].gpu_clock_hz, res[1].temp_c) == (None, None)  # never reached the device


# -- records ------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def info():
    return load_profile(PROFILE)


@pytest.fixture(scope="module")
def conv():
    return tuner.get_template("conv2d")


@pytest.fixture(scope="module")
def wl(conv):
    return conv.workload((1, 4, 6, 6), (4, 4, 3, 3), padding=1)


def configs(conv, wl, info, n: int) -> list:
    base = conv.fallback(wl, info)
    sizes = [(w, h) for w in (1, 2, 4, 8, 16) for h in (1, 2, 4, 8)]
    return [dataclasses.replace(base, wg_w=w, wg_h=h) for w, h in sizes[:n]]


def test_records_carry_the_reading_and_old_lines_still_load(conv, wl, info):
    cfg = conv.fallback(wl, info)
    r = Record.new("conv2d", wl, cfg, info, costs=[1e-3], gpu_clock_hz=HIGH, temp_c=41.5)
    d = json.loads(r.to_json())
    assert d["gpu_clock_hz"] == HIGH and d["temp_c"] == 41.5 and "replaces" not in d
    assert Record.from_dict(d) == r
    old = {k: v for k, v in d.items() if k not in ("gpu_clock_hz", "temp_c")}  # a log from before
    back = Record.from_dict(old)
    assert back.gpu_clock_hz is None and back.temp_c is None and back.replaces == []
    redo = Record.new("conv2d", wl, cfg, info, costs=[1e-3], replaces=[r.timestamp])
    assert json.loads(redo.to_json())["replaces"] == [r.timestamp] and Record.from_line(redo.to_json().encode()) == redo


@pytest.mark.parametrize("field, value, match", [
    ("gpu_clock_hz", 0, "from 1 Hz"), ("gpu_clock_hz", 10 ** 12, "from 1 Hz"), ("gpu_clock_hz", 5.5e8, "integer"),
    ("gpu_clock_hz", True, "integer"), ("gpu_clock_hz", "585 MHz", "integer"),
    ("temp_c", 400, "temperature"), ("temp_c", -100.0, "temperature"), ("temp_c", "hot", "number"),
    ("replaces", "2026-01-01", "list"), ("replaces", [1], "timestamp"), ("replaces", [""], "timestamp"),
    ("replaces", ["x"] * 65, "at most 64"), ("replaces", ["a\u202eb"], "invisible"),
])
def test_bad_readings_are_refused_naming_the_field(conv, wl, info, field, value, match):
    d = json.loads(Record.new("conv2d", wl, conv.fallback(wl, info), info, costs=[1e-3]).to_json())
    d[field] = value
    with pytest.raises(InvalidRecordError, match=match) as e:
        Record.from_dict(d)
    assert field in str(e.value)


def test_a_redo_supersedes_its_record_everywhere(conv, wl, info, tmp_path):
    """The redo names the original's timestamp; every reader of bests counts the redo, even where the original
    was faster; the same timestamp on another config, task or device is not superseded; a log killed before the
    redo was written keeps the original."""
    a, b = configs(conv, wl, info, 2)
    fast = Record.new("conv2d", wl, a, info, costs=[1e-4], timestamp="2026-01-01T00:00:01+00:00")
    other = Record.new("conv2d", wl, b, info, costs=[5e-4], timestamp="2026-01-01T00:00:01+00:00")
    redo = Record.new("conv2d", wl, a, info, costs=[9e-4], timestamp="2026-01-01T00:00:09+00:00",
                      replaces=[fast.timestamp])
    log = tmp_path / "log.jsonl"
    append_records(log, [fast, other])
    assert best_records(load_records(log))[fast.task_key].config == fast.config  # before the redo
    append_records(log, redo)
    records = load_records(log)
    assert current(records) == [other, redo]
    index = LogIndex(records)
    assert index.superseded == 1 and index.task(fast.task_key) == [other, redo]
    assert best_records(records)[fast.task_key].config == other.config
    assert apply_history_best(str(log)).query("conv2d", wl.key(), info.fingerprint, fast.scopes).median_s == 5e-4
    assert LogIndex.of_log(log).superseded == 1
    assert current([fast, other]) == [fast, other]
    assert find_records(log, [redo.timestamp]) == [redo] and find_records(tmp_path / "none", ["x"]) == []


# -- DriftGuard with a fake device ----------------------------------------------------------------------------

class Device:
    """A fake device: its clock and temperature, and how much slower its kernels run than at full clock."""

    def __init__(self):
        self.clock, self.temp, self.slow = HIGH, 40.0, 1.0
        self.sleeps = []
        self.on_sleep = None

    def reading(self):
        return S.Reading(self.clock, self.temp)

    def sleep(self, s):
        self.sleeps.append(s)
        if self.on_sleep:
            self.on_sleep(len(self.sleeps))


class FakeRunner(Runner):
    """Times each config as 1 ms x its wg_w / 8 x the device's slowdown; reads the clock per result when
    ``reads``; ``after(n)`` runs after each measurement (the n-th)."""

    def __init__(self, device: Device, info, reads: bool = True):
        self.device, self.info, self.reads = device, info, reads
        self.measured, self.after, self.batches = 0, None, []

    def measure(self, inputs):
        out = []
        self.batches.append(len(inputs))
        for inp in inputs:
            stamp = now()
            time.sleep(0.002)  # distinct millisecond timestamps
            cost = 1e-3 * inp.config.wg_w / 8 * self.device.slow
            res = MeasureResult(costs=[cost] * 3, timestamp=stamp)
            if self.reads:
                res.gpu_clock_hz, res.temp_c = self.device.clock, self.device.temp
            out.append(res)
            self.measured += 1
            if self.after:
                self.after(self.measured)
        return out


def drive(guard, conv, wl, cfgs, log, batch=2) -> list:
    """What tune()'s Evaluator does: measure a batch, log its records, next batch."""
    recs = []
    for i in range(0, len(cfgs), batch):
        chunk = cfgs[i:i + batch]
        outs = guard.measure([MeasureInput("conv2d", wl, c) for c in chunk])
        new = [record_of(conv, wl, c, guard.info, r, i + k, "fake", "study") for k, (c, r) in
               enumerate(zip(chunk, outs))]
        append_records(log, new)
        recs += new
    return recs


def test_no_drift_checks_and_changes_nothing(conv, wl, info, tmp_path):
    dev = Device()
    said = []
    guard = DriftGuard(FakeRunner(dev, info), tmp_path / "log.jsonl", every=4, sleep=dev.sleep, say=said.append)
    recs = drive(guard, conv, wl, configs(conv, wl, info, 12), tmp_path / "log.jsonl")
    assert guard.checks == 3 and (guard.drifts, guard.redone, guard.waited_s) == (0, 0, 0.0)
    assert [e.kind for e in guard.events] == ["baseline", "check", "check", "check"]
    assert all(e.time_rel == 0 and e.clock_rel == 0 for e in guard.events if e.kind == "check")
    assert not said and not dev.sleeps and len(load_records(tmp_path / "log.jsonl")) == len(recs) == 12
    assert all(r.gpu_clock_hz == HIGH and r.temp_c == 40.0 for r in recs)
    assert guard.reference.config == configs(conv, wl, info, 1)[0]


def test_a_clock_drop_waits_rebaselines_and_redoes(conv, wl, info, tmp_path):
    """The clock halves after the third batch (kernels 2x slower, the device hotter): the fourth batch's clock is
    a drift; the guard polls the sensors until the clock is back and the temperature within 2 C of the baseline,
    re-times the reference, redoes the 4 measured since the last check (at 4) -- the current batch's returned
    redone, the earlier batch's appended to the log superseding their records."""
    dev, said = Device(), []
    runner = FakeRunner(dev, info)
    log = tmp_path / "log.jsonl"

    def after(n):  # runner measurements: 1-4 the first two batches, 5 the check, 6-7 the third batch
        if n == 7:
            dev.clock, dev.slow, dev.temp = LOW, 2.0, 48.0

    def on_sleep(n):
        if n == 2:
            dev.clock, dev.slow = HIGH, 1.0  # the clock is back, but still hot
        if n == 3:
            dev.temp = 41.5  # within 2 C of the baseline's 40
    runner.after, dev.on_sleep = after, on_sleep
    guard = DriftGuard(runner, log, every=4, poll_s=2, max_wait_s=60, sensors=dev.reading, sleep=dev.sleep,
                       say=said.append)
    recs = drive(guard, conv, wl, configs(conv, wl, info, 10), log)
    assert guard.drifts == 1 and guard.waited_s == 6.0 and dev.sleeps == [2, 2, 2]
    assert guard.redone == 4
    kinds = [e.kind for e in guard.events]
    assert kinds == ["baseline", "check", "clock", "wait", "wait", "wait", "wait", "recovered", "baseline", "redo",
                     "check"]
    clock = guard.events[2]
    assert clock.reading.gpu_clock_hz == LOW and clock.clock_rel > 0.5 and clock.measured == 6
    assert "GPU clock read 257 MHz" in said[0] and "back" in said[1] and "redid 4" in said[2]
    # the batch measured during the drift came back redone, at full clock
    assert all(r.gpu_clock_hz == HIGH and r.median_s == pytest.approx(1e-3 * c.wg_w / 8) for r, c in
               zip(recs, configs(conv, wl, info, 10)))
    raw = load_records(log)
    redone = [r for r in raw if r.replaces]
    assert len(raw) == 12 and len(redone) == 2  # 10 logged by the caller, the 2 earlier ones redone
    originals = {r.timestamp: r for r in raw[:10]}
    for r in redone:
        orig = originals[r.replaces[0]]
        assert (orig.config, orig.trial, orig.study, orig.sampler) == (r.config, r.trial, r.study, r.sampler)
        assert orig.trial in (4, 5)
    counted = LogIndex(raw).records  # the two originals left out, their redos in their place
    assert [r.trial for r in counted] == list(range(10))
    assert [r.timestamp for r in counted] == [r.timestamp for r in raw[:4] + raw[6:]]


def test_without_sensors_the_reference_decides(conv, wl, info, tmp_path):
    """A device with no clock nor temperature: the reference's re-timing finds the drift, and the wait ends
    when the reference times within the threshold again."""
    dev = Device()
    dev.clock = dev.temp = None
    runner = FakeRunner(dev, info, reads=False)
    runner.after = lambda n: setattr(dev, "slow", 1.5) if n == 5 else None
    dev.on_sleep = lambda n: setattr(dev, "slow", 1.03) if n == 3 else None
    guard = DriftGuard(runner, tmp_path / "log.jsonl", every=4, poll_s=1, sensors=dev.reading, sleep=dev.sleep,
                       say=lambda m: None)
    drive(guard, conv, wl, configs(conv, wl, info, 8), tmp_path / "log.jsonl")
    assert guard.drifts == 1 and guard.waited_s == 3.0 and guard.checks == 3  # the third right after the redo
    check = [e for e in guard.events if e.kind == "check"][1]
    assert check.time_rel == pytest.approx(0.5)
    waits = [e for e in guard.events if e.kind == "wait"]
    assert [round(e.time_rel, 2) for e in waits] == [0.5, 0.5, 0.5, 0.03]  # the reference, timed while waiting
    assert guard.redone == 4 and sum(1 for r in load_records(tmp_path / "log.jsonl") if r.replaces) == 2


def test_a_moment_of_noise_is_not_a_drift(conv, wl, info, tmp_path):
    """One slow re-timing of the reference with the clock where it was is timed once more; back within the
    threshold, it was noise: no drift, no wait, no redo."""
    dev = Device()
    runner = FakeRunner(dev, info)
    runner.after = lambda n: setattr(dev, "slow", 1.6 if n == 4 else 1.0)  # only the check's first timing
    guard = DriftGuard(runner, tmp_path / "log.jsonl", every=4, sensors=dev.reading, sleep=dev.sleep,
                       say=lambda m: None)
    drive(guard, conv, wl, configs(conv, wl, info, 8), tmp_path / "log.jsonl")
    checks = [e for e in guard.events if e.kind == "check"]
    assert [round(e.time_rel, 2) for e in checks] == [0.6, 0.0, 0.0]
    assert "timed once more" in checks[0].note
    assert (guard.checks, guard.drifts, guard.redone, dev.sleeps) == (2, 0, 0, [])


def test_a_device_that_does_not_recover_becomes_the_new_baseline(conv, wl, info, tmp_path):
    dev, said = Device(), []
    runner = FakeRunner(dev, info)
    runner.after = lambda n: (setattr(dev, "clock", LOW), setattr(dev, "slow", 2.0)) if n == 3 else None
    guard = DriftGuard(runner, tmp_path / "log.jsonl", every=4, poll_s=4, max_wait_s=10, sensors=dev.reading,
                       sleep=dev.sleep, say=said.append)
    drive(guard, conv, wl, configs(conv, wl, info, 8), tmp_path / "log.jsonl")
    assert dev.sleeps == [4, 4, 2] and guard.waited_s == 10.0 and guard.drifts == 1
    assert "gave_up" in [e.kind for e in guard.events] and any("did not recover within 10 s" in m for m in said)
    assert guard.base_reading.gpu_clock_hz == LOW and guard.base_median == pytest.approx(2e-3 * 1 / 8)


def test_a_clock_that_keeps_moving_is_kept_after_max_rounds(conv, wl, info, tmp_path):
    """Every redo sees another clock: after max_rounds redos the guard keeps the measurements and says so."""
    dev, said = Device(), []
    runner = FakeRunner(dev, info)
    clocks = iter([HIGH, LOW] * 100)
    runner.after = lambda n: setattr(dev, "clock", next(clocks)) if n >= 3 else None
    guard = DriftGuard(runner, tmp_path / "log.jsonl", every=100, poll_s=1, max_wait_s=0, max_rounds=2,
                       sensors=dev.reading, sleep=dev.sleep, say=said.append)
    drive(guard, conv, wl, configs(conv, wl, info, 6), tmp_path / "log.jsonl", batch=3)
    assert "kept" in [e.kind for e in guard.events] and any("still drifting after 2 redos" in m for m in said)
    assert guard.drifts == 2
    assert not dev.sleeps  # max_wait_s=0: no wait at all


def test_a_failing_reference_is_a_drift_and_is_replaced(conv, wl, info, tmp_path):
    """The reference fails when re-timed (a RUN_TIMEOUT of a throttled device): that is a drift; when it fails
    again after the wait, the next successful measurement becomes the reference."""
    dev = Device()
    runner = FakeRunner(dev, info)
    ref = configs(conv, wl, info, 1)[0]
    inner_measure = runner.measure
    state = {"fail": False}

    def measure(inputs):
        out = inner_measure(inputs)
        for inp, r in zip(inputs, out):
            if state["fail"] and inp.config == ref:
                r.error_code, r.costs, r.error_msg = ErrorCode.RUN_TIMEOUT, [], "too slow"
        return out
    runner.measure = measure
    runner.after = lambda n: state.update(fail=True) if n == 4 else None
    said = []
    guard = DriftGuard(runner, tmp_path / "log.jsonl", every=4, poll_s=1, max_wait_s=2, sleep=dev.sleep,
                       say=said.append)
    drive(guard, conv, wl, configs(conv, wl, info, 8), tmp_path / "log.jsonl")
    assert guard.drifts >= 1 and any("reference config failed" in m for m in said)
    assert guard.reference is not None and guard.reference.config != ref


def test_a_link_lost_during_a_redo_propagates_and_forgets_the_batch(conv, wl, info, tmp_path):
    """The device is lost while the guard redoes: the error reaches the tuner (a re-run resumes from the log);
    the batch that was never handed back is not kept as if its caller had logged it."""
    from tuner.agent import AgentLinkError
    dev = Device()
    runner = FakeRunner(dev, info)
    runner.after = lambda n: setattr(dev, "clock", LOW) if n == 3 else None
    inner_measure = runner.measure

    def measure(inputs):
        if runner.measured >= 5:
            raise AgentLinkError("agent exec://x: the link ended")
        return inner_measure(inputs)
    runner.measure = measure
    guard = DriftGuard(runner, tmp_path / "log.jsonl", every=100, max_wait_s=0, sensors=dev.reading,
                       sleep=dev.sleep, say=lambda m: None)
    guard.measure([MeasureInput("conv2d", wl, c) for c in configs(conv, wl, info, 2)])
    with pytest.raises(AgentLinkError):
        guard.measure([MeasureInput("conv2d", wl, c) for c in configs(conv, wl, info, 4)[2:]])
    assert [e.index for e in guard._pending] == [None, None] and guard.measured == 2


def test_the_guard_checks_its_arguments(info, tmp_path):
    dev = Device()
    runner = FakeRunner(dev, info)
    log = tmp_path / "log.jsonl"
    for kwargs, match in [({"every": 0}, "every"), ({"threshold": 0}, "threshold"), ({"threshold": float("nan")},
                          "threshold"), ({"poll_s": -1}, "poll_s"), ({"max_wait_s": "long"}, "max_wait_s"),
                          ({"sensors": 3}, "sensors"), ({"max_rounds": 0}, "max_rounds")]:
        with pytest.raises(TunerError, match=match):
            DriftGuard(runner, log, **kwargs)
    with pytest.raises(TunerError, match="wraps a Runner"):
        DriftGuard(object(), log)
    with pytest.raises(TunerError, match="log"):
        DriftGuard(runner, None)
    with pytest.raises(TunerError, match="directory"):
        DriftGuard(runner, tmp_path)
    guard = DriftGuard(runner, log, sensors=lambda: (1, 2))
    with pytest.raises(TunerError, match="not a tuner.measure.sensors.Reading"):
        guard.sensors()
    assert DriftGuard(runner, log).sensors() == S.read()  # a runner without sensors: this host's sysfs


# -- end to end: the C agent under exec://, a tune, the fake clock dropped mid-tune ---------------------------

class ClockDrop(Runner):
    """Passes measurements to ``inner`` (the agent's RuntimeRunner); after the ``at``-th one, drops the fake
    clock and heats the fake GPU zone (the agent reads them with each measurement)."""

    def __init__(self, inner, root: Path, at: int, low: int = LOW):
        self.inner, self.info, self.root, self.at, self.low = inner, inner.info, root, at, low
        self.measured, self.dropped_at = 0, None

    def sensors(self):
        return self.inner.sensors()

    def measure(self, inputs):
        out = self.inner.measure(inputs)
        self.measured += len(inputs)
        if self.dropped_at is None and self.measured >= self.at:
            phone(self.root, clock=self.low, gpu_milli=52_000)
            self.dropped_at = self.measured
        return out


@agent
def test_a_clock_dropped_mid_tune_is_detected_waited_out_and_redone(native, tmp_path):
    """A tune through the C agent under exec:// (one config a batch), whose fake sysfs clock drops after the
    third trial and comes back (and cools) after the tuner has waited two polls: the drift is detected on the
    fourth trial, whose clock and temperature the agent read; the tuner waits; the measurements since the last
    good check (here the baseline) are redone -- the fourth returned redone, the first three appended to the log
    superseding their records -- and every measurement the log counts was made at the full clock. The reference
    is not re-timed within these four trials (``every`` is larger): microsecond kernels on a loaded 2-core host
    time too noisily for a deterministic test, so the re-timing is tested with a fake device above."""
    from tuner.agent import AgentRuntime
    from tuner.measure.runtime_runner import RuntimeRunner
    from tuner.search.tune import tune
    root = phone(tmp_path / "sysfs")
    log = tmp_path / "phone.jsonl"
    slept, said = [], []

    def sleep(s):
        slept.append(s)
        if len(slept) == 2:
            phone(root)  # the clock is back and the GPU cool again

    t = tuner.get_template("conv2d")
    wl = t.workload((1, 4, 6, 6), (4, 4, 3, 3), padding=1)
    opts = MeasureOptions(repeats=3, min_seconds=0.001, n_parallel=1)
    with AgentRuntime(f"exec://{native['agent']} --sysfs-root {root}") as rt:
        runner = RuntimeRunner(rt, opts)
        drop = ClockDrop(runner, root, at=3)
        with DriftGuard(drop, log, every=100, poll_s=3, max_wait_s=60, sleep=sleep, say=said.append) as guard:
            res = tune("conv2d", wl, device=guard, measurer=guard, log=str(log), trials=4, batch=1,
                       options=opts, progress=False)
    assert res.measured == 4 and drop.dropped_at == 3
    kinds = [e.kind for e in guard.events]
    assert kinds == ["baseline", "clock", "wait", "wait", "wait", "recovered", "baseline", "redo"], (kinds, said)
    # detected: the fourth trial read the low clock (and the heat) through the agent
    clock = guard.events[1]
    assert (clock.reading.gpu_clock_hz, clock.reading.temp_c, clock.measured) == (LOW, 52.0, 3)
    assert guard.drifts == 1 and "GPU clock read 257 MHz" in said[0] and "waiting" in said[0]
    # waited: two polls at the low clock, then back
    assert slept == [3, 3] and guard.waited_s == 6
    assert [e.reading.gpu_clock_hz for e in guard.events if e.kind == "wait"] == [LOW, LOW, HIGH]
    assert guard.events[-2].reading == S.Reading(HIGH, 41.0)  # the new baseline
    # redone: the first three trials (logged, now superseded) and the fourth (returned redone)
    raw = load_records(log)
    assert guard.redone == 4 and [r.trial for r in raw] == [0, 1, 2, 0, 1, 2, 3]
    for original, redo in zip(raw[:3], raw[3:6]):
        assert redo.replaces == [original.timestamp] and redo.ok
        assert (redo.config, redo.study, redo.sampler) == (original.config, original.study, original.sampler)
    index = LogIndex(raw)
    assert index.records == raw[3:] and index.superseded == 3
    assert all((r.gpu_clock_hz, r.temp_c) == (HIGH, 41.0) for r in raw)  # nothing at the low clock was logged
    assert "redid 4" in said[-1] and "3 appended to" in said[-1]
