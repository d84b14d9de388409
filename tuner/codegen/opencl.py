"""Lowered kernel IR -> OpenCL C source (texture RFC T1).

Images are ``__read_only``/``__write_only image2d_t`` read with ``read_imagef`` through a nearest, unnormalized,
clamped sampler; buffers are pointers to the scalar storage type with ``vloadN``/``vstoreN`` for vector
elements; half storage uses ``CL_HALF_FLOAT`` images and ``vload_halfN``/``vstore_halfN`` and is computed in float.
Half arithmetic is explicit in the IR (expressions of dtype ``float16``): ``half``/``halfN`` in OpenCL, a cast of a
half load is read as half (``read_imageh``, ``vloadN``/``p[i]`` on a ``half*``), and the program enables
``cl_khr_fp16``.
"""
from __future__ import annotations

from ..errors import LoweringError
from ..ir.arith import const_int_bound, simplify
from ..ir.dtype import DType
from ..ir.expr import (Binary, Broadcast, BufferLoad, Call, Cast, Const, Expr, ExtractLane, Ramp, Select, Var)
from ..ir.kernel import Kernel, Program
from ..ir.stmt import Allocate, Barrier, BufferStore, Evaluate, For, If, Let, Seq

FP16_PRAGMA = "#pragma OPENCL EXTENSION cl_khr_fp16 : enable"
SAMPLER = "__constant sampler_t sampler = CLK_NORMALIZED_COORDS_FALSE | CLK_ADDRESS_CLAMP | CLK_FILTER_NEAREST;"
_HELPERS = {
    "floordiv_i": "inline int floordiv_i(int a, int b) { int q = a / b; return (q * b > a) ? q - 1 : q; }",
    "floormod_i": "inline int floormod_i(int a, int b) { int r = a % b; return r < 0 ? r + b : r; }",
}
_PREC = {"mul": 3, "div": 3, "floordiv": 3, "floormod": 3, "add": 4, "sub": 4, "lt": 6, "le": 6, "gt": 6,
         "ge": 6, "eq": 7, "ne": 7, "and": 11, "or": 12}
_SYM = {"add": "+", "sub": "-", "mul": "*", "div": "/", "floordiv": "/", "floormod": "%", "lt": "<",
        "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!=", "and": "&&", "or": "||"}


def ctype(dtype) -> str:
    """The compute type: ``float16`` expressions are half arithmetic (loads of half storage are float32
    expressions unless cast); bool vectors are int vectors in OpenCL."""
    base = {"float32": "float", "float16": "half", "int32": "int", "bool": "int"}[dtype.base]
    return base if dtype.lanes == 1 else f"{base}{dtype.lanes}"


def storage_type(dtype) -> str:
    return {"float32": "float", "float16": "half", "int32": "int", "bool": "char"}[dtype.base]


def scalarize(e: Expr, k: int) -> Expr:
    """Lane ``k`` of a vector expression, rebuilt from scalars."""
    if e.lanes == 1:
        return e
    if isinstance(e, Ramp):
        return e.base + e.stride * k
    if isinstance(e, Broadcast):
        return e.value
    if isinstance(e, Binary):
        return Binary(e.op, scalarize(e.a, k), scalarize(e.b, k))
    if isinstance(e, Select):
        return Select(scalarize(e.cond, k), scalarize(e.true_value, k), scalarize(e.false_value, k))
    if isinstance(e, Cast):
        return Cast(e.dtype.element, scalarize(e.value, k))
    return ExtractLane(e, k)


