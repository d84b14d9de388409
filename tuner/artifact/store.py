"""Writing and reading an artifact folder (docs/artifact.md).

``write_artifact`` builds the whole folder under a temporary name beside the target and renames it into place:
a folder holds one compile or none, so nothing stale survives a recompile and a failed one leaves nothing.
``read_artifact`` verifies the manifest (check 1: every file's size and SHA-256), reads graph.json strictly
(check 2) and runs checks 3 to 11 before it returns anything."""
from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import stat
import tempfile
from pathlib import Path

import numpy as np

from .checks import KERNEL_FILE, check_spec
from .format import FORMAT, PARAM_ALIGN, VERSION, ArtifactError, ModuleSpec

MANIFEST = "manifest.json"
GRAPH = "graph.json"
PARAMS = "params.bin"
KERNELS = "kernels"
BINARIES = "binaries"  # <artifact>/binaries/<device fingerprint>/<source hash>.bin: a runtime's cache
MANIFEST_PATH = re.compile(r"^(graph\.json|params\.bin|kernels/k[0-9]{3,6}\.cl)$")
MAX_MANIFEST = 1 << 20
MAX_GRAPH = 64 << 20
MAX_KERNEL = 16 << 20
MAX_PARAMS = 1 << 40  # no cap short of memory: the weights are as big as the model


def kernel_file(index: int) -> str:
    """The file name of node ``index``'s source: never derived from the node's name (which may be anything an
    ONNX file says, 300 characters or a path)."""
    return f"k{index:03d}.cl"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# -- writing -----------------------------------------------------------------------------------------------
