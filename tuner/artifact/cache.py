"""What running an artifact leaves behind, kept in the user's cache, never in the artifact (docs/artifact.md):
an artifact folder is the compiler's output, possibly signed, read-only or shared, and running it writes nothing
into it.

The cache's root is ``$TUNER_CACHE_DIR`` (an absolute path), else ``$XDG_CACHE_HOME/tuner``, else
``~/.cache/tuner`` (``cache_root``); the native runtime (native/src/runtime.c) resolves it the same way:

    binaries/<device>/<source hash>.bin   program binaries, keyed by the program's source and the device and driver
                                          (folders 0700, files 0600, read only while nobody else can write them):
                                          one artifact's programs serve every artifact of the same kernels
    artifacts/<manifest hash>/            per artifact, keyed by the SHA-256 of its manifest.json (so by every
        profile.json                      file it lists): ``tuner run --profile``'s per-layer table
        plans.json                        ``tuner compile``'s plan choice: each step's finalists, their times
                                          and spreads (``tuner.compile.compiler.fastest_plan``)

``profile_path(artifact_dir)`` is where an artifact's profile lives: ``tuner report --artifact`` reads it there
(``find_profile`` also finds the ``profile.json`` an older tuner wrote into the artifact).

Binaries are keyed by the source's hash, and only this user writes the cache, so a verified run (``--verify``)
takes its binaries from here too: what runs was built from the verified source. ``tuner compile`` puts the
programs it built here (``keep_programs``), in the Python executor's format and in tuner-run's, so the first
``tuner run`` or ``tuner-run`` after a compile builds nothing."""
from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

from tuner.errors import TunerError

CACHE_ENV = "TUNER_CACHE_DIR"
BINARIES = "binaries"
ARTIFACTS = "artifacts"
PROFILE = "profile.json"
PLANS = "plans.json"
NATIVE_MAGIC = b"tuner-native-clbin 2\n"  # native/src/bincache.c's format
_MANIFEST_CAP = 1 << 20


def cache_root() -> Path | None:
    """``$TUNER_CACHE_DIR``, else ``$XDG_CACHE_HOME/tuner``, else ``$HOME/.cache/tuner`` (each only when it is an
    absolute path, as tuner-run reads them); None where none is set."""
    own = os.environ.get(CACHE_ENV, "")
    if os.path.isabs(own):
        return Path(own)
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):
        home = os.environ.get("HOME", "")
        if not os.path.isabs(home):
            return None
        base = os.path.join(home, ".cache")
    return Path(base) / "tuner"


def binaries_dir() -> Path | None:
    """Where program binaries are kept (``<cache>/binaries``); None without a cache."""
    root = cache_root()
    return root / BINARIES if root is not None else None


def _no_cache() -> TunerError:
    return TunerError(f"no cache folder: set {CACHE_ENV} (or XDG_CACHE_HOME, or HOME) to an absolute path where "
                      f"tuner may keep profiles and program binaries")


def manifest_hash(artifact_dir) -> str:
    """SHA-256 (hex) of the artifact's manifest.json, which lists every file of the artifact with its hash: the
    key of its folder in the cache. A TunerError names the file when it cannot be read."""
    from tuner.files import FileProblem, read_capped
    path = Path(artifact_dir) / "manifest.json"
    try:
        data = read_capped(path, _MANIFEST_CAP, follow=False)
    except FileProblem as e:
        raise TunerError(f"cannot read {path}: {e.problem}; is {artifact_dir} a compiled model (`tuner compile "
                         f"MODEL -o {artifact_dir}`)?") from None
    return hashlib.sha256(data).hexdigest()


def artifact_cache(artifact_dir) -> Path:
    """The artifact's own folder in the cache, ``<cache>/artifacts/<manifest hash>`` (not made here)."""
    root = cache_root()
    if root is None:
        raise _no_cache()
    return root / ARTIFACTS / manifest_hash(artifact_dir)


def profile_path(artifact_dir) -> Path:
    """Where the profile of the artifact at ``artifact_dir`` lives (written by ``tuner run --profile``; it may not
    exist yet): ``<cache>/artifacts/<manifest hash>/profile.json``."""
    return artifact_cache(artifact_dir) / PROFILE


def plans_path(artifact_dir) -> Path:
    """Where ``tuner compile`` keeps the plan choice of the artifact (``plans.json``; it may not exist)."""
    return artifact_cache(artifact_dir) / PLANS


