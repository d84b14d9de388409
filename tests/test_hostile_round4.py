"""The red team's held-out round of issue #54 ("the agent and the artifact, second round"), findings 2 to 8:
each a crash, hang, data loss, terminal injection, traceback or disagreement between the two runtimes (tuner
run, tuner-run), now one ``error:`` line (exit 2) or handled, the same way by both.

- 2: ``tuner-run --output y=A --output y=A`` read the output's name after closing the runtime (use-after-free);
- 3: a FIFO planted at an output's name hung both runtimes in open();
- 4: both wrote through a symbolic link planted as the output's folder (``--output shared/y.npy``,
  ``--outputs shared``): the link's target folder lost its file. The folder is opened with O_NOFOLLOW and
  everything done relative to it; a link above the folder is the user's own path and followed;
- 5: a node name holding terminal escapes was printed raw by ``--profile`` (both) and tuner-run's error lines;
- 6: a lone surrogate in a node name: a UnicodeEncodeError traceback in ``tuner run --profile``;
- 7: a .npy shape holding ``True``: numpy's TypeError traceback;
- 8: a 9-D input, a ``\\u0000`` in a JSON string and .npy headers numpy's literal_eval reads but npy.c refuses
  were run by one runtime and refused by the other.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from artifact_corpus import _copy, _edit_graph

pytestmark = [pytest.mark.skipif(shutil.which("make") is None or shutil.which("gcc") is None,
                                 reason="the native runtime is built with make and gcc"),
              pytest.mark.xdist_group("hostile_round4")]  # one worker compiles the artifact (tests/conftest.py)

ROOT = Path(__file__).resolve().parent.parent
RUNTIMES = ["python", "native"]


@pytest.fixture(scope="module")
def art(tmp_path_factory, device):
    """A conv + relu artifact (buffer plan; nodes x.pack, conv, y.unpack; input x, output y) and an input."""
    import tuner
    from conftest import save_conv_model
    d = tmp_path_factory.mktemp("round4")
    save_conv_model(d / "conv.onnx", relu=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mod = tuner.compile_model(str(d / "conv.onnx"), device=device, scope="buffer")
    mod.save(d / "art")
    x = np.random.default_rng(1).standard_normal((1, 8, 8, 8)).astype(np.float32)
    np.save(d / "x.npy", x)
    return {"dir": d / "art", "x": d / "x.npy"}


@pytest.fixture
def env(cl_env, tmp_path):
    return {**cl_env, "XDG_CACHE_HOME": str(tmp_path / "cache"), "TUNER_CACHE_DIR": str(tmp_path / "cache" / "tuner"),
            "ASAN_OPTIONS": "detect_leaks=0", "PYTHONPATH": str(ROOT)}


def _run(runtime, native, env, device, art_dir, *args, timeout=60, asan=False):
    """One run of ``art_dir`` by either runtime, in a process of its own (a hang is a timeout)."""
    if runtime == "python":
        cmd = [sys.executable, "-m", "tuner", "run", art_dir, "--device", device.fingerprint, "--repeat", "1", *args]
    else:
        cmd = [native["tuner_run_asan" if asan else "tuner_run"], art_dir, "--device", device.fingerprint,
               "--bench", "1", "--warmup", "0", *args]
    return subprocess.run([str(c) for c in cmd], capture_output=True, env=env, timeout=timeout)


def _one_error(r, *words) -> str:
    """Exit status 2 and one ``error:`` line on stderr holding ``words``, no traceback, no sanitizer report."""
    err = r.stderr.decode("utf-8", "replace")
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in err and "Sanitizer" not in err, \
        (r.returncode, err[-3000:])
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


# -- 2. a use-after-free in tuner-run's error path --------------------------------------------------------------
@pytest.mark.parametrize("runtime", RUNTIMES + ["native-asan"])
def test_an_output_named_twice_is_one_error_line(runtime, art, native, env, device, tmp_path):
    """Finding: tuner-run closed the runtime, then read the output's name from it for the message (SIGSEGV;
    ASan: heap-use-after-free in tnr_output_name)."""
    y = tmp_path / "a.npy"
    r = _run(runtime.split("-")[0], native, env, device, art["dir"], "--output", f"y={y}", "--output", f"y={y}",
             asan=runtime.endswith("asan"))
    _one_error(r, "twice")
    assert not y.exists()


# -- 3. a FIFO at an output's name --------------------------------------------------------------------------------
@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("flag", ["--output", "--outputs"])
def test_a_fifo_at_an_output_name_is_refused_not_waited_on(runtime, flag, art, native, env, device, tmp_path):
    """Finding: a FIFO another user planted at an output's name, with no reader, blocked both runtimes in
    open() for ever. It is opened non-blocking: one error line, and the FIFO is left as it was."""
    shared = tmp_path / "shared"
    shared.mkdir()
    os.mkfifo(shared / "y.npy")
    where = [flag, shared / "y.npy"] if flag == "--output" else [flag, shared]
    _one_error(_run(runtime, native, env, device, art["dir"], *where, timeout=60), "FIFO", "no process reads")
    assert (shared / "y.npy").is_fifo() and sorted(os.listdir(shared)) == ["y.npy"]


def test_a_fifo_with_a_reader_and_dev_null_are_still_written_through(tmp_path):
    """What a user names on purpose still works: a FIFO that a process reads, /dev/null."""
    import threading

    from tuner.files import write_file
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(open(fifo, "rb").read()))
    reader.start()
    import time
    time.sleep(0.2)  # the reader is waiting in open() before the write opens the FIFO
    write_file(fifo, lambda fh: fh.write(b"data"), "--output")
    reader.join(10)
    assert got == [b"data"] and fifo.is_fifo()
    write_file("/dev/null", lambda fh: fh.write(b"data"), "--output")


# -- 4. a symbolic link as the output's folder --------------------------------------------------------------------
@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("flag", ["--output", "--outputs"])
def test_an_output_folder_planted_as_a_symbolic_link_is_refused(runtime, flag, art, native, env, device, tmp_path):
    """Finding: only an output's own name was opened with O_NOFOLLOW: a link planted as its folder (``shared``
    -> the victim's folder) was written through, and the victim's y.npy replaced."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "y.npy").write_text("the victim's file\n")
    (tmp_path / "shared").symlink_to(victim)
    where = [flag, tmp_path / "shared" / "y.npy"] if flag == "--output" else [flag, tmp_path / "shared"]
    _one_error(_run(runtime, native, env, device, art["dir"], *where), "symbolic link")
    assert (victim / "y.npy").read_text() == "the victim's file\n" and sorted(os.listdir(victim)) == ["y.npy"]


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_symbolic_link_above_the_output_folder_is_followed(runtime, art, native, env, device, tmp_path):
    """The documented line: the output's own folder is never a link; links above it are the user's own path
    (``/tmp`` -> ``/private/tmp`` on macOS) and followed."""
    real = tmp_path / "real"
    (real / "sub").mkdir(parents=True)
    (tmp_path / "home").symlink_to(real)
    r = _run(runtime, native, env, device, art["dir"], "--output", tmp_path / "home" / "sub" / "y.npy")
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    assert np.load(real / "sub" / "y.npy").shape == (1, 8, 8, 8) and os.listdir(real / "sub") == ["y.npy"]