class OpenCLCodegen:
    def __init__(self, kernel: Kernel):
        self.kernel = kernel
        self.bounds: dict = {}
        self.helpers: set = set()
        self.lines: list[str] = []
        self.decl = {b.name: b for b in kernel.params}

    # -- expressions ------------------------------------------------------------------------------
    def expr(self, e: Expr, parent: int = 99) -> str:
        text, prec = self._expr(e)
        return f"({text})" if prec > parent else text

    def _expr(self, e: Expr) -> tuple[str, int]:
        if isinstance(e, Var):
            return e.name, 0
        if isinstance(e, Const):
            if e.dtype.is_float:
                if float(e.value) in (float("inf"), float("-inf")):  # OpenCL's INFINITY macro (a float)
                    return ("-INFINITY", 2) if e.value < 0 else ("INFINITY", 0)
                v = repr(float(e.value))
                v = (v if ("e" in v or "." in v) else v + ".0") + "f"
                return (f"(half){v}", 2) if e.dtype.base == "float16" else (v, 0)
            return str(int(e.value)), 0
        if isinstance(e, Binary):
            return self._binary(e)
        if isinstance(e, Select):
            if e.lanes > 1:  # OpenCL's vector ?: wants vector branches
                e = Select(e.cond, *(Broadcast(v, e.lanes) if v.lanes == 1 else v for v in (e.true_value, e.false_value)))
            return f"{self.expr(e.cond, 12)} ? {self.expr(e.true_value, 12)} : {self.expr(e.false_value, 13)}", 13
        if isinstance(e, Cast):
            if e.dtype.base == "float16" and e.value.dtype.base == "float32":
                native = self._half_load(e.value)
                if native is not None:  # a half load read as half: no round trip through float
                    return native, 0
            if e.lanes == 1:
                return f"({ctype(e.dtype)}){self.expr(e.value, 2)}", 2
            return f"convert_{ctype(e.dtype)}({self.expr(e.value)})", 0
        if isinstance(e, Broadcast):
            return f"({ctype(e.dtype)})({self.expr(e.value)})", 0
        if isinstance(e, Ramp):
            parts = [self.expr(self._lane_of(e, k)) for k in range(e.n)]
            return f"({ctype(e.dtype)})({', '.join(parts)})", 0
        if isinstance(e, BufferLoad):
            return self._load(e), 0
        if isinstance(e, ExtractLane):
            return f"{self.expr(e.value, 1)}.{'xyzw'[e.lane] if e.lane < 4 else f's{e.lane:x}'}", 1
        if isinstance(e, Call):
            if e.name == "texture2d_load":
                img, x, y = e.args
                return f"read_imagef({img.name}, sampler, (int2)({self.expr(x)}, {self.expr(y)}))", 0
            if e.name == "atomic_inc":  # atomic_inc(P + i): the int it held, one added (a global int32 buffer)
                (load,) = e.args
                buf, (idx,) = load.buffer, load.indices
                if buf.dtype != DType("int32") or buf.scope != "global" or idx.lanes != 1:
                    raise LoweringError(f"atomic_inc of {buf.name}: a scalar element of a global int32 buffer")
                return f"atomic_inc({buf.name} + ({self.expr(idx)}))", 0
            if e.name == "make_vector":
                return f"({ctype(e.dtype)})({', '.join(self.expr(a) for a in e.args)})", 0
            return f"{e.name}({', '.join(self.expr(a) for a in e.args)})", 0
        raise LoweringError(f"cannot generate OpenCL for {type(e).__name__} {e}")

    def _binary(self, e: Binary) -> tuple[str, int]:
        op = e.op
        if op in ("min", "max"):
            fn = op if not e.dtype.is_float else "f" + op
            return f"{fn}({self.expr(e.a)}, {self.expr(e.b)})", 0
        if op in ("floordiv", "floormod") and not e.dtype.is_float:
            lo_a, _ = const_int_bound(e.a, self.bounds)
            lo_b, _ = const_int_bound(e.b, self.bounds)
            if lo_a < 0 or lo_b <= 0:  # C's / and % truncate; floor semantics differ for negatives
                if e.lanes > 1:
                    raise LoweringError(f"vector floor division of a possibly negative value: {e}")
                name = f"{op}_i"
                self.helpers.add(name)
                return f"{name}({self.expr(e.a)}, {self.expr(e.b)})", 0
        if op in ("floordiv", "floormod") and e.dtype.is_float:
            q = f"floor({self.expr(e.a)} / {self.expr(e.b, 2)})"
            return (q, 0) if op == "floordiv" else (f"{self.expr(e.a, 4)} - {q} * {self.expr(e.b, 2)}", 4)
        prec = _PREC[op]
        return f"{self.expr(e.a, prec)} {_SYM[op]} {self.expr(e.b, prec - 1)}", prec

    def _half_load(self, e: Expr):
        """OpenCL for a load of half storage read as half (cl_khr_fp16), or None when ``e`` is not one."""
        if isinstance(e, Call) and e.name == "texture2d_load" and e.args[0].dtype.base == "float16":
            img, x, y = e.args
            return f"read_imageh({img.name}, sampler, (int2)({self.expr(x)}, {self.expr(y)}))"
        if isinstance(e, BufferLoad) and e.buffer.dtype.base == "float16" and e.buffer.scope == "global":
            return self._load(e, native_half=True)
        return None

    def _load(self, e: BufferLoad, native_half: bool = False) -> str:
        buf = e.buffer
        (idx,) = e.indices
        declared = self.decl.get(buf.name, buf)
        half = buf.dtype.base == "float16" and not native_half  # native: half* read as half (vloadN, p[i])
        if buf.scope in ("private", "local") and declared.dtype.lanes == buf.dtype.lanes and idx.lanes == 1:
            return f"{buf.name}[{self.expr(idx)}]"
        if buf.dtype.lanes > 1 and idx.lanes == 1:  # an RFC 0012 vector view of a scalar buffer
            fn = f"vload_half{buf.dtype.lanes}" if half else f"vload{buf.dtype.lanes}"
            return f"{fn}({self.expr(idx)}, {buf.name})"
        if idx.lanes == 1:
            return f"vload_half({self.expr(idx)}, {buf.name})" if half else f"{buf.name}[{self.expr(idx)}]"
        if isinstance(idx, Ramp) and isinstance(idx.stride, Const) and idx.stride.value == 1:
            fn = f"vload_half{idx.n}" if half else f"vload{idx.n}"
            return f"{fn}(0, {buf.name} + {self.expr(idx.base, 4)})"
        vtype = ctype(e.dtype.with_base("float16") if native_half else e.dtype)
        if isinstance(idx, Broadcast):
            return f"({vtype})({self._load(BufferLoad(buf, (idx.value,)), native_half)})"
        # a gather: one element per lane
        lanes = [self._load(BufferLoad(buf, (self._lane_of(idx, k),)), native_half) for k in range(idx.lanes)]
        return f"({vtype})({', '.join(lanes)})"

    def _lane_of(self, idx: Expr, k: int) -> Expr:
        """Lane ``k`` of a vector index as a scalar expression, so a gather reads ``X[i0], X[i1], ...``."""
        return simplify(scalarize(idx, k), self.bounds)

    # -- statements -------------------------------------------------------------------------------
    def emit(self, text: str, depth: int) -> None:
        self.lines.append("  " * depth + text)

    def stmt(self, s, depth: int) -> None:
        if isinstance(s, Seq):
            for x in s.stmts:
                self.stmt(x, depth)
        elif isinstance(s, For):
            self.bounds[s.var] = (0, s.extent - 1)
            if s.kind == "thread":
                kind, d = s.thread.split(".")
                self.emit(f"const int {s.var.name} = get_{kind}_id({d});", depth)
                self.stmt(s.body, depth)
                return
            if s.kind == "vectorized":
                raise LoweringError(f"loop {s.var.name} is still vectorized: run the lowering pipeline first")
            if s.kind == "unrolled":
                self.emit("#pragma unroll", depth)
            v = s.var.name
            self.emit(f"for (int {v} = 0; {v} < {s.extent}; ++{v}) {{", depth)
            self.stmt(s.body, depth + 1)
            self.emit("}", depth)
        elif isinstance(s, BufferStore):
            self._store(s, depth)
        elif isinstance(s, Evaluate):
            c = s.value
            if isinstance(c, Call) and c.name == "texture2d_store":
                img, x, y, v = c.args
                self.emit(f"write_imagef({img.name}, (int2)({self.expr(x)}, {self.expr(y)}), {self.expr(v)});", depth)
            else:
                self.emit(self.expr(c) + ";", depth)
        elif isinstance(s, Allocate):
            b = s.buffer
            self.decl[b.name] = b
            if len(b.shape) != 1:
                raise LoweringError(f"allocation {b.name} is not flat: run the lowering pipeline first")
            qual = "__local " if b.scope == "local" else ""
            self.emit(f"{qual}{ctype(b.dtype)} {b.name}[{b.shape[0]}];", depth)
            self.stmt(s.body, depth)
        elif isinstance(s, If):
            self.emit(f"if ({self.expr(s.cond)}) {{", depth)
            self.stmt(s.then, depth + 1)
            if s.otherwise is not None:
                self.emit("} else {", depth)
                self.stmt(s.otherwise, depth + 1)
            self.emit("}", depth)
        elif isinstance(s, Let):
            self.bounds[s.var] = const_int_bound(s.value, self.bounds) if not s.value.dtype.is_float else None
            if self.bounds[s.var] is None:
                del self.bounds[s.var]
            self.emit(f"const {ctype(s.value.dtype)} {s.var.name} = {self.expr(s.value)};", depth)
            self.stmt(s.body, depth)
        elif isinstance(s, Barrier):
            self.emit("barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);" if s.fence == "global"
                      else "barrier(CLK_LOCAL_MEM_FENCE);", depth)
        else:
            raise LoweringError(f"cannot generate OpenCL for statement {type(s).__name__}")

    def _store(self, s: BufferStore, depth: int) -> None:
        buf, (idx,), value = s.buffer, s.indices, s.value
        declared = self.decl.get(buf.name, buf)
        half = buf.dtype.base == "float16"
        lanes = buf.dtype.lanes * idx.lanes
        if value.lanes != lanes:
            value = Broadcast(value, lanes) if value.lanes == 1 else value
        v = self.expr(value)
        if buf.scope in ("private", "local") and declared.dtype.lanes == buf.dtype.lanes and idx.lanes == 1:
            self.emit(f"{buf.name}[{self.expr(idx)}] = {v};", depth)
        elif buf.dtype.lanes > 1 and idx.lanes == 1:
            fn = f"vstore_half{buf.dtype.lanes}" if half else f"vstore{buf.dtype.lanes}"
            self.emit(f"{fn}({v}, {self.expr(idx)}, {buf.name});", depth)
        elif idx.lanes == 1:
            self.emit(f"vstore_half({v}, {self.expr(idx)}, {buf.name});" if half
                      else f"{buf.name}[{self.expr(idx)}] = {v};", depth)
        elif isinstance(idx, Ramp) and isinstance(idx.stride, Const) and idx.stride.value == 1:
            fn = f"vstore_half{idx.n}" if half else f"vstore{idx.n}"
            self.emit(f"{fn}({v}, 0, {buf.name} + {self.expr(idx.base, 4)});", depth)
        else:  # a scatter: one element per lane
            self.emit(f"{{ const {ctype(value.dtype)} v_ = {v};", depth)
            for k in range(idx.lanes):
                lane = self.expr(ExtractLane(Var("v_", value.dtype), k))
                i = self.expr(self._lane_of(idx, k))
                self.emit(f"  vstore_half({lane}, {i}, {buf.name});" if half else f"  {buf.name}[{i}] = {lane};", depth)
            self.emit("}", depth)

    # -- the kernel -------------------------------------------------------------------------------
    def params(self) -> list[str]:
        out = []
        for p in kernel_signature(self.kernel):
            if p["kind"] == "image":
                out.append(f"__{p['access']}_only image2d_t {p['name']}")
            else:
                const = "" if p["access"] == "write" else "const "
                out.append(f"__global {const}{p['type']}* restrict {p['name']}")
        return out

    def generate(self) -> str:
        k = self.kernel
        params = self.params()
        self.stmt(k.body, 1)
        _, local = k.launch()
        attr = f"__attribute__((reqd_work_group_size({local[0]}, {local[1]}, {local[2]})))\n"
        sig = f"__kernel {attr}void {k.name}(\n    " + ",\n    ".join(params) + ") {"
        helpers = [_HELPERS[h] for h in sorted(self.helpers)]
        return "\n".join([*helpers, sig, *self.lines, "}"])


