"""Cross builds of the native programs (tuner.native: ``tuner native build --target T``): the source lists match
native/Makefile; a missing compiler is a one-line error naming what to install; a linux-arm64 build (zig, or
Debian's aarch64-linux-gnu-gcc, each where present) is the runtime library, tuner-run and the agent as AArch64
ELF files; and, where qemu-aarch64 and the arm64 PoCL of native/cross/qemu-arm64.sh are set up, those programs
run there (slow). The agent's conformance suite under qemu: native/cross/qemu-arm64.sh check."""
from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import tuner.native as native
from tuner.cli.programs import native_main
from tuner.errors import TunerError

ROOT = Path(__file__).resolve().parent.parent
QEMU_SCRIPT = ROOT / "native" / "cross" / "qemu-arm64.sh"
HAS_ZIG = shutil.which("zig") is not None or importlib.util.find_spec("ziglang") is not None
HAS_GCC = shutil.which("aarch64-linux-gnu-gcc") is not None
EM_AARCH64 = 183


def _makefile_list(name: str) -> tuple:
    line = next(x for x in (native.NATIVE / "Makefile").read_text().splitlines() if x.startswith(name + " "))
    return tuple(line.split(":=")[1].split())


def test_cross_sources_match_the_makefile():
    assert _makefile_list("LIB_SRCS") == native.RUNTIME_SOURCES
    assert _makefile_list("AGENT_SRCS") == native.AGENT_SOURCES
    # tuner-run is its own file linked with the library's objects
    rule = next(x for x in (native.NATIVE / "Makefile").read_text().splitlines() if x.startswith("$(BUILD)/tuner-run:"))
    assert rule.split(":", 1)[1].split() == [f"$(BUILD)/obj/{native.CLI_SOURCE[:-2]}.o", "$(OBJS)", "$(LINK_DEPS)"]


FULL_RELRO = ("-Wl,-z,relro", "-Wl,-z,now")


def test_makefile_links_everything_with_full_relro():
    """The host build links the library, tuner-run, the agent and their ASan builds with -z relro -z now, and
    relinks when those flags change (the Makefile is a prerequisite of each link)."""
    lines = (native.NATIVE / "Makefile").read_text().splitlines()
    flags = next(x for x in lines if x.startswith("HARDEN_LDFLAGS :="))
    assert flags.split(":=")[1].split() == list(FULL_RELRO)
    assert "AGENT_LDFLAGS := $(HARDEN_LDFLAGS)" in lines
    links = {}
    for i, x in enumerate(lines):
        if x.startswith("$(BUILD)/") and ":" in x and not x.startswith("$(BUILD)/obj/") \
                and not x.startswith("$(BUILD)/asan/obj/"):
            links[x.split(":", 1)[0]] = (x, lines[i + 1])
    assert set(links) == {"$(BUILD)/libtuner_runtime.so", "$(BUILD)/tuner-run", "$(BUILD)/asan/tuner-run",
                          "$(BUILD)/tuner-agent", "$(BUILD)/asan/tuner-agent"}
    for name, (rule, recipe) in links.items():
        assert "$(LINK_DEPS)" in rule.split(), name
        assert "$(HARDEN_LDFLAGS)" in recipe or "$(AGENT_LDFLAGS)" in recipe, (name, recipe)


def _fake_ndk(root: Path) -> Path:
    clang = root / "toolchains" / "llvm" / "prebuilt" / "linux-x86_64" / "bin" / "aarch64-linux-android24-clang"
    clang.parent.mkdir(parents=True)
    clang.write_text("")
    return root