# -- 5 and 6. names printed on a terminal -------------------------------------------------------------------------
ESCAPES = "conv\x1b]0;owned\x07\x1b[2J"


def _with_node_name(art, tmp_path, name, kernel=None) -> Path:
    d = _copy(art["dir"], tmp_path / "a")
    (d / "signature").unlink(missing_ok=True)

    def edit(g):
        node = next(n for n in g["nodes"] if n["name"] == "conv")
        node["name"] = name
        if kernel is not None:
            node["calls"][0]["kernel"] = kernel
    _edit_graph(d, edit)
    return d


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_terminal_escapes_in_a_node_name_are_printed_escaped(runtime, art, native, env, device, tmp_path):
    """Finding: --profile printed a node name holding OSC and CSI sequences raw (the terminal's title set, its
    screen cleared). Both runtimes escape every control character where they print an artifact's names."""
    d = _with_node_name(art, tmp_path, ESCAPES)
    r = _run(runtime, native, env, device, d, "--profile")
    out = r.stdout.decode("utf-8", "replace")
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    assert "\x1b" not in out and "\x07" not in out and "conv\\x1b]0;owned\\x07\\x1b[2J" in out, out


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_terminal_escapes_in_a_refused_node_name_are_escaped_in_the_error_line(runtime, art, native, env, device,
                                                                               tmp_path):
    """Finding: tuner-run's error line naming a refused node wrote its ESC byte raw."""
    d = _with_node_name(art, tmp_path, ESCAPES, kernel="nope")
    r = _run(runtime, native, env, device, d)
    line = _one_error(r)
    assert "\x1b" not in r.stderr.decode("utf-8", "replace") and "\x07" not in line, line


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_lone_surrogate_in_a_node_name_is_refused_at_load(runtime, art, native, env, device, tmp_path):
    """Finding: Python's json took "\\ud800", and `tuner run --profile` died printing it (UnicodeEncodeError);
    tuner-run refused the JSON. Both refuse it as not valid JSON."""
    d = _with_node_name(art, tmp_path, "\ud800conv")
    _one_error(_run(runtime, native, env, device, d, "--profile"), "graph.json", "unpaired surrogate")


