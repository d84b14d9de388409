"""Checks 3 to 12 of docs/artifact.md: the plan validated against itself and against a device profile, before
anything is allocated or enqueued. The native runtime (native/src/artifact.c) makes the same checks in the same
order; tests/artifact_corpus.py holds the damaged artifacts both must refuse.

Each check raises ArtifactError naming the file and the field."""
from __future__ import annotations

import math
import re

from .bounds import BIG as BOUNDS_BIG
from .bounds import check_call as check_call_bounds
from .format import PARAM_ALIGN, ArtifactError, ModuleSpec

DTYPES = {"float32": 4, "float16": 2}
COUNTERS = {"int32": 4}  # a workspace's other dtype: counters in a buffer, zero when loaded (docs/artifact.md)
SIZES = {**DTYPES, **COUNTERS}
MAX_DIM = 2**31 - 1
LAUNCH_SLACK = 16  # a generated kernel gives each work-item at least 1/16 of an output element
KERNEL_FILE = re.compile(r"^k[0-9]{3,6}\.cl$")


def _fail(msg: str) -> None:
    raise ArtifactError(f"graph.json: {msg}; recompile the model")


def is_texture(scope: str) -> bool:
    return scope.startswith("texture")


def _check_scope(scope: str, where: str) -> None:
    if scope != "global" and not is_texture(scope):
        _fail(f"{where} has scope {scope!r}, neither 'global' nor 'texture*'")


def _check_shape(shape, where: str) -> None:
    if not shape or any(not 1 <= v <= MAX_DIM for v in shape):
        _fail(f"{where} {list(shape)} must hold integers from 1 to 2**31-1")


def limit(profile: dict, key: str, default: int = MAX_DIM) -> int:
    """A positive integer limit of the profile; ``default`` where it is absent or not one (profiles are checked
    where they enter, tuner.target; this keeps the checks total on any dict)."""
    v = profile.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else default


def _check_physical(scope: str, shape, dtype: str, where: str, profile: dict) -> None:
    """Check 4: a texture is [h, w, 4] within the image limits; a buffer within max_mem_alloc_bytes."""
    _check_shape(shape, where)
    if is_texture(scope):
        if len(shape) != 3 or shape[2] != 4:
            _fail(f"{where} {list(shape)} of a texture must be [height, width, 4]")
        h, w = shape[0], shape[1]
        mw, mh = limit(profile, "image2d_max_width"), limit(profile, "image2d_max_height")
        if w > mw or h > mh:
            _fail(f"{where}: a texture of {w} x {h} pixels exceeds the device's image2d limit {mw} x {mh}")
    elif math.prod(shape) * SIZES.get(dtype, 1) > limit(profile, "max_mem_alloc_bytes", 2**63):
        _fail(f"{where}: a buffer of {math.prod(shape) * SIZES.get(dtype, 1)} bytes exceeds the device's "
              f"max_mem_alloc_bytes {limit(profile, 'max_mem_alloc_bytes', 2**63)}")


def check_types_and_shapes(spec: ModuleSpec, profile: dict) -> None:
    """Checks 3 (types) and 4 (shapes)."""
    if spec.dtype not in DTYPES:
        _fail(f"dtype {spec.dtype!r} is neither float32 nor float16")
    for name, e in spec.entries.items():
        if e.name != name:
            _fail(f"entries[{name!r}] is named {e.name!r}")
        if e.dtype not in DTYPES:
            _fail(f"entries[{name!r}].dtype {e.dtype!r} is neither float32 nor float16")
        _check_scope(e.storage_scope, f"entries[{name!r}]")
        _check_shape(e.shape, f"entries[{name!r}].shape")
        _check_physical(e.storage_scope, e.physical_shape, e.dtype, f"entries[{name!r}].physical_shape", profile)
    for i, p in enumerate(spec.pools):
        _check_scope(p.scope, f"pools[{i}]")
        want = ("float32", "float16") if is_texture(p.scope) else ("uint8",)
        if p.dtype not in want:
            _fail(f"pools[{i}].dtype {p.dtype!r} of a {p.scope} pool must be {' or '.join(want)}")
        _check_physical(p.scope, p.shape, "uint8", f"pools[{i}].shape", profile)
    for kind, blobs in (("params", spec.params), ("workspaces", spec.workspaces)):
        for i, b in enumerate(blobs):
            if b.dtype in COUNTERS and kind == "workspaces" and not is_texture(b.scope):
                pass
            elif b.dtype not in DTYPES:
                _fail(f"{kind}[{i}] ({b.key!r}).dtype {b.dtype!r} is neither float32 nor float16" +
                      (" (int32: a workspace in a buffer only)" if b.dtype in COUNTERS else ""))
            _check_scope(b.scope, f"{kind}[{i}] ({b.key!r})")
            _check_physical(b.scope, b.physical_shape, b.dtype, f"{kind}[{i}] ({b.key!r}).physical_shape", profile)


