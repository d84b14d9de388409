"""Cache folders the OpenCL runtimes need, checked before the first OpenCL call (``tuner.runtime.opencl.device``
calls ``ensure_cache_folders`` on import, next to ``register_bundled_runtimes``)."""
from __future__ import annotations


def _writable_folder(path, private: bool = False) -> str | None:
    """None if ``path`` is (or can be made) a folder this process can write a file in, else why not. ``private``:
    made readable by this user only, and refused unless this user owns it (a folder under the shared temp dir)."""
    import os
    import tempfile
    from pathlib import Path
    try:
        Path(path).mkdir(mode=0o700 if private else 0o777, parents=True, exist_ok=True)
        if private and hasattr(os, "getuid") and os.stat(path).st_uid != os.getuid():
            return "owned by another user"
        fd, probe = tempfile.mkstemp(dir=path, prefix=".tuner-write-check-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        return e.strerror or str(e)
    return None


def ensure_cache_folders() -> None:
    """PoCL keeps its kernel cache in $POCL_CACHE_DIR, else $XDG_CACHE_HOME/pocl (~/.cache/pocl), and when it
    cannot create that folder it reports no device at all; pyopencl's program cache ($XDG_CACHE_HOME/pyopencl)
    then fails on every build. So before any OpenCL platform is enumerated: if the folder cannot be written,
    point the variable at a private folder under the temp dir (for this process and the measuring processes it
    starts), with a one-line warning that says which folder and how to choose another."""
    import os
    import tempfile
    import warnings
    from pathlib import Path
    fallback = Path(tempfile.gettempdir()) / f"tuner-cache-{os.getuid() if hasattr(os, 'getuid') else 'user'}"
    home = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    for var, folder, instead in (("XDG_CACHE_HOME", home, fallback),
                                 ("POCL_CACHE_DIR", os.environ.get("POCL_CACHE_DIR"), fallback / "pocl")):
        why = _writable_folder(folder) if folder else None
        if why is None or _writable_folder(instead, private=True) is not None:
            continue
        os.environ[var] = str(instead)
        warnings.warn(f"the cache folder {folder} cannot be written ({why}): caching in {instead} instead; set "
                      f"${var} to a writable folder to choose another", RuntimeWarning, stacklevel=2)
