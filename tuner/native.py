"""The native runtime (``native/``, C): building it, and the environment its programs need to find OpenCL.

``build()`` runs ``make -C native`` with the system C compiler and returns the paths it produced, in
:func:`default_build_dir` (below, ``BUILD``): ``library`` (``BUILD/libtuner_runtime.so``), ``tuner_run``
(``BUILD/tuner-run``), ``tuner_run_asan`` (``BUILD/asan/tuner-run``, AddressSanitizer + UBSan), and the device
agent (docs/agent-protocol.md) ``agent`` (``BUILD/tuner-agent``) and ``agent_asan``
(``BUILD/asan/tuner-agent``). ``build(target)`` for a cross target (:data:`CROSS`) builds
``libtuner_runtime.so``, ``tuner-run`` and ``tuner-agent`` into ``BUILD/<target>/`` with a cross compiler
(zig, Debian's ``aarch64-linux-gnu-gcc``, or the Android NDK's clang). ``native_main(argv)`` is the ``tuner
native build`` command: it prints one ``runtime PATH`` line per runtime product and one ``agent PATH`` line per
agent.

The sources (:data:`NATIVE`) are a source checkout's ``native/``, or in an installed tuner the copy its wheel
carries as package data (``tuner/native_src``: the Makefile, ``src/``, ``include/``, ``examples/``, ``asan/``).
``BUILD`` is a checkout's ``build/native`` when this user can write there (what ``make -C native`` builds), else
a folder of the user's cache: ``$XDG_CACHE_HOME/tuner/native/<version>-<hash of the sources>`` (default
``~/.cache``), one per source tree, so installs of other versions never share objects; where the cache cannot be
written, the same under the temp folder, in a folder of this user's own.

``opencl_env()`` is the environment a native program needs on a host whose OpenCL comes from Python wheels,
as on this project's machines: there is no system ``libOpenCL``, pyopencl's wheel bundles an ICD loader
(``pyopencl/.libs/libOpenCL-*.so*``) with PoCL and Oclgrind, and ``intel-opencl-rt`` adds Intel's CPU
runtime (``tuner.runtime.opencl.icd``). That loader

- crashes in ``__initClIcd`` unless ``PYOPENCL_HOME`` is set (it appends ``/.libs`` to it and reads the
  ``.icd`` files there, whose library names are relative and only resolve inside a Python process that has
  pyopencl loaded);
- reads vendor files from the one directory ``OCL_ICD_VENDORS`` names; their library paths must be absolute.

So it writes a vendors directory holding, in this order, the vendor files the Python side's loader reads
(``/etc/OpenCL/vendors`` or ``$OCL_ICD_VENDORS``), one per runtime installed as a Python package, and pyopencl's
own PoCL and Oclgrind with absolute paths; it points ``OCL_ICD_VENDORS`` at it and ``PYOPENCL_HOME`` at it too
(no ``.libs`` there: nothing is listed twice), and ``TUNER_OPENCL_LIB`` at the bundled loader. The device
order then matches ``tuner devices``. A ``TUNER_OPENCL_LIB`` already set is left alone (with its environment).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tuner.errors import TunerError

PACKAGE = Path(__file__).resolve().parent
ROOT = PACKAGE.parent  # a source checkout's root; site-packages in an installed tuner
INSTALLED = PACKAGE / "native_src"  # native/ as the wheel carries it (pyproject.toml's package data)
NATIVE = next((d for d in (INSTALLED, ROOT / "native") if (d / "Makefile").is_file()), INSTALLED)
CHECKOUT = NATIVE == ROOT / "native"  # built from a source checkout (an editable install, or PYTHONPATH)
PRODUCTS = {"library": "libtuner_runtime.so", "tuner_run": "tuner-run", "tuner_run_asan": "asan/tuner-run",
            "agent": "tuner-agent", "agent_asan": "asan/tuner-agent"}
AGENTS = ("agent", "agent_asan")  # the device agent (docs/agent-protocol.md); the rest is the runtime
# For cross builds, native/Makefile's source lists (tests check they match): the runtime library (LIB_SRCS),
# tuner-run (the CLI's file plus those) and the agent (AGENT_SRCS). C11; libc, libm, libdl, pthread.
RUNTIME_SOURCES = ("common.c", "sha256.c", "json.c", "half.c", "npy.c", "opencl.c", "bincache.c", "bounds.c",
                   "artifact.c", "runtime.c")
CLI_SOURCE = "tuner_run.c"
AGENT_SOURCES = ("common.c", "sha256.c", "opencl.c", "bincache.c", "proto.c", "executor.c", "agent.c")
# target -> (what it is for, zig's target triple; None: the NDK's clang)
CROSS = {
    "linux-arm64": ("64-bit Arm Linux with glibc 2.17 or later (boards, Termux-less Linux)", "aarch64-linux-gnu.2.17"),
    "linux-x86_64": ("x86_64 Linux with glibc 2.17 or later", "x86_64-linux-gnu.2.17"),
    "android-arm64": ("Android 7 (API 24) or later on arm64-v8a, with the NDK", None),
}
# target -> Debian's cross gcc, used where zig is not (its programs need the build machine's glibc or later:
# 2.36 on bookworm) and the Debian package that has it
GCC_CROSS = {"linux-arm64": ("aarch64-linux-gnu-gcc", "gcc-aarch64-linux-gnu")}
CROSS_CFLAGS = ("-O2", "-std=c11", "-Wall", "-Wextra", "-Werror", "-Wno-format-truncation", "-fPIC")
# every cross program and library is linked with full RELRO, as native/Makefile links the host's (HARDEN_LDFLAGS):
# the agent must bind every symbol at start (a lazy binding spills the vector registers, and a token in them, onto
# a stack the forked executor inherits; issue 54), and the GOT is read-only after. Debian's aarch64-linux-gnu-gcc
# binds lazily unless told; zig and the NDK's clang bind at start by default, but say so too.
CROSS_LDFLAGS = ("-Wl,-z,relro", "-Wl,-z,now")


def _writable(path: Path) -> bool:
    """Whether this user can make ``path`` (a folder) or write in it: its nearest existing folder is writable."""
    for p in (path, *path.parents):
        if p.exists():
            return p.is_dir() and os.access(p, os.W_OK | os.X_OK)
    return False


@functools.cache
def _source_hash() -> str:
    """SHA-256 (hex) of what the build reads: the Makefile, ``src/`` and ``include/``, by path and content."""
    h = hashlib.sha256()
    files = [NATIVE / "Makefile", *sorted((NATIVE / "src").glob("*")), *sorted((NATIVE / "include").glob("*"))]
    for f in files:
        if f.is_file():
            h.update(f"{f.relative_to(NATIVE).as_posix()}\0{f.stat().st_size}\0".encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def _make_folders(path: Path) -> None:
    """``path`` and the folders above it that do not exist yet, each new one 0700 (under a umask of 002 a
    folder ``mkdir -p`` makes is group-writable)."""
    for p in reversed([p for p in (path, *path.parents) if not p.exists()]):
        p.mkdir(mode=0o700, exist_ok=True)


def _own_folder(path: Path) -> bool:
    """``path`` made (``_make_folders``) and a folder of this user's that this user can write in."""
    try:
        _make_folders(path)
        st = path.stat()
    except OSError:
        return False
    mine = not hasattr(os, "getuid") or st.st_uid == os.getuid()
    return mine and os.access(path, os.W_OK | os.X_OK)