def check_pools(spec: ModuleSpec) -> None:
    """Check 5: each entry fits the pool it names, of its kind and (textures) dtype."""
    pools = {}
    for p in spec.pools:
        if p.storage_id in pools:
            _fail(f"pools: storage_id {p.storage_id} repeats")
        pools[p.storage_id] = p
    for name, e in spec.entries.items():
        p = pools.get(e.storage_id)
        if p is None:
            _fail(f"entries[{name!r}].storage_id {e.storage_id} names no pool")
        if is_texture(p.scope) != is_texture(e.storage_scope):
            _fail(f"entries[{name!r}] is a {e.storage_scope} tensor in pool {p.storage_id}, a {p.scope} pool")
        if is_texture(p.scope):
            if e.physical_shape[0] > p.shape[0] or e.physical_shape[1] > p.shape[1] or e.dtype != p.dtype:
                _fail(f"entries[{name!r}] ({list(e.physical_shape)} {e.dtype}) does not fit its pool {p.storage_id} "
                      f"({list(p.shape)} {p.dtype})")
        elif math.prod(e.physical_shape) * DTYPES[e.dtype] > p.shape[0]:
            _fail(f"entries[{name!r}] needs {math.prod(e.physical_shape) * DTYPES[e.dtype]} bytes, its pool "
                  f"{p.storage_id} holds {p.shape[0]}")


def check_params(spec: ModuleSpec, params_size: int) -> None:
    """Check 6: params laid out in params.bin: aligned, sized by their shape and dtype, inside, disjoint."""
    seen, spans = set(), []
    for i, b in enumerate(spec.params):
        if b.key in seen:
            _fail(f"params[{i}]: key {b.key!r} repeats")
        seen.add(b.key)
        want = math.prod(b.physical_shape) * DTYPES[b.dtype]
        if b.offset is None or b.offset < 0 or b.offset % PARAM_ALIGN:
            _fail(f"params[{i}] ({b.key!r}).offset {b.offset} is not a multiple of {PARAM_ALIGN}")
        if b.nbytes != want:
            _fail(f"params[{i}] ({b.key!r}).nbytes {b.nbytes} is not {want} ({list(b.physical_shape)} {b.dtype})")
        if b.offset + b.nbytes > params_size:
            _fail(f"params[{i}] ({b.key!r}) ends at byte {b.offset + b.nbytes}, past the end of params.bin "
                  f"({params_size} bytes)")
        spans.append((b.offset, b.offset + b.nbytes, b.key))
    spans.sort()
    for (_, end, a), (start, _, b) in zip(spans, spans[1:]):
        if start < end:
            _fail(f"params {a!r} and {b!r} overlap in params.bin")
    if len({w.key for w in spec.workspaces}) != len(spec.workspaces):
        _fail("workspaces: a key repeats")


def check_io(spec: ModuleSpec) -> None:
    """Check 7: inputs and outputs name row-major global entries, none repeated, neither list empty."""
    for kind, names in (("inputs", spec.inputs), ("outputs", spec.outputs)):
        if not names:
            _fail(f"{kind} is empty: the model has nothing to {'read' if kind == 'inputs' else 'return'}")
        if len(set(names)) != len(names):
            _fail(f"{kind} {names} repeats a name")
        for n in names:
            e = spec.entries.get(n)
            if e is None:
                _fail(f"{kind} names {n!r}, which is no entry")
            if e.storage_scope != "global" or math.prod(e.physical_shape) != math.prod(e.shape):
                _fail(f"{kind}: {n!r} must be a row-major global buffer, is {e.storage_scope} "
                      f"{list(e.physical_shape)} for shape {list(e.shape)}")


def _arg(spec: ModuleSpec, blobs: dict, ref: str):
    """(scope, dtype, element count) of a call argument ``t:`` / ``p:`` / ``w:``, or None."""
    kind, _, key = ref.partition(":")
    if kind == "t" and key in spec.entries:
        e = spec.entries[key]
        return e.storage_scope, e.dtype, math.prod(e.physical_shape), tuple(e.physical_shape)
    b = blobs.get(ref)
    return (b.scope, b.dtype, math.prod(b.physical_shape), tuple(b.physical_shape)) if b is not None else None