# -- 7 and 8. one reading of every file ---------------------------------------------------------------------------
def _npy_with_header(path: Path, header: str, data: bytes) -> Path:
    h = header.encode("latin-1")
    h += b" " * ((64 - (10 + len(h) + 1) % 64) % 64) + b"\n"
    path.write_bytes(b"\x93NUMPY\x01\x00" + len(h).to_bytes(2, "little") + h + data)
    return path


NPY_HEADERS = {  # each read by numpy's literal_eval, refused by npy.c: refused by both now
    "true_as_a_dimension": "{'descr': '<f4', 'fortran_order': False, 'shape': (True, 8, 8, 8), }",
    "string_concatenation": "{'descr': '<' 'f4', 'fortran_order': False, 'shape': (1, 8, 8, 8), }",
    "hex_escape_in_a_value": "{'descr': '\\x3cf4', 'fortran_order': False, 'shape': (1, 8, 8, 8), }",
    "hex_escape_in_a_key": "{'desc\\x72': '<f4', 'fortran_order': False, 'shape': (1, 8, 8, 8), }",
    "plus_sign": "{'descr': '<f4', 'fortran_order': False, 'shape': (+1, 8, 8, 8), }",
    "hexadecimal": "{'descr': '<f4', 'fortran_order': False, 'shape': (0x1, 8, 8, 8), }",
    "underscore": "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 8, 8, 0_8), }",
    "raw_string": "{'descr': r'<f4', 'fortran_order': False, 'shape': (1, 8, 8, 8), }",
    "triple_quoted": "{'descr': '''<f4''', 'fortran_order': False, 'shape': (1, 8, 8, 8), }",
    "trailing_comment": "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 8, 8, 8), } # hi",
    "false_as_a_dimension": "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 8, 8, False), }",
}


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("case", list(NPY_HEADERS))
def test_a_npy_header_outside_the_grammar_is_refused_by_both(runtime, case, art, native, env, device, tmp_path):
    """Findings 7 and 8: shape (True, 8, 8, 8) was numpy's TypeError traceback in tuner run; the others were
    read by numpy's literal_eval and refused by npy.c. Both read the header by npy.c's grammar now."""
    x = np.load(art["x"])
    bad = _npy_with_header(tmp_path / "x.npy", NPY_HEADERS[case], x.tobytes())
    _one_error(_run(runtime, native, env, device, art["dir"], "--input", bad), "x.npy", ".npy header")


def _c_npy_read(native, path: Path):
    """npy.c's reader (tnr_npy_read, exported by the runtime library): (shape, None) or (None, its message)."""
    import ctypes

    class Npy(ctypes.Structure):
        _fields_ = [("ndim", ctypes.c_int), ("shape", ctypes.c_int64 * 8), ("count", ctypes.c_size_t),
                    ("data", ctypes.POINTER(ctypes.c_float))]
    lib = ctypes.CDLL(str(native["library"]))
    out, err = Npy(), ctypes.create_string_buffer(4096)
    if lib.tnr_npy_read(str(path).encode(), ctypes.c_size_t(0), ctypes.byref(out), err) != 0:
        return None, err.value.decode()
    shape = tuple(out.shape[:out.ndim])
    lib.tnr_npy_free(ctypes.byref(out))
    return shape, None


@pytest.mark.parametrize("header", ["{'descr': '<f4', 'fortran_order': False, 'shape': (8), }",
                                    "{'descr': '<f4', 'fortran_order': False, 'shape': (08,), }"])