def default_build_dir() -> Path:
    """Where ``build()`` puts the host's programs (a cross target's in ``<target>/`` below; see the module
    docstring): a source checkout's ``build/native`` when this user can write there, else
    ``$XDG_CACHE_HOME/tuner/native/<version>-<hash of the sources>`` (``~/.cache``), else the same under the
    temp folder's ``tuner-cache-<uid>`` (where the OpenCL drivers' cache folders fall back to as well).
    Nothing is made here, except a fallback folder's levels to check that they are this user's own."""
    if CHECKOUT and _writable(ROOT / "build" / "native"):
        return ROOT / "build" / "native"
    from tuner import __version__
    key = Path("tuner", "native", f"{__version__}-{_source_hash()[:12]}")
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / key
    if _writable(cache):
        return cache
    uid = os.getuid() if hasattr(os, "getuid") else "user"
    fallback = Path(tempfile.gettempdir()) / f"tuner-cache-{uid}" / key
    if _own_folder(fallback):
        return fallback
    raise TunerError(f"no folder to build the native runtime in: neither {cache} nor {fallback} can be written "
                     f"(pass --build-dir DIR, or set $XDG_CACHE_HOME to a writable folder)")


def __getattr__(name):
    if name == "BUILD":  # once a constant (the checkout's build/native); now where this install builds
        return default_build_dir()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def build(target: str = "host", build_dir=None, quiet: bool = True, ndk=None, compiler=None) -> dict:
    """Build the native runtime and the device agent for ``target`` and return the paths: for ``host`` (this
    machine, with its gcc; incremental, make) ``{"library", "tuner_run", "tuner_run_asan", "agent",
    "agent_asan"}``; for a cross target (:data:`CROSS`) ``{"library", "tuner_run", "agent"}`` in
    ``default_build_dir()/<target>/`` (no ASan builds), built with ``zig cc`` (``zig`` on PATH or the ``ziglang``
    package), else for ``linux-arm64`` Debian's ``aarch64-linux-gnu-gcc``, or for ``android-arm64`` the NDK's
    clang (``ndk``: the NDK's directory, default ``$ANDROID_NDK_HOME``). ``compiler`` (``"zig"`` or ``"gcc"``)
    picks one of the first two. ``build_dir``: where, instead of :func:`default_build_dir` (and its
    ``<target>/``). Push the Android agent with ``TUNER_AGENT_ANDROID=PATH`` (adb:// finds
    ``default_build_dir()/android-arm64/tuner-agent`` by itself)."""
    if target != "host":
        return _cross_build(target, build_dir, ndk, compiler)
    _check_sources()
    for tool in ("make", os.environ.get("CC", "gcc")):
        if shutil.which(tool) is None:
            raise TunerError(f"building the native runtime needs {tool!r} on PATH")
    # make runs in NATIVE: a relative --build-dir is the caller's, so it is made absolute here
    out = Path(build_dir).resolve() if build_dir is not None else default_build_dir()
    if build_dir is None and out != ROOT / "build" / "native":
        try:
            _make_folders(out)  # a cache folder: this user's alone
        except OSError as e:
            raise TunerError(f"cannot make the native build folder {out}: {e.strerror or e}") from None
    cmd = ["make", "-C", str(NATIVE), f"BUILD={out}", f"-j{min(4, os.cpu_count() or 1)}"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-30:])
        raise TunerError(f"native build failed ({' '.join(cmd)}):\n{tail}")
    if not quiet and proc.stdout.strip():
        print(proc.stdout.strip())
    paths = {k: out / v for k, v in PRODUCTS.items()}
    missing = [str(p) for p in paths.values() if not p.is_file()]
    if missing:
        raise TunerError(f"native build finished without {', '.join(missing)}")
    return {k: str(p) for k, p in paths.items()}