def _holds(phys: tuple, count: int, prm) -> bool:
    """Whether an argument of physical shape ``phys`` (``count`` elements) holds what the parameter's code
    addresses: its extent's elements for a buffer, its height and width for an image."""
    if prm.kind == "buffer":
        return count >= prm.extent[0]
    return len(phys) == 3 and phys[0] >= prm.extent[0] and phys[1] >= prm.extent[1]


def defined_kernels(source: str) -> set:
    """Names of the ``__kernel`` functions a source defines (comments left out)."""
    source = re.sub(r"/\*.*?\*/|//[^\n]*", " ", source, flags=re.S)
    return set(re.findall(r"__kernel\b[^;{]*?\bvoid\s+([A-Za-z_][A-Za-z0-9_]*)\s*\(", source))


def check_calls(spec: ModuleSpec, sources: dict, profile: dict) -> None:
    """Checks 8 (calls name what exists, with matching kinds, types and sizes: no argument smaller than its
    parameter's code addresses) and 9 (launch sizes)."""
    blobs = {f"p:{b.key}": b for b in spec.params}
    blobs.update({f"w:{b.key}": b for b in spec.workspaces})
    max_wg = limit(profile, "max_work_group_size")
    items = profile.get("max_work_item_sizes")
    items = [v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else MAX_DIM
             for v in (items if isinstance(items, list) else [])]
    max_items = items[:3] + [MAX_DIM] * (3 - len(items[:3]))
    if not spec.nodes:
        _fail("nodes is empty")
    for i, n in enumerate(spec.nodes):
        where = f"nodes[{i}] ({n.name!r})"
        if not KERNEL_FILE.match(n.source) or n.source not in sources:
            _fail(f"{where}.source {n.source!r} is not a kernel file of the manifest")
        if not n.calls:
            _fail(f"{where} has no call")
        defined = defined_kernels(sources[n.source])
        for j, c in enumerate(n.calls):
            cw = f"{where}.calls[{j}]"
            if c.kernel not in defined:
                _fail(f"{cw}: kernel {c.kernel!r} is not defined in kernels/{n.source}")
            if len(c.args) != len(c.signature):
                _fail(f"{cw}: {len(c.args)} args for {len(c.signature)} kernel parameters")
            largest = 1
            for ref, prm in zip(c.args, c.signature):
                a = _arg(spec, blobs, ref)
                if a is None:
                    _fail(f"{cw}: argument {ref!r} names no entry, param or workspace")
                scope, dtype, count, phys = a
                if (prm.kind == "image") != is_texture(scope):
                    _fail(f"{cw}: parameter {prm.name!r} is an {prm.kind}, argument {ref!r} a {scope} tensor")
                if prm.kind == "buffer" and prm.type != {"float32": "float", "float16": "half", "int32": "int"}[dtype]:
                    _fail(f"{cw}: parameter {prm.name!r} holds {prm.type}, argument {ref!r} is {dtype}")
                if ref.startswith("p:") and prm.access == "write":
                    _fail(f"{cw}: parameter {prm.name!r} writes the constant {ref!r}")
                largest = max(largest, count)
            written = [ref for ref, prm in zip(c.args, c.signature) if prm.access == "write"]
            for ref in written:
                if c.args.count(ref) > 1:
                    _fail(f"{cw}: argument {ref!r} is written and also passed as another parameter (a kernel "
                          f"never reads and writes one tensor)")
            for ref, prm in zip(c.args, c.signature):  # the size each parameter's code addresses, as generated
                _, _, count, phys = _arg(spec, blobs, ref)
                if not _holds(phys, count, prm):
                    _fail(f"{cw}: argument {ref!r} ({list(phys)}) is smaller than parameter {prm.name!r} addresses "
                          f"({list(prm.extent)}): the artifact was edited")
            _check_launch(c, cw, largest, max_wg, max_items)