def layout_params(spec: ModuleSpec) -> int:
    """Set each param's ``offset`` (64-byte aligned, in spec order) and ``nbytes``; the size of params.bin."""
    end = 0
    for b in spec.params:
        b.offset = -(-end // PARAM_ALIGN) * PARAM_ALIGN
        b.nbytes = math.prod(b.physical_shape) * np.dtype(b.dtype).itemsize
        end = b.offset + b.nbytes
    return end


def _write_files(d: Path, spec: ModuleSpec, sources: dict, params: dict) -> None:
    (d / KERNELS).mkdir()
    for name, src in sources.items():
        (d / KERNELS / name).write_text(src)
    size = layout_params(spec)
    with open(d / PARAMS, "wb") as f:
        f.truncate(size)
        for b in spec.params:
            f.seek(b.offset)
            f.write(np.ascontiguousarray(params[b.key], dtype=np.dtype(b.dtype)).tobytes())
    (d / GRAPH).write_text(json.dumps(spec.to_json(), indent=1))
    files = [GRAPH, PARAMS, *(f"{KERNELS}/{n}" for n in sources)]
    manifest = {"format": FORMAT, "version": VERSION,
                "files": [{"path": p, "size": (d / p).stat().st_size, "sha256": _sha256(d / p)} for p in files]}
    (d / MANIFEST).write_text(json.dumps(manifest, indent=1))


def _replaceable(d: Path) -> bool:
    """Whether ``d`` may be replaced by a compile: absent, empty, or an artifact (any version)."""
    if not d.exists() and not d.is_symlink():
        return True
    if not d.is_dir() or d.is_symlink():
        return False
    names = {p.name for p in d.iterdir()}
    return not names or bool(names & {MANIFEST, GRAPH})


def check_output_dir(path) -> Path:
    """``path`` as an artifact folder a compile may write: refused at once (before any work) when it is empty,
    or an existing file or non-empty folder that is not a compiled model (a compile replaces an artifact
    whole, and never anything else)."""
    if not str(path).strip():
        raise ArtifactError("-o is empty: name the folder the compiled model goes to, e.g. -o build/model")
    d = Path(path)
    if not _replaceable(d):
        raise ArtifactError(f"{d} exists and is not a compiled model; choose another -o folder or remove it")
    return d


def write_artifact(path, spec: ModuleSpec, sources: dict, params: dict) -> str:
    """Write the artifact to ``path`` atomically (a temporary sibling folder renamed into place). An existing
    artifact there is replaced whole; any other existing file or non-empty folder is refused."""
    d = check_output_dir(path)
    parent = d.parent
    tmp = None
    try:
        parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{d.name}.new-", dir=parent))
        _write_files(tmp, spec, sources, params)
        old = None
        if d.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{d.name}.old-", dir=parent))
            os.replace(d, old / "a")
        os.replace(tmp, d)
        tmp = None
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except OSError as e:
        raise ArtifactError(f"cannot write the compiled model to {d}: {e.strerror or e}") from None
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return str(d)


# -- reading -----------------------------------------------------------------------------------------------
def _redo(d: Path) -> str:
    return f"recompile the model (`tuner compile MODEL -o {d}`)"


class _Folder:
    """An artifact folder opened once: every file is read relative to that descriptor (and kernels/ to its own,
    opened without following a link), each with O_NOFOLLOW and O_NONBLOCK and checked on its descriptor
    (``files.read_capped``): a link, a FIFO, a device or an oversized file is refused before a byte is read, and
    no file can be swapped between a check and the read that is used."""

    def __init__(self, d: Path):
        self.d = d
        self.kernels = None
        try:
            self.fd = os.open(d, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
        except OSError as e:
            raise ArtifactError(f"{d} cannot be opened ({e.strerror}); {_redo(d)}") from None

    def close(self) -> None:
        for fd in (self.fd, self.kernels):
            if fd is not None:
                os.close(fd)
        self.fd = self.kernels = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _kernels(self) -> int:
        if self.kernels is None:
            flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0) | \
                getattr(os, "O_CLOEXEC", 0)
            try:
                self.kernels = os.open(KERNELS, flags, dir_fd=self.fd)
            except FileNotFoundError:
                raise ArtifactError(f"{self.d / KERNELS} is missing; {_redo(self.d)}") from None
            except OSError:
                link = stat.S_ISLNK(os.lstat(KERNELS, dir_fd=self.fd).st_mode)
                raise ArtifactError(f"{self.d / KERNELS} is {'a symbolic link' if link else 'not a folder'}; an "
                                    f"artifact holds its own files; {_redo(self.d)}") from None
        return self.kernels

    def read(self, rel: str, cap: int, size: int | None = None, missing_ok: bool = False) -> bytes | None:
        """The bytes of ``rel`` (``kernels/kNNN.cl`` or a top-level name); ``size``: what the manifest says."""
        from tuner.files import FileProblem, read_capped
        p, d = self.d / rel, self.d
        dir_fd, name = (self._kernels(), rel[len(KERNELS) + 1:]) if rel.startswith(KERNELS + "/") else (self.fd, rel)
        try:
            return read_capped(name, cap, dir_fd=dir_fd, follow=False, size=size)
        except FileProblem as e:
            if e.missing:
                if missing_ok:
                    return None
                raise ArtifactError(f"{p} is missing; {_redo(d)}") from None
            if e.link:
                raise ArtifactError(f"{p} is a symbolic link; an artifact holds its own files; {_redo(d)}") from None
            if e.size is not None and size is not None and e.size != size:
                raise ArtifactError(f"{p} holds {e.size} bytes, the manifest says {size}: the file was truncated or "
                                    f"replaced; {_redo(d)}") from None
            if e.size is not None:
                raise ArtifactError(f"{p} holds {e.size} bytes, more than the {cap} an artifact's file may; "
                                    f"{_redo(d)}") from None
            what = "is not a regular file" if "not a regular file" in e.problem else f"cannot be read ({e.problem})"
            raise ArtifactError(f"{p} {what}; {_redo(d)}") from None


def _no_duplicates(pairs: list) -> dict:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError(f"key {next(k for k in keys if keys.count(k) > 1)!r} appears twice in one object")
    return dict(pairs)


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def _strict_strings(doc) -> None:
    """Every string of a parsed document (keys included) one tuner-run reads too (native/src/json.c): no
    ``\\u0000`` (a C string would end there) and no unpaired surrogate (``\\ud800``: not a character, it cannot
    even be printed); a ValueError names which."""
    stack = [doc]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            if "\0" in v:
                raise ValueError("\\u0000 in a string")
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError("unpaired surrogate in a \\u escape") from None
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)


def _json(data: bytes, path: Path, d: Path):
    """Strict JSON (RFC 8259), as the native runtime reads it: no repeated keys, no NaN or Infinity, no
    \\u0000 or unpaired surrogate in a string."""
    try:
        # UTF-8 with no byte order mark (RFC 8259, and tuner-run): json.loads(bytes) would also take UTF-16/32
        text = data.decode("utf-8") if isinstance(data, bytes) else data
        if text.startswith("\ufeff"):
            raise ValueError("it starts with a byte order mark; JSON is UTF-8 without one")
        doc = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
        _strict_strings(doc)
        return doc
    except UnicodeDecodeError as e:
        raise ArtifactError(f"{path} is not valid JSON (not UTF-8: {str(e)[:80]}); {_redo(d)}") from None
    except (ValueError, RecursionError) as e:
        raise ArtifactError(f"{path} is not valid JSON ({type(e).__name__}: {str(e)[:80]}); {_redo(d)}") from None