@pytest.mark.parametrize("target, compiler, cc", [
    ("linux-arm64", "gcc", "aarch64-linux-gnu-gcc"),  # Debian's gcc binds lazily unless told
    ("linux-arm64", "zig", "zig"),
    ("linux-x86_64", "zig", "zig"),
    ("android-arm64", None, "aarch64-linux-android24-clang"),
])
def test_cross_links_with_full_relro(monkeypatch, tmp_path, target, compiler, cc):
    """Every link of `tuner native build --target T` (the library, tuner-run, the agent) passes -z relro -z now,
    as the host build does: the commands are recorded, no compiler runs."""
    monkeypatch.setattr(native, "_zig", lambda: ["zig"])
    monkeypatch.setattr(native.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setenv("ANDROID_NDK_HOME", str(_fake_ndk(tmp_path / "ndk")))
    commands = []

    def run(cmd, **kw):
        commands.append(cmd)
        Path(cmd[cmd.index("-o") + 1]).write_bytes(b"")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(native, "subprocess", type("fake", (), {"run": staticmethod(run)}))
    paths = native.build(target, tmp_path / "out", compiler=compiler)
    assert all(Path(c[0]).name == cc for c in commands), commands
    links = [c for c in commands if "-c" not in c]
    assert sorted(c[c.index("-o") + 1] for c in links) == sorted(paths.values())
    for c in links:
        assert all(f in c for f in FULL_RELRO), c
    assert all(not any(f in c for f in FULL_RELRO) for c in commands if "-c" in c)  # link flags on links only


def _readelf_full_relro(path: Path) -> tuple:
    """(BIND_NOW, GNU_RELRO) of an ELF file, by readelf (binutils reads every architecture's)."""
    dyn = subprocess.run(["readelf", "-dW", str(path)], capture_output=True, text=True, check=True).stdout
    seg = subprocess.run(["readelf", "-lW", str(path)], capture_output=True, text=True, check=True).stdout
    bind_now = re.search(r"\(FLAGS\)\s.*\bBIND_NOW\b", dyn) is not None or \
        re.search(r"\(FLAGS_1\)\s.*\bNOW\b", dyn) is not None
    return bind_now, re.search(r"^\s*GNU_RELRO\s", seg, re.M) is not None


def _no_tools(monkeypatch):
    monkeypatch.setattr(native, "_zig", lambda: None)
    monkeypatch.setattr(native.shutil, "which", lambda name: None)
    monkeypatch.delenv("ANDROID_NDK_HOME", raising=False)
    monkeypatch.delenv("ANDROID_NDK_ROOT", raising=False)


@pytest.mark.parametrize("target, compiler, says", [
    ("linux-arm64", None, ["zig (`pip install ziglang`", "aarch64-linux-gnu-gcc",
                           "apt-get install gcc-aarch64-linux-gnu"]),
    ("linux-arm64", "gcc", ["needs aarch64-linux-gnu-gcc on PATH", "apt-get install gcc-aarch64-linux-gnu"]),
    ("linux-arm64", "zig", ["needs zig (`pip install ziglang`"]),
    ("linux-x86_64", None, ["needs zig (`pip install ziglang`"]),
    ("linux-x86_64", "gcc", ["builds with zig only"]),
    ("android-arm64", None, ["Android NDK", "--ndk DIR", "ANDROID_NDK_HOME"]),
    ("windows-x86_64", None, ["choose host", "linux-arm64"]),
])
def test_missing_compiler_is_one_line_naming_the_fix(monkeypatch, tmp_path, target, compiler, says):
    _no_tools(monkeypatch)
    with pytest.raises(TunerError) as e:
        native.build(target, tmp_path, compiler=compiler)
    msg = str(e.value)
    assert "\n" not in msg and all(s in msg for s in says), msg
    if compiler == "zig" or target != "linux-arm64":
        assert "aarch64-linux-gnu-gcc" not in msg, msg
    assert not list(tmp_path.iterdir())  # nothing written before the compiler is known


def test_arm64_picks_zig_first_then_debians_gcc(monkeypatch):
    monkeypatch.setattr(native, "_zig", lambda: ["zig"])
    monkeypatch.setattr(native.shutil, "which", lambda name: f"/usr/bin/{name}")
    assert native._cross_cc("linux-arm64", None, None) == ["zig", "cc", "-target", "aarch64-linux-gnu.2.17"]
    assert native._cross_cc("linux-arm64", None, "gcc") == ["aarch64-linux-gnu-gcc"]
    monkeypatch.setattr(native, "_zig", lambda: None)
    assert native._cross_cc("linux-arm64", None, None) == ["aarch64-linux-gnu-gcc"]


def _elf_machine(path: Path) -> tuple:
    head = path.read_bytes()[:20]
    assert head[:4] == b"\x7fELF", f"{path} is not an ELF file"
    return head[4], int.from_bytes(head[18:20], "little")  # (class: 2 = 64-bit, e_machine)


@pytest.mark.parametrize("compiler", [
    pytest.param("zig", marks=pytest.mark.skipif(not HAS_ZIG, reason="no zig (pip install ziglang)")),
    pytest.param("gcc", marks=pytest.mark.skipif(not HAS_GCC, reason="no aarch64-linux-gnu-gcc "
                                                                     "(apt-get install gcc-aarch64-linux-gnu)")),
])
def test_cross_build_for_arm64_linux(tmp_path, capsys, compiler):
    """`tuner native build --target linux-arm64` prints two runtime lines and an agent line; all three are
    64-bit AArch64 ELF files, the library a shared object with the C API, the programs with an interpreter."""
    assert native_main(["build", "--target", "linux-arm64", "--compiler", compiler,
                               "--build-dir", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.split("\n")
    printed = [tuple(x.split(" ", 1)) for x in lines if x]
    assert printed == [("runtime", str(tmp_path / "libtuner_runtime.so")), ("runtime", str(tmp_path / "tuner-run")),
                       ("agent", str(tmp_path / "tuner-agent"))]
    for _, path in printed:
        assert _elf_machine(Path(path)) == (2, EM_AARCH64), path
    lib = (tmp_path / "libtuner_runtime.so").read_bytes()
    assert int.from_bytes(lib[16:18], "little") == 3 and b"tnr_open" in lib  # ET_DYN, exporting the API
    for exe in ("tuner-run", "tuner-agent"):
        data = (tmp_path / exe).read_bytes()
        assert b"ld-linux-aarch64.so.1" in data and os.access(tmp_path / exe, os.X_OK)
    if shutil.which("readelf"):  # full RELRO: bound at start, the GOT read-only after
        for _, path in printed:
            assert _readelf_full_relro(Path(path)) == (True, True), path


def _qemu_ready() -> str | None:
    """Why the qemu test cannot run here, or None."""
    if shutil.which("qemu-aarch64") is None:
        return "no qemu-aarch64 (native/cross/qemu-arm64.sh setup)"
    if not (HAS_ZIG or HAS_GCC):
        return "no arm64 cross compiler (native/cross/qemu-arm64.sh setup)"
    q = Path(os.environ.get("TUNER_QEMU_ARM64_DIR") or ROOT / "build" / "qemu-arm64")
    if not (q / "vendors" / "pocl.icd").is_file():
        return f"no arm64 PoCL in {q} (native/cross/qemu-arm64.sh setup)"
    return None


@pytest.mark.slow
@pytest.mark.skipif(_qemu_ready() is not None, reason=str(_qemu_ready()))
def test_arm64_programs_run_under_qemu(tmp_path, monkeypatch):
    """The arm64 tuner-run lists PoCL's device under qemu-aarch64, and the arm64 agent builds, runs and times a
    conv2d config there (its executor forked by qemu), checked against the reference. About 30 s."""
    import tuner
    from tuner.agent import AgentRuntime
    from tuner.measure import MeasureInput, MeasureOptions
    from tuner.measure.runtime_runner import RuntimeRunner
    paths = native.build("linux-arm64", tmp_path / "arm64")
    r = subprocess.run([str(QEMU_SCRIPT), "run", paths["tuner_run"], "--devices"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert re.search(r"^0\tPortable Computing Language\t.*\tCPU\tpocl-cpu-[0-9a-f]{8}\t", r.stdout, re.M), r.stdout
    monkeypatch.setenv("TUNER_ARM64_AGENT", paths["agent"])  # native/cross/arm64-agent runs this build
    rt = AgentRuntime(f"exec://{ROOT / 'native' / 'cross' / 'arm64-agent'}")
    runner = RuntimeRunner(rt, MeasureOptions(build_timeout=300, run_timeout=120, repeats=2, min_seconds=0.001,
                                              n_parallel=1))
    try:
        assert rt.info.platform == "Portable Computing Language" and rt.info.type == "CPU"
        t = tuner.get_template("conv2d")
        wl = t.workload((1, 4, 6, 6), (4, 4, 3, 3), padding=1)
        res, = runner.measure([MeasureInput("conv2d", wl, t.fallback(wl, rt.info))])
        assert res.ok, res.error_msg
        assert res.max_rel_error < 1e-4 and len(res.costs) >= 2
    finally:
        runner.close()
        rt.close()
