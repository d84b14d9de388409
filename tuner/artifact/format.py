"""The artifact's data types (docs/artifact.md, format version 4) and their strict JSON form.

``ModuleSpec.from_json`` checks every field's presence and type (check 2 of the doc) and names the field that
is wrong, ``graph.json: nodes[3].calls[0].global_size``: a runtime never meets a value of an unexpected type
further on."""
from __future__ import annotations

import math

from dataclasses import asdict, dataclass, field

from tuner.errors import TunerError

FORMAT = "tuner-artifact"
VERSION = 4
PARAM_ALIGN = 64  # bytes: every param starts at a multiple of it in params.bin
# a tuned layer's config_source (tuner.compile.compiler.CONFIG_SOURCES): one of these, or one of these and a name
CONFIG_SOURCE_EXACT = ("tuned", "fallback")
CONFIG_SOURCE_PREFIXES = ("sibling ", "dtype: ", "transferred from ", "predicted: config of ")
MAX_DIMS = 8  # values in any list of integers (a shape, a launch size, an extent): native/include TNR_MAX_DIMS
CONFIG_SOURCE_MAX = 512  # bytes of UTF-8 (native/src/artifact.h TNR_CONFIG_SOURCE_MAX)


class ArtifactError(TunerError):
    """A damaged or inconsistent artifact: the message names the file (and field) and how to get a good one."""


def config_source_ok(s: str) -> bool:
    """Whether ``s`` is a config_source the compiler writes: ``tuned``, ``fallback``, or ``sibling``,
    ``transferred from`` or ``predicted: config of`` and a name; at most CONFIG_SOURCE_MAX bytes, and no control
    character (it is printed on terminals: an artifact is untrusted input). tuner-run checks the same."""
    if len(s.encode("utf-8", "surrogatepass")) > CONFIG_SOURCE_MAX or any(
            ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in s):
        return False
    return s in CONFIG_SOURCE_EXACT or any(s.startswith(p) and len(s) > len(p) for p in CONFIG_SOURCE_PREFIXES)


@dataclass
class Param:
    """One kernel parameter as the source declares it: ``kind`` buffer or image, ``type`` the buffer element
    (float, half; None for images), ``access`` read or write, and ``extent``, the size its code addresses."""
    name: str
    kind: str
    type: str | None
    access: str
    extent: tuple = ()  # what the kernel addresses: (elements,) of a buffer, (height, width, 4) of an image


@dataclass
class Call:
    kernel: str
    global_size: tuple
    local_size: tuple
    args: list
    signature: list = field(default_factory=list)  # Params, one per arg

    def reads_per_work_item(self) -> float:
        """The elements the call's read arguments hold (their ``extent``s: an image's texels times 4) over the
        work-items it launches: how much each work-item reads on average -- a serial loop shows as a large one."""
        read = sum(math.prod(p.extent) for p in self.signature if p.access == "read" and p.extent)
        return read / max(math.prod(self.global_size), 1)


@dataclass
class Node:
    name: str
    op: str
    source: str  # file name under kernels/
    calls: list
    flops: int = 0
    template: str | None = None
    workload: dict | None = None
    scopes: dict | None = None
    config: dict | None = None
    tuned: bool = False  # the config is the log's best for this exact task on this device
    # tuned layers: "tuned", "sibling <fingerprint>", "transferred from <workload>", "predicted: config of
    # <workload>" or "fallback" (config_source_ok)
    config_source: str | None = None


@dataclass
class Entry:
    """An activation tensor: logical shape, its physical shape in its scope, and the pool it lives in."""
    name: str
    shape: tuple
    physical_shape: tuple
    storage_scope: str  # global | texture
    dtype: str
    layout: str | None
    storage_id: int


@dataclass
class Pool:
    storage_id: int
    scope: str
    dtype: str
    shape: tuple  # (nbytes,) for buffers, (height, width, 4) for textures


@dataclass
class Blob:
    """A packed parameter or a workspace: where it lives and its physical shape; a parameter's bytes sit at
    ``offset`` in params.bin (set when the artifact is written)."""
    key: str
    scope: str
    physical_shape: tuple
    dtype: str
    offset: int | None = None
    nbytes: int | None = None