def test_a_header_numpy_refuses_is_refused_by_npy_c_too(header, native, tmp_path):
    """The other way round: '(8)' is an int to numpy and '08' no Python integer; npy.c read both as (8,)."""
    from tuner.errors import TunerError
    from tuner.files import read_npy
    bad = _npy_with_header(tmp_path / "x.npy", header, np.zeros(8, np.float32).tobytes())
    with pytest.raises(TunerError, match=".npy header"):
        read_npy(bad, "--input")
    shape, err = _c_npy_read(native, bad)
    assert shape is None and ".npy header holds a shape" in err, (shape, err)
    np.save(tmp_path / "good.npy", np.zeros(8, np.float32))
    assert _c_npy_read(native, tmp_path / "good.npy") == ((8,), None)


def test_both_readers_agree_on_mutated_headers(native, tmp_path):
    """One grammar, two readers: over 600 headers made from numpy's by inserting, deleting or replacing a few
    characters, tuner.files.read_npy and npy.c read the same shape or both refuse (beside what the docs say
    differs: descr other than '<f4'/'<f2', and Fortran order, which only tuner run reads)."""
    import random

    from tuner.errors import TunerError
    from tuner.files import read_npy
    base = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }"
    alphabet = list("'\"(),:{} \t\n\r0123456789+-xTrueFals#_\\b") + ["True", "False", "'<f2'", "(1,)", "08", "1,"]
    rng = random.Random(0)
    cases = [base, base.replace("(2, 3)", "(6,)"), base.replace("(2, 3)", "(6)"), base.replace(", }", "}"),
             base.replace("'<f4'", '"<f4"'), base.replace(", }", ",, }")]
    for _ in range(600):
        chars = list(base)
        for _ in range(rng.randint(1, 3)):
            op, i = rng.random(), rng.randrange(len(chars))
            if op < 0.4:
                chars.insert(i, rng.choice(alphabet))
            elif op < 0.8:
                del chars[i]
            else:
                chars[i] = rng.choice(alphabet)
        cases.append("".join(chars))
    for header in cases:
        f = _npy_with_header(tmp_path / "x.npy", header, np.arange(6, dtype=np.float32).tobytes())
        c_shape, c_err = _c_npy_read(native, f)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                py_shape = read_npy(f, "--input").shape
        except TunerError:
            py_shape = None
        if c_err and ("descr must be" in c_err or "Fortran" in c_err):
            continue  # documented: tuner run reads any numeric type, and Fortran order
        assert py_shape == c_shape, (header, py_shape, c_shape, c_err)


def test_the_canonical_headers_numpy_writes_are_read(tmp_path):
    """What numpy.save writes still reads: 1-D (N,), 0 in a shape, several dimensions, float16, version 2."""
    from tuner.files import read_npy
    for a in (np.arange(3, dtype=np.float32), np.zeros((2, 0), np.float32), np.ones((1, 2, 3), np.float16)):
        np.save(tmp_path / "a.npy", a)
        assert np.array_equal(read_npy(tmp_path / "a.npy", "--input"), a)
    with open(tmp_path / "b.npy", "wb") as fh:
        np.lib.format.write_array(fh, np.arange(4, dtype=np.float32), version=(2, 0))
    assert read_npy(tmp_path / "b.npy", "--input").tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_an_input_of_rank_9_is_refused_by_both(runtime, art, native, env, device, tmp_path):
    """Finding: an input entry of shape [1, 1, 1, 1, 1, 1, 1, 8, 64] (the docs: rank 1 to 8) ran in tuner run;
    tuner-run refused it."""
    d = _copy(art["dir"], tmp_path / "a")
    (d / "signature").unlink(missing_ok=True)
    _edit_graph(d, lambda g: g["entries"]["x"].__setitem__("shape", [1, 1, 1, 1, 1, 1, 1, 8, 64]))
    _one_error(_run(runtime, native, env, device, d), "entries['x'].shape has 9 values, more than 8")


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_nul_in_a_json_string_is_refused_by_both(runtime, art, native, env, device, tmp_path):
    """Finding: an unused entry named "x\\u0000y" was read by Python's json, refused by tuner-run's."""
    d = _copy(art["dir"], tmp_path / "a")
    (d / "signature").unlink(missing_ok=True)

    def edit(g):
        g["entries"]["x\0y"] = dict(g["entries"]["x"], name="x\0y")
    _edit_graph(d, edit)
    _one_error(_run(runtime, native, env, device, d), "graph.json", "\\u0000")