def kernel_signature(kernel: Kernel) -> list[dict]:
    """Each parameter of a lowered kernel as its OpenCL declaration states it: ``{"name", "kind": "buffer" |
    "image", "type": "float" | "half" | None, "access": "read" | "write", "extent"}``, where ``extent`` is what the
    generated code addresses: ``[elements]`` of a buffer, ``[height, width, 4]`` of an image (a runtime refuses a
    smaller argument). The one rule for both the source's parameter list and the artifact's call signatures
    (docs/artifact.md), so the two cannot disagree."""
    from ..ir.functor import visit
    from .packing import physical_shape
    stored = set()
    visit(kernel.body, lambda n: stored.add(n.buffer.name) if isinstance(n, BufferStore) else None)
    out = []
    for b in kernel.params:
        if b.is_texture:
            access = "write" if kernel.access.get(b.name, "read_only") == "write_only" else "read"
            out.append({"name": b.name, "kind": "image", "type": None, "access": access,
                        "extent": [int(x) for x in physical_shape(b)]})
        elif b.scope == "global":
            if len(b.shape) != 1:
                raise LoweringError(f"global buffer {b.name!r} has {len(b.shape)} physical dimensions; "
                                    f"OpenCL buffers are 1-D: drop AXIS_SEPARATOR from its layout")
            out.append({"name": b.name, "kind": "buffer", "type": storage_type(b.dtype),
                        "access": "write" if b.name in stored else "read", "extent": [int(b.shape[0])]})
        else:
            raise LoweringError(f"kernel parameter {b.name!r} has scope {b.scope!r}; parameters are global "
                                f"or texture")
    return out


