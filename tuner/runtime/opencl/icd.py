"""Make OpenCL runtimes installed as Python packages visible to the ICD loader, with no root.

Intel's CPU runtime for OpenCL (PyPI ``intel-opencl-rt``, installed by ``pip install 'tuner[cpu]'`` and by
``make``) is the CPU device of hosts whose CPU the PoCL bundled with pyopencl cannot compile for (its LLVM 14
does not know AMD Zen 5, for one). The ``.icd`` file that wheel ships points to a path that does not exist,
so nothing finds it. pyopencl's ICD loader reads the vendor files of one directory, ``OCL_ICD_VENDORS`` if
set, else ``/etc/OpenCL/vendors`` (plus the PoCL and Oclgrind of its own ``.libs``), and ignores
``OCL_ICD_FILENAMES``. So :func:`register_bundled_runtimes` writes a directory holding a copy of every vendor
file the loader would have read anyway plus one line per bundled runtime, and points ``OCL_ICD_VENDORS`` at
it. It must run before the first ``clGetPlatformIDs`` of the process (``tuner.runtime.opencl.device`` calls it
on import); child processes inherit the variable.

Set ``TUNER_BUNDLED_ICD=0`` to leave the loader's configuration alone.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
import tempfile
from importlib import metadata
from pathlib import Path

SYSTEM_VENDORS = Path("/etc/OpenCL/vendors")
ENV = "OCL_ICD_VENDORS"
# (distribution, library file name prefix) of the runtimes this module registers.
BUNDLED = (("intel-opencl-rt", "libintelocl.so"),)


def bundled_libraries() -> list[Path]:
    """Absolute paths of the OpenCL runtime libraries installed as Python packages in this environment."""
    found = []
    for dist, prefix in BUNDLED:
        direct = Path(sys.prefix) / "lib" / prefix  # where the wheels put it in a venv
        if direct.is_file():
            found.append(direct.resolve())
            continue
        try:
            files = metadata.distribution(dist).files or []
        except metadata.PackageNotFoundError:
            continue
        # the library itself (libintelocl.so, or .so.N): not a file that merely starts so, such as the
        # package's gdb helper's bytecode (__pycache__/libintelocl.so-gdb.cpython-311.pyc)
        libs = sorted((f for f in files if re.fullmatch(re.escape(prefix) + r"(\.\d+)*", f.name)),
                      key=lambda f: (f.name != prefix, str(f)))
        if libs:
            found.append(Path(libs[0].locate()).resolve())
    return [p for p in found if p.is_file()]


def _existing_vendor_files() -> dict[str, str]:
    """name -> text of the vendor files the loader reads without us (OCL_ICD_VENDORS, a dir or one file)."""
    where = Path(os.environ.get(ENV, "") or SYSTEM_VENDORS)
    paths = [where] if where.is_file() else sorted(where.glob("*.icd")) if where.is_dir() else []
    out = {}
    for p in paths:
        try:
            out[p.name] = p.read_text()
        except OSError:
            continue
    return out


def _cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tuner" / "icd"


def write_dir(files: dict[str, str]) -> Path | None:
    """A directory holding exactly `files` (vendor files), named by their hash (so concurrent processes agree),
    under the cache folder or else the temp folder; None if neither can be written."""
    digest = hashlib.sha1(repr(sorted(files.items())).encode()).hexdigest()[:12]
    for root in (_cache_root(), Path(tempfile.gettempdir()) / f"tuner-icd-{os.getuid()}"):
        target = root / digest
        try:
            if all((target / n).is_file() and (target / n).read_text() == t for n, t in files.items()):
                return target
            target.mkdir(parents=True, exist_ok=True)
            for name, text in files.items():
                tmp = target / f".{name}.{os.getpid()}"
                tmp.write_text(text)
                os.replace(tmp, target / name)  # atomic: a concurrent reader sees old or new, never half
            return target
        except OSError:
            continue
    return None


def register_bundled_runtimes() -> list[Path]:
    """Point OCL_ICD_VENDORS at a directory that adds the bundled runtimes to the usual vendors.

    Returns the libraries added (none when there are none, when the loader already lists them, or when
    TUNER_BUNDLED_ICD=0).
    """
    if os.environ.get("TUNER_BUNDLED_ICD", "1") == "0":
        return []
    libs = bundled_libraries()
    if not libs:
        return []
    files = _existing_vendor_files()
    listed = {line.strip() for text in files.values() for line in text.splitlines()}
    added = [lib for lib in libs if str(lib) not in listed]
    if not added:
        return []
    for lib in added:
        files[f"tuner-{lib.name.split('.so')[0]}.icd"] = f"{lib}\n"
    target = write_dir(files)
    if target is None:
        return []
    os.environ[ENV] = str(target)
    return added