@dataclass
class ModuleSpec:
    device: dict
    dtype: str
    inputs: list  # tensor names (plain row-major buffers)
    outputs: list
    nodes: list
    entries: dict
    pools: list
    params: list  # Blobs
    workspaces: list  # Blobs
    memory: dict = field(default_factory=dict)  # planned vs one-allocation-per-tensor bytes per scope
    # a float16 artifact's float32 tensors, params and workspaces as argument references (t:, p:, w:): a mixed
    # plan's (check 12); empty otherwise
    float32: list = field(default_factory=list)
    precision: dict = field(default_factory=dict)  # informative: the nodes the precision guard kept, and why

    def to_json(self) -> dict:
        d = {"format": FORMAT, "version": VERSION, **asdict(self)}
        d["workspaces"] = [{k: v for k, v in w.items() if k not in ("offset", "nbytes")} for w in d["workspaces"]]
        return d

    @staticmethod
    def from_json(d, where: str = "graph.json") -> "ModuleSpec":
        r = _Reader(where)
        r.obj(d, "")
        if d.get("format") != FORMAT or d.get("version") != VERSION:
            raise ArtifactError(f"{where}: artifact format {d.get('format')!r} version {d.get('version')!r}; this "
                                f"tuner reads {FORMAT!r} version {VERSION}: recompile the model")
        return ModuleSpec(
            device=r.obj(r.get(d, "device"), "device"),
            dtype=r.str_(r.get(d, "dtype"), "dtype"),
            inputs=r.strs(r.get(d, "inputs"), "inputs"),
            outputs=r.strs(r.get(d, "outputs"), "outputs"),
            nodes=[r.node(n, f"nodes[{i}]") for i, n in enumerate(r.list_(r.get(d, "nodes"), "nodes"))],
            entries={r.str_(k, "entries"): r.entry(e, f"entries[{k!r}]")
                     for k, e in r.obj(r.get(d, "entries"), "entries").items()},
            pools=[r.pool(p, f"pools[{i}]") for i, p in enumerate(r.list_(r.get(d, "pools"), "pools"))],
            params=[r.blob(b, f"params[{i}]", True) for i, b in enumerate(r.list_(r.get(d, "params"), "params"))],
            workspaces=[r.blob(b, f"workspaces[{i}]", False)
                        for i, b in enumerate(r.list_(r.get(d, "workspaces"), "workspaces"))],
            memory=r.obj(d.get("memory", {}), "memory"),
            float32=r.strs(r.get(d, "float32"), "float32"),
            precision=r.obj(d.get("precision", {}), "precision"))