def uses_half_arithmetic(kernel: Kernel) -> bool:
    """Whether a kernel computes in half (an expression or a private/local array of dtype float16): its
    program needs cl_khr_fp16. Half storage alone (read and written as float) does not."""
    from ..ir.functor import visit
    found = []

    def look(n):
        if isinstance(n, Allocate) and n.buffer.dtype.base == "float16":
            found.append(n)
        elif isinstance(n, Expr) and not isinstance(n, BufferLoad) and getattr(n, "dtype", None) is not None \
                and n.dtype.base == "float16":
            found.append(n)
    visit(kernel.body, look)
    return bool(found)


def kernel_source(kernel: Kernel) -> str:
    return OpenCLCodegen(kernel).generate()


def program_source(prog: "Program | Kernel") -> str:
    """One OpenCL translation unit for all kernels of a lowered program."""
    kernels = prog.kernels if isinstance(prog, Program) else (prog,)
    bodies = [kernel_source(k) for k in kernels]
    helpers = sorted({line for b in bodies for line in b.splitlines() if line.startswith("inline ")})
    bodies = ["\n".join(l for l in b.splitlines() if not l.startswith("inline ")) for b in bodies]
    uses_images = any(b.is_texture for k in kernels for b in k.params)
    head = [FP16_PRAGMA] if any(uses_half_arithmetic(k) for k in kernels) else []
    head += [SAMPLER] if uses_images else []
    return "\n\n".join(["\n".join(head + helpers)] + bodies if head or helpers else bodies) + "\n"