def _check_sources() -> None:
    if not (NATIVE / "Makefile").is_file() or not (NATIVE / "src").is_dir():
        raise TunerError(f"no native sources at {NATIVE}: this tuner was installed without them (the wheel carries "
                         f"them as tuner/native_src; a source checkout has native/)")


def _zig() -> list | None:
    if shutil.which("zig"):
        return ["zig"]
    if importlib.util.find_spec("ziglang") is not None:
        return [sys.executable, "-m", "ziglang"]
    return None


def _cross_cc(target: str, ndk, compiler) -> list:
    """The compiler command (a list) for ``target``, or a one-line TunerError naming what to install."""
    triple = CROSS[target][1]
    if triple is None:  # Android: bionic needs the NDK's sysroot
        ndk = ndk or os.environ.get("ANDROID_NDK_HOME") or os.environ.get("ANDROID_NDK_ROOT")
        clang = sorted(Path(ndk).glob("toolchains/llvm/prebuilt/*/bin/aarch64-linux-android24-clang")) if ndk else []
        if not clang:
            raise TunerError(f"native build --target {target}: needs the Android NDK (r21 or later): pass --ndk DIR "
                             f"or set ANDROID_NDK_HOME" + (f" ({ndk} has no aarch64-linux-android24-clang)" if ndk else ""))
        return [str(clang[0])]
    if compiler not in (None, "zig", "gcc"):
        raise TunerError(f"native build --target {target}: compiler {compiler!r}: choose zig or gcc")
    gcc, package = GCC_CROSS.get(target, (None, None))
    if compiler != "gcc":
        zig = _zig()
        if zig is not None:
            return [*zig, "cc", "-target", triple]
        if compiler == "zig" or gcc is None:
            raise TunerError(f"native build --target {target}: needs zig (`pip install ziglang`, or zig on PATH)")
    elif gcc is None:
        raise TunerError(f"native build --target {target}: builds with zig only (`pip install ziglang`, or zig on "
                         f"PATH); gcc cross builds are for {', '.join(GCC_CROSS)}")
    if shutil.which(gcc):
        return [gcc]
    raise TunerError(f"native build --target {target}: needs " + ("" if compiler == "gcc" else "zig (`pip install "
                     "ziglang`, or zig on PATH) or ") + f"{gcc} on PATH (`apt-get install {package}`)")