def _check_launch(c, where: str, largest: int, max_wg: int, max_items: list) -> None:
    g, l_ = c.global_size, c.local_size
    if len(g) != 3 or len(l_) != 3 or min(g) < 1 or min(l_) < 1:
        _fail(f"{where}: global_size {list(g)} and local_size {list(l_)} must be three integers of at least 1")
    if any(a % b for a, b in zip(g, l_)):
        _fail(f"{where}: local_size {list(l_)} does not divide global_size {list(g)}")
    if math.prod(l_) > max_wg or any(v > m for v, m in zip(l_, max_items)):
        _fail(f"{where}: local_size {list(l_)} exceeds the device's work-group limits ({max_wg}, "
              f"{max_items[:3]})")
    bound = -(-LAUNCH_SLACK * largest // math.prod(l_)) * math.prod(l_)
    if math.prod(g) > bound:
        _fail(f"{where}: global_size {list(g)} launches {math.prod(g)} work-items for operands of at most "
              f"{largest} elements")


def check_order(spec: ModuleSpec) -> None:
    """Check 10: in run order, nothing is read before it is written; every output is written, and still holds
    its value at the end: no later call writes another entry of its pool."""
    written = set(f"t:{x}" for x in spec.inputs) | {f"p:{b.key}" for b in spec.params}
    last = {spec.entries[x].storage_id: (x, "the upload") for x in spec.inputs}  # pool -> (last entry written, where)
    for i, n in enumerate(spec.nodes):
        for j, c in enumerate(n.calls):
            for ref, prm in zip(c.args, c.signature):
                if prm.access == "read" and ref not in written:
                    _fail(f"nodes[{i}] ({n.name!r}).calls[{j}] reads {ref!r} before any call writes it")
            for ref, prm in zip(c.args, c.signature):
                if prm.access == "write":
                    written.add(ref)
                    if ref.startswith("t:") and ref[2:] in spec.entries:
                        last[spec.entries[ref[2:]].storage_id] = (ref[2:], f"nodes[{i}] ({n.name!r}).calls[{j}]")
    missing = [y for y in spec.outputs if f"t:{y}" not in written]
    if missing:
        _fail(f"outputs {missing} are never written")
    for y in spec.outputs:
        z, where = last.get(spec.entries[y].storage_id, (y, ""))
        if z != y:
            _fail(f"output {y!r} is overwritten: {where} writes {z!r} into its pool (storage_id "
                  f"{spec.entries[y].storage_id}) after the output's last write")


def check_sizes(spec: ModuleSpec, sources: dict) -> None:
    """Check 11: the sizes the code assumes. Each pool is exactly as large as the largest of its entries (the
    planner's rule: its size follows from their shapes and dtypes, not from a number written beside them);
    each call's kernel, read from its source (``bounds``), addresses with its launch only elements and pixels
    inside the arguments it binds, and its signature and local size are what the source declares; and the calls
    that write a tensor reach all of it, first byte to last (a launch is neither larger nor smaller than the
    kernel was generated for)."""
    for i, p in enumerate(spec.pools):
        users = [e for e in spec.entries.values() if e.storage_id == p.storage_id]
        if not users:
            _fail(f"pools[{i}] (storage_id {p.storage_id}) holds no entry")
        if is_texture(p.scope):
            want = [max(e.physical_shape[0] for e in users), max(e.physical_shape[1] for e in users), 4]
            if list(p.shape) != want:
                _fail(f"pools[{i}].shape {list(p.shape)} is not {want}, the largest height and width of its entries")
        else:
            want = max(math.prod(e.physical_shape) * DTYPES[e.dtype] for e in users)
            if list(p.shape) != [want]:
                _fail(f"pools[{i}].shape {list(p.shape)} is not [{want}], the bytes of its largest entry")
    blobs = {f"p:{b.key}": b for b in spec.params}
    blobs.update({f"w:{b.key}": b for b in spec.workspaces})
    hulls: dict = {}  # entry -> [lo, hi, the last call that writes it]: what the calls that write it reach
    counts: dict = {}  # entry -> at most how many elements (pixels) the calls that write it write (None: unknown)
    for i, n in enumerate(spec.nodes):
        for j, c in enumerate(n.calls):
            cw = f"nodes[{i}] ({n.name!r}).calls[{j}]"
            args = [(a[2], SIZES[a[1]], a[3]) for a in (_arg(spec, blobs, ref) for ref in c.args)]
            written, most = check_call_bounds(sources[n.source], n.source, c, cw, args)
            for ref, w, m in zip(c.args, written, most):
                if w is None or not ref.startswith("t:"):
                    continue
                h = hulls.get(ref[2:])
                if h is None:
                    hulls[ref[2:]] = [w[0], w[1], cw]
                elif isinstance(w[0], tuple):  # pixels: ((x lo, y lo), (x hi, y hi))
                    h[:] = [(min(h[0][0], w[0][0]), min(h[0][1], w[0][1])),
                            (max(h[1][0], w[1][0]), max(h[1][1], w[1][1])), cw]
                else:
                    h[:] = [min(h[0], w[0]), max(h[1], w[1]), cw]
                was = counts.get(ref[2:], 0)
                counts[ref[2:]] = None if was is None or m is None or was + m > BOUNDS_BIG else was + m
    # a launch reaches every byte (pixel) of a tensor it writes, from its first to its last: no fewer work-items
    # than the kernel was generated for (a smaller launch leaves the rest of the tensor as it was)
    for name, (lo, hi, cw) in hulls.items():
        e = spec.entries[name]
        if isinstance(lo, tuple):
            want = ((0, 0), (e.physical_shape[1], e.physical_shape[0]))
            if (lo, hi) != want:
                _fail(f"entries[{name!r}]: the calls that write it reach pixels x {lo[0]}..{hi[0] - 1}, y {lo[1]}.."
                      f"{hi[1] - 1} of its {want[1][0]} x {want[1][1]} (the last: {cw}): a launch does not cover the "
                      f"tensor it writes; the artifact was edited")
        elif (lo, hi) != (0, math.prod(e.physical_shape) * DTYPES[e.dtype]):
            _fail(f"entries[{name!r}]: the calls that write it reach bytes {lo}..{hi - 1} of its "
                  f"{math.prod(e.physical_shape) * DTYPES[e.dtype]} (the last: {cw}): a launch does not cover the "
                  f"tensor it writes; the artifact was edited")
    # and they can write as many elements (pixels) as it has: the hull reaches the last byte through an index that
    # wraps (%) or is clamped even when work-groups are missing, but the work-items that can reach the stores,
    # times what each stores, is an upper bound on what is written (bounds.Source.analyse_writes)
    for name, e in spec.entries.items():  # (in the entries' order, as tuner-run checks them)
        if name not in hulls or counts[name] is None:
            continue
        texture = isinstance(hulls[name][0], tuple)  # (pixels of an image)
        need = e.physical_shape[0] * e.physical_shape[1] if texture else math.prod(e.physical_shape)
        if counts[name] < need:
            _fail(f"entries[{name!r}]: the calls that write it can write at most {counts[name]} of its {need} "
                  f"{'pixels' if texture else 'elements'} (the last: {hulls[name][2]}): a launch smaller than the "
                  f"kernel was generated for; the artifact was edited")


def check_precision(spec: ModuleSpec) -> None:
    """Check 12: ``float32`` lists exactly the float32 entries, params and workspaces of a float16 artifact (a mixed
    plan's), each once; a float32 artifact lists none (every one of its tensors is float32)."""
    if spec.dtype != "float16" and spec.float32:
        _fail(f"float32 lists {len(spec.float32)} reference(s) in a {spec.dtype} artifact, where every tensor is "
              f"{spec.dtype}: it must be empty")
    known = {f"t:{n}": e.dtype for n, e in spec.entries.items()}
    known.update({f"p:{b.key}": b.dtype for b in spec.params})
    known.update({f"w:{b.key}": b.dtype for b in spec.workspaces if b.dtype not in COUNTERS})  # (counters: no
    # precision of their own)
    listed: set = set()
    for i, ref in enumerate(spec.float32):
        if ref not in known:
            _fail(f"float32[{i}] {ref[:80]!r} names no entry (t:), param (p:) or workspace (w:)")
        if ref in listed:
            _fail(f"float32[{i}] {ref[:80]!r} is listed twice")
        listed.add(ref)
    for ref, dtype in known.items():
        if spec.dtype != "float16" and dtype != spec.dtype:
            _fail(f"{ref[:80]!r} is {dtype} in a {spec.dtype} artifact")
        if spec.dtype == "float16" and (dtype == "float32") != (ref in listed):
            _fail(f"{ref[:80]!r} is {dtype} but float32 {'lists' if ref in listed else 'does not list'} it: the "
                  f"artifact's record of its precision is not its storage")


def check_spec(spec: ModuleSpec, sources: dict, params_size: int, profile: dict | None = None) -> None:
    """Checks 3 to 12 against ``profile`` (a ``DeviceInfo.to_dict()``; by default the one graph.json records)."""
    profile = profile if profile is not None else spec.device.get("profile") or {}
    check_types_and_shapes(spec, profile)
    check_pools(spec)
    check_params(spec, params_size)
    check_io(spec)
    check_calls(spec, sources, profile)
    check_order(spec)
    check_sizes(spec, sources)
    check_precision(spec)