class _Reader:
    """Typed field access for ``from_json``: each getter raises ArtifactError naming the field's path."""

    def __init__(self, where: str):
        self.where = where

    def fail(self, path: str, want: str, v) -> None:
        shown = repr(v) if len(repr(v)) < 60 else repr(v)[:57] + "..."
        raise ArtifactError(f"{self.where}: {path or 'the document'} must be {want}, got {shown}; recompile the "
                            f"model")

    def get(self, d: dict, key: str, path: str = ""):
        if key not in d:
            raise ArtifactError(f"{self.where}: {path + '.' if path else ''}{key} is missing; recompile the model")
        return d[key]

    def obj(self, v, path):
        return v if isinstance(v, dict) else self.fail(path, "an object", v)

    def list_(self, v, path):
        return v if isinstance(v, list) else self.fail(path, "a list", v)

    def str_(self, v, path):
        return v if isinstance(v, str) else self.fail(path, "a string", v)

    def opt_str(self, v, path):
        return None if v is None else self.str_(v, path)

    def int_(self, v, path):
        return v if isinstance(v, int) and not isinstance(v, bool) else self.fail(path, "an integer", v)

    def strs(self, v, path):
        return [self.str_(x, f"{path}[{i}]") for i, x in enumerate(self.list_(v, path))]

    def ints(self, v, path):
        out = tuple(self.int_(x, f"{path}[{i}]") for i, x in enumerate(self.list_(v, path)))
        if len(out) > MAX_DIMS:  # a shape, size or extent: of rank 1 to 8 (tuner-run's TNR_MAX_DIMS)
            raise ArtifactError(f"{self.where}: {path} has {len(out)} values, more than {MAX_DIMS}; recompile the "
                                f"model")
        return out

    def node(self, n, p) -> Node:
        self.obj(n, p)
        calls = [self.call(c, f"{p}.calls[{i}]") for i, c in enumerate(self.list_(self.get(n, "calls", p), p + ".calls"))]
        flops = self.int_(n.get("flops", 0), p + ".flops")
        tuned = n.get("tuned", False)
        if not isinstance(tuned, bool):
            self.fail(p + ".tuned", "true or false", tuned)
        opt_obj = lambda k: None if n.get(k) is None else self.obj(n[k], f"{p}.{k}")  # noqa: E731
        source = self.opt_str(n.get("config_source"), p + ".config_source")
        if source is not None and not config_source_ok(source):
            self.fail(p + ".config_source", "tuned, fallback, 'sibling <fingerprint>', 'dtype: tuned in <dtype>', "
                      "'transferred from <workload>' or 'predicted: config of <workload>' (printable, at most "
                      f"{CONFIG_SOURCE_MAX} bytes)", source)
        return Node(self.str_(self.get(n, "name", p), p + ".name"), self.str_(self.get(n, "op", p), p + ".op"),
                    self.str_(self.get(n, "source", p), p + ".source"), calls, flops,
                    self.opt_str(n.get("template"), p + ".template"), opt_obj("workload"), opt_obj("scopes"),
                    opt_obj("config"), tuned, source)

    def call(self, c, p) -> Call:
        self.obj(c, p)
        sig = [self.param(s, f"{p}.signature[{i}]")
               for i, s in enumerate(self.list_(self.get(c, "signature", p), p + ".signature"))]
        return Call(self.str_(self.get(c, "kernel", p), p + ".kernel"),
                    self.ints(self.get(c, "global_size", p), p + ".global_size"),
                    self.ints(self.get(c, "local_size", p), p + ".local_size"),
                    self.strs(self.get(c, "args", p), p + ".args"), sig)

    def param(self, s, p) -> Param:
        self.obj(s, p)
        kind = self.str_(self.get(s, "kind", p), p + ".kind")
        access = self.str_(self.get(s, "access", p), p + ".access")
        if kind not in ("buffer", "image"):
            self.fail(p + ".kind", "'buffer' or 'image'", kind)
        if access not in ("read", "write"):
            self.fail(p + ".access", "'read' or 'write'", access)
        extent = self.ints(self.get(s, "extent", p), p + ".extent")
        if len(extent) != (1 if kind == "buffer" else 3) or min(extent) < 1:
            self.fail(p + ".extent", "[elements] for a buffer, [height, width, 4] for an image", list(extent))
        return Param(self.str_(self.get(s, "name", p), p + ".name"), kind, self.opt_str(s.get("type"), p + ".type"),
                     access, extent)

    def entry(self, e, p) -> Entry:
        self.obj(e, p)
        return Entry(self.str_(self.get(e, "name", p), p + ".name"), self.ints(self.get(e, "shape", p), p + ".shape"),
                     self.ints(self.get(e, "physical_shape", p), p + ".physical_shape"),
                     self.str_(self.get(e, "storage_scope", p), p + ".storage_scope"),
                     self.str_(self.get(e, "dtype", p), p + ".dtype"), self.opt_str(e.get("layout"), p + ".layout"),
                     self.int_(self.get(e, "storage_id", p), p + ".storage_id"))

    def pool(self, q, p) -> Pool:
        self.obj(q, p)
        return Pool(self.int_(self.get(q, "storage_id", p), p + ".storage_id"),
                    self.str_(self.get(q, "scope", p), p + ".scope"), self.str_(self.get(q, "dtype", p), p + ".dtype"),
                    self.ints(self.get(q, "shape", p), p + ".shape"))

    def blob(self, b, p, stored: bool) -> Blob:
        self.obj(b, p)
        blob = Blob(self.str_(self.get(b, "key", p), p + ".key"), self.str_(self.get(b, "scope", p), p + ".scope"),
                    self.ints(self.get(b, "physical_shape", p), p + ".physical_shape"),
                    self.str_(self.get(b, "dtype", p), p + ".dtype"))
        if stored:
            blob.offset = self.int_(self.get(b, "offset", p), p + ".offset")
            blob.nbytes = self.int_(self.get(b, "nbytes", p), p + ".nbytes")
        return blob