def _cross_build(target: str, build_dir, ndk, compiler=None) -> dict:
    """The runtime library, tuner-run and the agent for ``target``: each source compiled once (-fPIC) into
    ``obj/``, then linked three ways, stripped."""
    if target not in CROSS:
        raise TunerError(f"native build target {target!r}: choose host, "
                         + ", ".join(f"{k} ({v[0]})" for k, v in CROSS.items()))
    _check_sources()
    cc = _cross_cc(target, ndk, compiler)
    out = (Path(build_dir) if build_dir is not None else default_build_dir() / target)
    obj = out / "obj"
    obj.mkdir(parents=True, exist_ok=True)
    # bionic has pthread in libc and no libpthread
    libs = ["-ldl", "-lm"] if target.startswith("android") else ["-ldl", "-lm", "-lpthread"]
    sources = sorted({*RUNTIME_SOURCES, CLI_SOURCE, *AGENT_SOURCES})

    def run(cmd, what):
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-30:])
            raise TunerError(f"native build for {target} failed at {what} ({' '.join(cmd[:4])} ...):\n{tail}")

    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
        for f in [pool.submit(run, [*cc, *CROSS_CFLAGS, "-c", str(NATIVE / "src" / s), "-o", str(obj / f"{s[:-2]}.o")],
                              s) for s in sources]:
            f.result()

    def o(names):
        return [str(obj / f"{s[:-2]}.o") for s in names]

    products = {
        "library": (out / PRODUCTS["library"], ["-shared", "-Wl,-soname,libtuner_runtime.so", "-Wl,--no-undefined",
                                                *o(RUNTIME_SOURCES)]),
        "tuner_run": (out / PRODUCTS["tuner_run"], o((CLI_SOURCE, *RUNTIME_SOURCES))),
        "agent": (out / PRODUCTS["agent"], o(AGENT_SOURCES)),
    }
    for path, args in products.values():
        path.unlink(missing_ok=True)
        run([*cc, *args, *CROSS_LDFLAGS, "-o", str(path), *libs, "-s"], path.name)
        if not path.is_file():
            raise TunerError(f"native build for {target} finished without {path}")
    return {k: str(path) for k, (path, _) in products.items()}


def _pyopencl_dir() -> Path | None:
    """pyopencl's package folder, found and not imported: importing it initializes the ICD loader, and tuner
    imports it only where it runs OpenCL itself."""
    try:
        spec = importlib.util.find_spec("pyopencl")  # a top-level name: nothing is imported to find it
    except (ImportError, ValueError):
        return None
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    return Path(folders[0]).resolve() if folders else None