def _cap(rel: str) -> int:
    return MAX_GRAPH if rel == GRAPH else MAX_KERNEL if rel.startswith(KERNELS + "/") else MAX_PARAMS


def verify_manifest(d: Path, key: bytes | None = None) -> dict:
    """Check 1: ``{path: bytes}`` of the manifest's files, each present, regular and of its size and SHA-256.
    Each file is read once: the bytes hashed are the bytes the reader goes on with. ``key``: the manifest's
    signature is checked against the very bytes of manifest.json that are then read (``signing.check``)."""
    with _Folder(d) as folder:
        raw = folder.read(MANIFEST, MAX_MANIFEST)
        if key is not None:
            from .signing import MAX_SIGNATURE_BYTES, SIGNATURE, check
            check(d, raw, folder.read(SIGNATURE, MAX_SIGNATURE_BYTES, missing_ok=True), key)
        m = _json(raw, d / MANIFEST, d)
        if not isinstance(m, dict) or m.get("format") != FORMAT or m.get("version") != VERSION \
                or not isinstance(m.get("files"), list):
            v = m.get("version") if isinstance(m, dict) else None
            raise ArtifactError(f"{d / MANIFEST}: not a {FORMAT!r} version {VERSION} manifest (version {v!r}); "
                                f"{_redo(d)}")
        files = {}
        for i, f in enumerate(m["files"]):
            ok = isinstance(f, dict) and isinstance(f.get("path"), str) and MANIFEST_PATH.match(f["path"]) \
                and isinstance(f.get("size"), int) and not isinstance(f.get("size"), bool) and f["size"] >= 0 \
                and isinstance(f.get("sha256"), str)
            if not ok or f["path"] in files:
                raise ArtifactError(f"{d / MANIFEST}: files[{i}] is not a path, size and sha256, or repeats; "
                                    f"{_redo(d)}")
            data = folder.read(f["path"], _cap(f["path"]), f["size"])
            if len(data) != f["size"] or hashlib.sha256(data).hexdigest() != f["sha256"]:
                raise ArtifactError(f"{d / f['path']} does not match its SHA-256 in the manifest: the file was edited "
                                    f"or replaced; {_redo(d)}")
            files[f["path"]] = data
    for need in (GRAPH, PARAMS):
        if need not in files:
            raise ArtifactError(f"{d / MANIFEST} does not list {need}; {_redo(d)}")
    return files


def read_artifact(path, key: bytes | None = None) -> tuple:
    """``(spec, sources, params)`` of the artifact at ``path``, after checks 1 to 11 of docs/artifact.md
    against the profile graph.json records. Any failure is an ArtifactError naming the file. ``key``: the
    artifact must be signed with it (``signing``), checked on the bytes of manifest.json that are then read."""
    d = Path(path)
    if not d.is_dir() or not ((d / MANIFEST).exists() or (d / GRAPH).exists()):
        raise ArtifactError(f"{d} is not a compiled model: no manifest.json (make one with "
                            f"`tuner compile MODEL -o {d}`)")
    if not (d / MANIFEST).exists():
        raise ArtifactError(f"{d} has no manifest.json: it was compiled by an older tuner (artifact version 1) "
                            f"or damaged; {_redo(d)}")
    files = verify_manifest(d, key)
    spec = ModuleSpec.from_json(_json(files[GRAPH], d / GRAPH, d), str(d / GRAPH))
    sources = {}
    for i, n in enumerate(spec.nodes):
        rel = f"{KERNELS}/{n.source}"
        if not KERNEL_FILE.match(n.source):
            raise ArtifactError(f"{d / GRAPH}: nodes[{i}].source {n.source[:80]!r} is not a kernel file name "
                                f"(kNNN.cl under kernels/); {_redo(d)}")
        if rel not in files:
            raise ArtifactError(f"{d / GRAPH}: nodes[{i}] names {rel}, which manifest.json does not list; {_redo(d)}")
        try:
            text = files[rel].decode()
        except UnicodeDecodeError:
            text = "\0"
        if "\0" in text:
            raise ArtifactError(f"{d / rel} is not text (UTF-8 without NUL); {_redo(d)}")
        sources[n.source] = text
    try:
        check_spec(spec, sources, len(files[PARAMS]))
    except ArtifactError as e:
        raise ArtifactError(f"{d}/{e}") from None
    raw = np.frombuffer(files[PARAMS], dtype=np.uint8)
    params = {b.key: raw[b.offset:b.offset + b.nbytes].view(np.dtype(b.dtype)).reshape(b.physical_shape)
              for b in spec.params}
    return spec, sources, params
