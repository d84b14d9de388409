"""The native runtime (``native/``, C): building it, and the environment its programs need to find OpenCL.

``build()`` runs ``make -C native`` with the system C compiler and returns the paths it produced:
``library`` (``build/native/libtuner_runtime.so``), ``tuner_run`` (``build/native/tuner-run``),
``tuner_run_asan`` (``build/native/asan/tuner-run``, AddressSanitizer + UBSan), and the device agent
(docs/agent-protocol.md) ``agent`` (``build/native/tuner-agent``) and ``agent_asan``
(``build/native/asan/tuner-agent``). ``native_main(argv)`` is the ``tuner native build`` command: it prints
one ``runtime PATH`` line per runtime product and one ``agent PATH`` line per agent.

``opencl_env()`` is the environment a native program needs on a host whose OpenCL comes from Python wheels,
as on this project's machines: there is no system ``libOpenCL``, pyopencl's wheel bundles an ICD loader
(``pyopencl/.libs/libOpenCL-*.so*``) with PoCL and Oclgrind, and ``intel-opencl-rt`` adds Intel's CPU
runtime (``tuner.runtime.icd``). That loader

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

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tuner.errors import TunerError

ROOT = Path(__file__).resolve().parent.parent
NATIVE = ROOT / "native"
BUILD = ROOT / "build" / "native"
PRODUCTS = {"library": "libtuner_runtime.so", "tuner_run": "tuner-run", "tuner_run_asan": "asan/tuner-run",
            "agent": "tuner-agent", "agent_asan": "asan/tuner-agent"}
AGENTS = ("agent", "agent_asan")  # the device agent (docs/agent-protocol.md); the rest is the runtime


def build(target: str = "host", build_dir=None, quiet: bool = True) -> dict:
    """Build the native runtime and the device agent for ``target`` (only ``host``: this machine, with its gcc)
    and return ``{"library": path, "tuner_run": path, "tuner_run_asan": path, "agent": path, "agent_asan":
    path}``. Incremental (make)."""
    if target != "host":
        raise TunerError(f"native build target {target!r}: only 'host' is supported for now")
    if not (NATIVE / "Makefile").is_file():
        raise TunerError(f"no native sources at {NATIVE} (the native runtime is built from a source checkout)")
    for tool in ("make", os.environ.get("CC", "gcc")):
        if shutil.which(tool) is None:
            raise TunerError(f"building the native runtime needs {tool!r} on PATH")
    out = Path(build_dir) if build_dir is not None else BUILD
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


def _pyopencl_dir() -> Path | None:
    spec = importlib.util.find_spec("pyopencl")  # found, not imported: importing it initializes the loader
    if spec is None or not spec.origin:
        return None
    return Path(spec.origin).resolve().parent


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
    from tuner.runtime import icd
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
    numbered = {f"{i:02d}-{name}": text for i, (name, text) in enumerate(files)}
    digest = hashlib.sha1(repr(sorted(numbered.items())).encode()).hexdigest()[:12]
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    last = None
    for root in (Path(base) / "tuner" / "native-icd", Path(tempfile.gettempdir()) / f"tuner-native-icd-{os.getuid()}"):
        target = root / digest
        try:
            if all((target / n).is_file() and (target / n).read_text() == t for n, t in numbered.items()):
                return target
            target.mkdir(parents=True, exist_ok=True)
            for name, text in numbered.items():
                tmp = target / f".{name}.{os.getpid()}"
                tmp.write_text(text)
                os.replace(tmp, target / name)  # atomic: a concurrent reader sees old or new, never half
            return target
        except OSError as e:
            last = e
    raise TunerError(f"cannot write an OpenCL vendors directory for native programs ({last})")


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


def native_main(argv=None) -> int:
    """``tuner native build [--target host] [--build-dir DIR]``: build and print ``runtime PATH`` lines;
    ``tuner native env``: print the environment (``NAME=VALUE``) a native program needs for OpenCL here."""
    import argparse
    p = argparse.ArgumentParser(prog="tuner native", description="the native runtime (C): build it, run it")
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build build/native/{libtuner_runtime.so,tuner-run,tuner-agent} and their "
                                     "ASan builds under asan/")
    b.add_argument("--target", default="host", help="only 'host' for now")
    b.add_argument("--build-dir", default=None, help="where (default build/native)")
    sub.add_parser("env", help="print the OpenCL environment a native program needs here")
    args = p.parse_args(argv)
    try:
        if args.cmd == "build":
            for key, path in build(args.target, args.build_dir).items():
                print(f"{'agent' if key in AGENTS else 'runtime'} {path}")
        else:
            env = opencl_env({})
            for k in ("TUNER_OPENCL_LIB", "OCL_ICD_VENDORS", "PYOPENCL_HOME"):
                if k in env:
                    print(f"{k}={env[k]}")
    except TunerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(native_main())