def find_profile(artifact_dir) -> Path | None:
    """The artifact's profile if one was written: in the cache, else a ``profile.json`` that an older tuner wrote
    into the artifact folder itself; None when there is none."""
    path = profile_path(artifact_dir)
    if path.is_file():
        return path
    legacy = Path(artifact_dir) / PROFILE
    return legacy if legacy.is_file() and not legacy.is_symlink() else None


def is_private_folder(folder: Path) -> bool:
    """A folder only this user can change: not a link, ours, writable by nobody else."""
    try:
        st = os.lstat(folder)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022


def private_folder(folder: Path) -> Path:
    """``folder``, made with every missing level 0700; an OSError (with the reason) when it cannot be made or is
    not this user's alone (a folder others can write, or a link: what is in it proves nothing)."""
    folder = Path(folder)
    missing = [p for p in (folder, *folder.parents) if not os.path.lexists(p)]
    for p in reversed(missing):
        try:
            p.mkdir(mode=0o700)
        except FileExistsError:
            pass
    if not is_private_folder(folder):
        raise OSError(f"{folder} is not a folder of this user's alone (a link, another owner, or writable by others)")
    return folder


def write_private(path: Path, data: bytes, sync: bool = True) -> None:
    """``data`` to ``path`` in a private folder (``private_folder``) as a new file of our own (O_EXCL, O_NOFOLLOW,
    0600), fsynced and renamed over the old one: a crash leaves the old file or the new one, never a torn one.
    ``sync=False`` (a program binary, whose header's length and SHA-256 refuse a torn file): no fsync."""
    path = Path(path)
    private_folder(path.parent)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _write_json(path: Path, data, what: str) -> Path:
    try:
        write_private(path, json.dumps(data, indent=1).encode())
    except OSError as e:
        raise TunerError(f"cannot write the {what} to {path}: {e.strerror or e}; set {CACHE_ENV} to a folder of "
                         f"your own") from None
    return path


def write_profile(artifact_dir, prof: dict) -> Path:
    """``tuner run --profile``'s table of the artifact, to ``profile_path`` (atomically); the artifact is untouched."""
    return _write_json(profile_path(artifact_dir), prof, "profile")


def write_plans(artifact_dir, plans: dict) -> Path:
    """A compile's plan choice (its steps, finalists, times and spreads), to ``plans_path`` (atomically)."""
    return _write_json(plans_path(artifact_dir), plans, "plan timings")


# -- program binaries ----------------------------------------------------------------------------------------------
def native_device_key(platform: str, name: str, driver_version: str) -> str:
    """tuner-run's folder name for a device (native/src/bincache.c ``tnr_binary_cache_key``): the device name's
    first 48 bytes, every byte but an ASCII letter or digit a '-', then '-' and 16 hex digits of the SHA-256 of
    platform, name and driver version joined by NUL bytes."""
    raw = name.encode()[:48]
    clean = "".join(chr(b) if b < 128 and chr(b).isalnum() else "-" for b in raw) or "device"
    digest = hashlib.sha256(b"\0".join(s.encode() for s in (platform, name, driver_version))).hexdigest()
    return f"{clean}-{digest[:16]}"


def write_native_binary(folder: Path, source: str, payload: bytes) -> Path:
    """A program binary in tuner-run's cache format, ``<folder>/<sha256 of the source file>.bin`` tagged
    ``<folder name>/<that hash>`` (native/src/bincache.h)."""
    sha = hashlib.sha256(source.encode()).hexdigest()
    head = f"{len(payload)} {hashlib.sha256(payload).hexdigest()} {folder.name}/{sha}\n".encode()
    path = folder / f"{sha}.bin"
    write_private(path, NATIVE_MAGIC + head + payload, sync=False)
    return path


def keep_programs(mod) -> int:
    """The programs of ``mod`` (a Module loaded on a device), kept in the binary cache for both runtimes: the
    Python executor's file (``tuner.runtime.opencl.program``) and tuner-run's, so the first run of the artifact
    builds nothing. The runtime keeps them (``Runtime.keep_programs``: the local OpenCL one writes both files,
    an agent's device keeps its own), so this module needs no OpenCL. Returns how many programs were kept; 0
    where there is no cache or no device. Never fails a compile: a cache that cannot be written is skipped."""
    bins = binaries_dir()
    runtime = getattr(mod, "runtime", None)
    if bins is None or runtime is None:
        return 0
    return runtime.keep_programs(dict.fromkeys(mod.sources.values()), bins)