def bundled_loader() -> Path | None:
    """pyopencl's bundled ICD loader (``pyopencl/.libs/libOpenCL-*.so*``), if this environment has one."""
    pkg = _pyopencl_dir()
    if pkg is None:
        return None
    for libs in (pkg / ".libs", pkg.parent / "pyopencl.libs"):
        found = sorted(libs.glob("libOpenCL*.so*")) if libs.is_dir() else []
        if found:
            return found[0]
    return None


def _vendor_files() -> list[tuple[str, str]]:
    """(name, text) of the vendor files, in the order the Python side's loader meets their platforms."""
    from tuner.runtime.opencl import icd
    files = []
    where = os.environ.get(icd.ENV, "")
    base = Path(where) if where else icd.SYSTEM_VENDORS
    paths = [base] if base.is_file() else sorted(base.glob("*.icd")) if base.is_dir() else []
    listed = set()
    for p in paths:
        try:
            text = p.read_text()
        except OSError:
            continue
        files.append((p.name, text))
        listed.update(line.strip() for line in text.splitlines())
    if os.environ.get("TUNER_BUNDLED_ICD", "1") != "0":
        for lib in icd.bundled_libraries():
            if str(lib) not in listed:
                files.append((f"tuner-{lib.name.split('.so')[0]}.icd", f"{lib}\n"))
    pkg = _pyopencl_dir()
    libs = pkg / ".libs" if pkg is not None else None
    if libs is not None and libs.is_dir():
        for icd_file in sorted(libs.glob("*.icd")):
            name = icd_file.read_text().strip()
            if name and (libs / name).is_file():
                files.append((icd_file.name, f"{(libs / name).resolve()}\n"))
    return files


def _write_vendors(files: list[tuple[str, str]]) -> Path:
    """The vendors directory of ``files``, numbered in order (the ICD loader reads them sorted)."""
    from tuner.runtime.opencl.icd import write_dir
    target = write_dir({f"{i:02d}-{name}": text for i, (name, text) in enumerate(files)})
    if target is None:
        raise TunerError("cannot write an OpenCL vendors directory for native programs: neither the cache folder "
                         "($XDG_CACHE_HOME) nor the temp folder can be written")
    return target


def opencl_env(base: dict | None = None) -> dict:
    """``base`` (default ``os.environ``) plus what a native program needs to load OpenCL here: see the module
    docstring. Unchanged when ``TUNER_OPENCL_LIB`` is set or no bundled loader exists (a system OpenCL)."""
    env = dict(os.environ if base is None else base)
    if env.get("TUNER_OPENCL_LIB"):
        return env
    loader = bundled_loader()
    if loader is None:
        return env
    vendors = _write_vendors(_vendor_files())
    env["TUNER_OPENCL_LIB"] = str(loader)
    env["OCL_ICD_VENDORS"] = str(vendors)
    env["PYOPENCL_HOME"] = str(vendors)  # the loader needs it set; vendors/.libs does not exist
    return env


def bench_artifact(path, device: str, repeats: int = 20, warmup: int = 2, exe=None, timeout: float = 600) -> float:
    """Median seconds of a whole run (inputs written, kernels, outputs read) of the artifact at ``path``, timed
    by ``tuner-run --bench`` in a fresh process on ``device`` (a spec tuner-run takes, e.g. the fingerprint).
    The program binaries are kept in the user's cache (``tuner.artifact.cache``), so only the first call builds
    them. ``exe``: tuner-run (default: ``build()``'s, made now if it is not built yet)."""
    import re
    exe = Path(exe) if exe else Path(build()["tuner_run"])  # incremental: built on first use
    cmd = [str(exe), str(path), "--device", device, "--bench", str(repeats), "--warmup", str(warmup)]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, env=opencl_env(), timeout=timeout)
    except subprocess.TimeoutExpired:
        raise TunerError(f"tuner-run {path} ran over {timeout:.0f} s") from None
    m = re.search(r"median latency ([0-9.]+) ms", out.stdout)
    if out.returncode or not m:
        raise TunerError(f"tuner-run {path} failed (exit {out.returncode}): "
                         f"{(out.stderr or out.stdout).strip()[-400:]}")
    return float(m.group(1)) * 1e-3
