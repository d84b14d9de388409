"""ONNX -> :class:`Graph` (NCHW operators, see ``graph.py`` for the op names and attrs).

Shapes come from our own per-operator shape functions starting at the input shapes, so a model converts at any
input size (``input_shapes`` overrides the model's input dims and is required for symbolic dims). Every
unsupported operator, attribute or value raises :class:`TunerError` naming the node, the operator, what was
found and what is supported.

What is emitted, per ONNX operator:

- Conv -> ``conv2d`` (group 1 or depthwise); ``auto_pad`` resolved into explicit ``padding``.
- Gemm -> ``dense`` with ``w`` (M, K): ``transB=0`` transposes B, ``alpha`` is folded into ``w`` and ``beta`` into
  ``b`` (new params named ``<B>_w`` / ``<C>_b`` when they differ from the ONNX initializers). MatMul with a
  constant right operand B (K, M) -> ``dense`` with ``w = B.T`` (param ``<B>_T``) and no bias.
- BatchNormalization (inference) -> ``batch_norm``; Relu -> ``relu``; Clip -> ``clip`` with float ``min``/``max``
  (a missing bound is -inf / +inf).
- Constant folding first: a node whose inputs are all constants, or a Shape / Size of a tensor (every shape
  is static once input shapes are fixed), is evaluated by ``onnx.reference.ReferenceEvaluator``; its outputs
  join the constants (any dtype), so shape subgraphs (Shape, Gather, Unsqueeze, Concat, Cast, Div, Range,
  ConstantOfShape, ...) reach Reshape / Resize / Pad handlers as values and never become nodes.
- Sigmoid, Tanh, HardSigmoid, HardSwish, LeakyRelu, Elu -> ``activation`` with ``fn`` (a spec of
  tuner.ir.activations); PRelu -> ``prelu`` (per-channel slope) or ``activation`` leaky_relu (one slope);
  Erf -> ``erf``; Sqrt, Exp, Neg, Abs, Reciprocal and Pow by a constant scalar (2: square, 0.5: sqrt, -1:
  reciprocal, 1: removed) -> ``unary`` with ``fn``; ReduceMean / ReduceMax / ReduceSum / ReduceL2 over any
  axes -> ``reduce_mean`` / ``reduce_max`` / ``reduce_sum`` / ``reduce_l2`` (``axes`` normalized, ``keepdims``;
  axes as attribute or input: ReduceSum from opset 13, the others from 18); GlobalMaxPool ->
  ``global_max_pool``; Softmax over channels -> ``softmax``; pools with ``ceil_mode=1`` keep it as an attr.
- InstanceNormalization, GroupNormalization -> ``group_norm`` (scale / bias per channel; per group before opset
  21, repeated); ``passes.fuse_group_norm`` turns torch's decomposed GroupNorm into one NCHW ``group_norm``.
- Cast to a float type is the identity on activations (storage is the model's dtype); Unsqueeze, Squeeze
  (axes as attribute or, from opset 13, input) -> ``reshape``; Expand of an activation read only by Add / Sub /
  Mul / Div is the identity (they broadcast).
- Sub, Mul, Div like Add below, plus an (N or 1, C, 1, 1) activation broadcast over H, W (squeeze-excitation);
  ``x - c`` -> ``add(x, -c)``, ``x / c`` -> ``mul(x, 1/c)``; ``c - x``, ``c / x`` keep the constant first.
- Add of two same-shape activations -> ``add(a, b)``. Add of an activation and a constant that varies only along
  the channel axis (scalar, (C,), (C, 1, 1), (1, C, 1, 1), ...) -> ``add(x, b)`` with ``b`` a param of the
  activation's broadcast form, (1, C, 1, 1) for NCHW and (1, C) for (N, C): the constant itself when it already
  has that shape, else a new param ``<const>_<node>``. The activation is always the first input (Add commutes).
- GlobalAveragePool, AveragePool, MaxPool -> ``global_avg_pool``, ``avg_pool``, ``max_pool``.
- Flatten (axis 1) -> ``flatten`` on 4-D input (on 2-D input it is a no-op and removed), on other axes ->
  ``reshape``; Reshape -> ``reshape`` with the resolved shape; Concat -> ``concat`` along any axis, constant
  inputs (a class token) as params.
- Binary ops on (N, T, C) tokens with a constant along C ((C,), (1, 1, C), a scalar) or a (1, T, C) position
  embedding keep the constant as a (1, 1, C) / (1, T, C) param; a constant of the activation's whole shape
  (1, ...) is kept whole; two activations of one rank broadcast as ONNX does.
- Identity and Dropout pass their input through and disappear; Constant nodes and initializers become params
  (only those a node reads; Reshape shapes and Clip bounds are folded into attrs).
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from tuner.errors import TunerError
from tuner.frontend.onnx_movement import MovementOps
from tuner.frontend.postprocess import EXPORT_HINT, find_cut
from tuner.graph.graph import Graph, Node
from tuner.ir.activations import spec
from tuner.ops.kernels import pool_out_shape, unary_pow_fn



def from_onnx(model_or_path, input_shapes: dict | None = None) -> Graph:
    """Convert an ONNX model (a ``ModelProto`` or a path to a ``.onnx`` file) to a validated float32 Graph.

    ``input_shapes`` maps graph input names to shapes and overrides the model's dims (needed for symbolic dims
    such as a batch ``N``)."""
    model = _load(model_or_path)
    return _Converter(model, input_shapes or {}).run()


def _load(model_or_path) -> onnx.ModelProto:
    if isinstance(model_or_path, onnx.ModelProto):
        return model_or_path
    if not isinstance(model_or_path, (str, os.PathLike)):
        raise TunerError(f"from_onnx expects an onnx.ModelProto or a path, got {type(model_or_path).__name__}")
    import stat
    path = os.fspath(model_or_path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise TunerError(f"ONNX model {path!r} does not exist") from None
    except OSError as e:
        raise TunerError(f"cannot read ONNX model {path!r}: {e.strerror or e}") from None
    if not stat.S_ISREG(st.st_mode):  # a FIFO or a device would block or never end
        from tuner.files import file_kind
        raise TunerError(f"ONNX model {path!r} is {file_kind(st.st_mode)}, not a regular file")
    if st.st_size == 0:
        raise TunerError(f"ONNX model {path!r} is an empty file (0 bytes), not an ONNX model")
    try:
        model = onnx.load(path)
    except FileNotFoundError:
        raise TunerError(f"ONNX model {path!r} does not exist") from None
    except Exception as e:  # protobuf raises DecodeError and friends for a file that is not a model
        raise TunerError(f"cannot read ONNX model {path!r}: {e}") from None
    if _not_a_model(model):
        raise TunerError(f"{path!r} is not an ONNX model: it holds no ir_version, opset import or graph")
    return model


def _not_a_model(model: onnx.ModelProto) -> bool:
    """Bytes that happen to parse as a protobuf message (or an empty one) give a ModelProto of nothing."""
    return not model.ir_version and not model.opset_import and not model.HasField("graph")


@dataclass
class _Ctx:
    """One ONNX node being converted: its identity for error messages and its parsed attributes."""
    index: int
    proto: onnx.NodeProto
    name: str  # the Graph node name
    attrs: dict

    @property
    def op(self) -> str:
        return self.proto.op_type

    def fail(self, problem: str, supported: str):
        label = f"{self.proto.name!r} (#{self.index}, {self.op})" if self.proto.name else f"#{self.index} ({self.op})"
        raise TunerError(f"ONNX node {label}: {problem}; supported: {supported}")

    def check_attrs(self, allowed: tuple):
        for key in self.attrs:
            if key not in allowed:
                self.fail(f"attribute {key!r} is not supported",
                          f"attributes {', '.join(allowed)}" if allowed else "no attributes")

    def inputs(self) -> list:
        """Input names with trailing empty (omitted optional) inputs dropped."""
        names = list(self.proto.input)
        while names and not names[-1]:
            names.pop()
        return names


class _Converter(MovementOps):
    def __init__(self, model: onnx.ModelProto, input_shapes: dict):
        self.model = model
        self.g = model.graph
        if _not_a_model(model):
            raise TunerError("the ModelProto is empty: it holds no ir_version, opset import or graph; not an ONNX model")
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
        if self.opset is None:
            raise TunerError("the ONNX model imports no default-domain (ai.onnx) opset")
        newest = onnx.defs.onnx_opset_version()
        if not 1 <= self.opset <= newest:
            raise TunerError(f"the ONNX model imports ai.onnx opset {self.opset}; this tuner (onnx {onnx.__version__}) "
                             f"knows opsets 1 to {newest}: export the model with an opset in that range")
        self.consts: dict[str, np.ndarray] = {}
        self.shapes: dict[str, tuple] = {}
        self.alias: dict[str, str] = {}  # removed tensor (Identity/Dropout output) -> the tensor it copies
        self.expanded: dict[str, tuple] = {}  # an Expand's output (an alias of its input) -> its ONNX shape
        self.nodes: list[Node] = []
        self.params: dict[str, np.ndarray] = {}
        self.node_names: set = set()
        self.tensor_names: set = set()
        for init in self.g.initializer:
            self.consts[init.name] = numpy_helper.to_array(init)
        self.inputs = [i.name for i in self.g.input if i.name not in self.consts]
        self._input_shapes(input_shapes)
        self.tensor_names.update(self.consts, self.inputs)
        self._check_single_definitions()
        for node in self.g.node:
            self.tensor_names.update(t for t in node.output if t)
        self.cut = find_cut(self.g)  # the post-processing (NMS, TopK, ...): left to the caller

    def _check_single_definitions(self):
        """Every tensor has one definition (static single assignment, as ONNX requires and onnxruntime checks):
        a graph input, an initializer, or one output of one node."""
        where: dict = {}
        for vi in self.g.input:
            where.setdefault(vi.name, "the graph input")
        for init in self.g.initializer:
            if init.name not in where:
                where[init.name] = "an initializer"
        for index, node in enumerate(self.g.node):
            label = (f"node {node.name!r} (#{index}, {node.op_type})" if node.name
                     else f"node #{index} ({node.op_type})")
            for t in node.output:
                if not t:
                    continue
                if t in where:
                    raise TunerError(f"ONNX tensor {t!r} is defined twice: by {where[t]} and by {label}; each "
                                     "tensor must be the output of exactly one node (or an input or initializer), "
                                     "so rename one of them")
                where[t] = label

    # -- inputs -----------------------------------------------------------------------------------------------

    def _input_shapes(self, overrides: dict):
        unknown = [k for k in overrides if k not in self.inputs]
        if unknown:
            raise TunerError(f"input_shapes names {unknown}, which are not inputs of the model; its inputs are "
                             f"{self.inputs}")
        for vi in self.g.input:
            if vi.name in self.consts:
                continue
            if not vi.type.HasField("tensor_type"):
                raise TunerError(f"ONNX input {vi.name!r} is not a tensor; only float32 tensor inputs are supported")
            tt = vi.type.tensor_type
            if tt.elem_type != onnx.TensorProto.FLOAT:
                raise TunerError(f"ONNX input {vi.name!r} has element type "
                                 f"{onnx.TensorProto.DataType.Name(tt.elem_type)}; only FLOAT (float32) models "
                                 "are supported")
            dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in tt.shape.dim]
            if vi.name in overrides:
                shape = overrides[vi.name]
                if (not isinstance(shape, (tuple, list)) or not shape
                        or not all(isinstance(d, (int, np.integer)) and d > 0 for d in shape)):
                    raise TunerError(f"input_shapes[{vi.name!r}] = {shape!r}: expected a tuple of positive ints")
                if tt.HasField("shape") and len(shape) != len(dims):
                    raise TunerError(f"input_shapes[{vi.name!r}] = {tuple(shape)} has rank {len(shape)}, but the "
                                     f"model's input has rank {len(dims)} (shape {tuple(dims)})")
                self.shapes[vi.name] = tuple(int(d) for d in shape)
                continue
            if not tt.HasField("shape"):
                raise TunerError(f"ONNX input {vi.name!r} has no shape; pass it with input_shapes="
                                 f"{{{vi.name!r}: (1, 3, 224, 224)}} (CLI: --input-shape {vi.name}=1,3,224,224)")
            bad = [(axis, d) for axis, d in enumerate(dims) if not isinstance(d, int) or d <= 0]
            if bad:
                axis, d = bad[0]
                example = ",".join(str(x) if isinstance(x, int) and x > 0 else "1" for x in dims)
                what = (f"symbolic dimension {d!r}" if not isinstance(d, int) else
                        "a zero-size dimension (an empty tensor: nothing to compute)" if d == 0 else
                        f"a negative dimension {d}")
                raise TunerError(f"ONNX input {vi.name!r} has {what} at axis {axis} (shape "
                                 f"{tuple(dims)}); pass {'concrete' if what.startswith('sym') else 'positive'} dims with input_shapes={{{vi.name!r}: "
                                 f"({example.replace(',', ', ')})}} (CLI: --input-shape {vi.name}={example})")
            self.shapes[vi.name] = tuple(dims)

    # -- conversion -------------------------------------------------------------------------------------------

    def run(self) -> Graph:
        for index, proto in enumerate(self.g.node):
            if index in self.cut.nodes:
                continue
            ctx = _Ctx(index, proto, self._node_name(index, proto), _attrs(proto))
            if proto.domain not in ("", "ai.onnx"):
                ctx.fail(f"operator {proto.domain}.{proto.op_type} (custom domain) is not supported",
                         f"ai.onnx operators {', '.join(SUPPORTED_OPS)}")
            if self._fold(ctx):
                continue
            handler = getattr(self, f"_op_{proto.op_type}", None)
            if handler is None:
                ctx.fail(f"operator {proto.op_type} is not supported", f"operators {', '.join(SUPPORTED_OPS)}")
            for t in ctx.inputs():
                if t and self.resolve(t) not in self.shapes and self.resolve(t) not in self.consts:
                    ctx.fail(f"input {t!r} is not produced by an earlier node, an input or an initializer",
                             "models whose nodes are in topological order")
            try:
                handler(ctx)
            except TunerError as e:
                if index not in self.cut.feeders:
                    raise
                raise TunerError(f"{e}; node {ctx.name!r} ({proto.op_type}) only feeds the post-processing "
                                 f"({self.cut.starts()}), so where the model stops is ambiguous: {EXPORT_HINT}") \
                    from None
        outputs = self._outputs()
        self._prune(outputs)
        used = {t for n in self.nodes for t in n.inputs}
        params = {name: self.params[name] for name in self.params if name in used}
        shapes = {t: self.shapes[t] for t in self.inputs}
        shapes.update({name: tuple(v.shape) for name, v in params.items()})
        for n in self.nodes:
            shapes.update({t: self.shapes[t] for t in n.outputs})
        graph = Graph(self.nodes, list(self.inputs), outputs, shapes, params, "float32")
        try:
            return graph.validate()
        except ValueError as e:  # a frontend bug rather than a user error, but say which model part it concerns
            raise TunerError(f"the converted graph is inconsistent: {e}") from None

    def _fold(self, ctx: _Ctx) -> bool:
        """Constant folding: a node whose inputs are all constants (initializers, Constant nodes, folded nodes),
        or a Shape / Size of a tensor whose shape is known (every activation's, with the input shapes fixed),
        is evaluated now by onnx's ReferenceEvaluator; its outputs become constants (``self.consts``, any dtype)
        so that Resize sizes, Pad pads, Reshape targets computed by shape subgraphs reach handlers as values."""
        proto = ctx.proto
        names = [t for t in ctx.inputs() if t]
        if proto.op_type == "Constant" or not names:
            return False
        srcs = [self.resolve(t) for t in names]
        if proto.op_type in ("Shape", "Size") and srcs[0] not in self.consts and srcs[0] in self.shapes:
            feeds = {names[0]: np.broadcast_to(np.zeros((), np.float32), self.shapes[srcs[0]])}
        elif all(s in self.consts for s in srcs):
            feeds = {t: self.consts[s] for t, s in zip(names, srcs)}
        else:
            return False
        try:
            values = _evaluate(proto, feeds, self.opset)
        except Exception as e:  # noqa: BLE001 - the evaluator raises anything; name the node
            ctx.fail(f"evaluating it on constant inputs failed ({type(e).__name__}: {e})",
                     "operators onnx.reference evaluates, on constant or static-shape inputs")
        for t, v in zip(proto.output, values):
            if t:
                self.consts[t] = np.asarray(v)
        return True

    def _node_name(self, index: int, proto) -> str:
        name = proto.name or f"{proto.op_type}_{index}"
        if name in self.node_names:
            name = f"{name}_{index}"
        self.node_names.add(name)
        return name

    def resolve(self, name: str) -> str:
        while name in self.alias:
            name = self.alias[name]
        return name

    def _outputs(self) -> list:
        """Graph outputs; one that an Identity/Dropout copied is given its ONNX name by renaming its producer's
        output, so the Graph's outputs keep the model's names."""
        outputs = []
        names = [vi.name for vi in self.g.output if vi.name not in self.cut.made]
        if self.cut:
            names += self._cut_outputs(names)
        for name in names:
            src = self.resolve(name)
            if src == name:
                if name in self.consts or name not in self.shapes:
                    raise TunerError(f"ONNX output {name!r} is a constant or never computed; nothing to run")
                outputs.append(name)
                continue
            if src in self.inputs or src in self.consts or src in outputs or src in names:
                raise TunerError(f"ONNX output {name!r} is a copy (Identity/Dropout) of {src!r}, which is an input, "
                                 "a constant or another output; such pass-through outputs are not supported")
            for n in self.nodes:
                n.inputs = [name if t == src else t for t in n.inputs]
                n.outputs = [name if t == src else t for t in n.outputs]
            self.shapes[name] = self.shapes[src]
            for k, v in self.alias.items():
                if v == src:
                    self.alias[k] = name
            outputs.append(name)
        return outputs

    def _cut_outputs(self, names: list) -> list:
        """The activations the post-processing reads, as outputs (the inputs and constants it reads the caller has;
        a copy of one, through Identity, is that one); one it reads that the kernels cannot return (an integer
        tensor) makes the cut ambiguous: refused."""
        import warnings
        out, given = [], {self.resolve(n): n for n in names}  # resolved tensor -> the output that returns it
        origins = []
        for t in self.cut.reads:
            src = self.resolve(t)
            if src in self.inputs:
                origins.append((t, "a model input"))
                continue
            if src in self.consts:
                origins.append((t, "a constant of the model" if t in self.consts else "a constant the compile folded"))
                continue
            if src not in self.shapes:
                reader = next(n for i, n in enumerate(self.g.node) if i in self.cut.nodes and t in n.input)
                raise TunerError(f"node {reader.name or reader.op_type!r} ({reader.op_type}) of the post-processing "
                                 f"reads {t!r}, which the compiled graph cannot return (not a float activation it "
                                 f"computes), so where the model stops is ambiguous; {EXPORT_HINT}")
            if src not in given:
                given[src] = t
                out.append(t)
            origins.append((t, "compiled output" + (f" {given[src]!r}" if given[src] != t else "")))
        if not out and not names:
            raise TunerError(f"every output of the model is made by its post-processing ({self.cut.starts()}) from "
                             "inputs or constants only: there is nothing to compile")
        warnings.warn(self.cut.describe(out, origins), stacklevel=4)
        return out

    def _prune(self, outputs: list):
        """Drop nodes nothing downstream reads (e.g. what only fed a removed Dropout mask)."""
        live = set(outputs)
        kept = []
        for n in reversed(self.nodes):
            if any(t in live for t in n.outputs):
                kept.append(n)
                live.update(n.inputs)
        self.nodes = kept[::-1]

    # -- helpers for handlers ---------------------------------------------------------------------------------

    def act(self, ctx: _Ctx, name: str, rank: tuple | None = None) -> str:
        """An activation input (not a constant), optionally of one of the given ranks; returns its resolved name."""
        src = self.resolve(name)
        if src in self.consts:
            ctx.fail(f"input {name!r} is a constant", "computed (activation) tensors for this input")
        if rank is not None and len(self.shapes[src]) not in rank:
            ctx.fail(f"input {name!r} has shape {self.shapes[src]}",
                     " or ".join({4: "a 4-D (N, C, H, W)", 3: "a 3-D (N, T, C)", 2: "a 2-D (N, K)"}[r] for r in rank) + " input")
        return src

    def const(self, ctx: _Ctx, name: str, what: str) -> np.ndarray:
        src = self.resolve(name)
        if src not in self.consts:
            ctx.fail(f"{what} {name!r} is computed by the graph", f"{what} given as an initializer or Constant")
        return self.consts[src]

    def param(self, ctx: _Ctx, name: str, what: str, shape: tuple) -> str:
        """A constant input used as a param as is; returns its name."""
        value = self.const(ctx, name, what)
        if value.dtype.kind != "f":
            ctx.fail(f"{what} {name!r} has dtype {value.dtype}", "float32 constants")
        if tuple(value.shape) != tuple(shape):
            ctx.fail(f"{what} {name!r} has shape {tuple(value.shape)}, expected {tuple(shape)}",
                     f"{what} of shape {tuple(shape)}")
        src = self.resolve(name)
        self.params[src] = np.ascontiguousarray(value, dtype=np.float32)
        return src

    def _fresh(self, base: str) -> str:
        """``base``, or ``base_<k>`` for the first k that names nothing yet; taken."""
        name, k = base, 1
        while name in self.tensor_names or name in self.params or name in self.shapes:
            name, k = f"{base}_{k}", k + 1
        self.tensor_names.add(name)
        return name

    def new_param(self, base: str, value: np.ndarray) -> str:
        name = self._fresh(base)
        self.params[name] = np.ascontiguousarray(value, dtype=np.float32)
        return name

    def new_tensor(self, base: str, shape) -> str:
        """A fresh activation name (an intermediate a handler emits several nodes through) of ``shape``."""
        name = self._fresh(base)
        self.shapes[name] = tuple(int(d) for d in shape)
        return name

    def emit(self, ctx: _Ctx, op: str, inputs: list, out_shape: tuple, **attrs):
        out = ctx.proto.output[0]
        if any(d <= 0 for d in out_shape):
            ctx.fail(f"the output shape {out_shape} is empty", "operators whose output has at least one element")
        self.shapes[out] = tuple(int(d) for d in out_shape)
        self.nodes.append(Node(op, ctx.name, inputs, [out], attrs))

    def single_output(self, ctx: _Ctx):
        extra = [t for t in ctx.proto.output[1:] if t]
        if extra:
            ctx.fail(f"optional outputs {extra} are requested", "only the first output (inference form)")

    # -- operators --------------------------------------------------------------------------------------------

    def _op_Constant(self, ctx: _Ctx):
        ctx.check_attrs(("value", "value_float", "value_floats", "value_int", "value_ints"))
        if len(ctx.attrs) != 1:
            ctx.fail(f"attributes {sorted(ctx.attrs)}", "exactly one of value, value_float(s), value_int(s)")
        key, value = next(iter(ctx.attrs.items()))
        if key == "value":
            array = numpy_helper.to_array(value)
        else:
            array = np.array(value, dtype=np.float32 if key.startswith("value_float") else np.int64)
        self.consts[ctx.proto.output[0]] = array

    def _op_Identity(self, ctx: _Ctx):
        ctx.check_attrs(())
        self.alias[ctx.proto.output[0]] = self.resolve(ctx.proto.input[0])

    def _op_Dropout(self, ctx: _Ctx):
        ctx.check_attrs(("ratio", "seed", "is_test"))
        names = ctx.inputs()
        if len(names) > 2 and names[2]:
            training = self.const(ctx, names[2], "training_mode")
            if bool(np.asarray(training).reshape(-1)[0]):
                ctx.fail("training_mode is true", "inference (training_mode false or absent)")
        if self.opset < 7 and not ctx.attrs.get("is_test", 0):
            ctx.fail("is_test=0 (training)", "inference (is_test=1)")
        mask = [t for t in ctx.proto.output[1:] if t]
        if mask and (any(mask[0] in n.input for n in self.g.node) or mask[0] in {o.name for o in self.g.output}):
            ctx.fail(f"its mask output {mask[0]!r} is used", "Dropout as a pass-through (mask unused)")
        self.alias[ctx.proto.output[0]] = self.resolve(ctx.proto.input[0])

    def _op_Relu(self, ctx: _Ctx):
        ctx.check_attrs(())
        x = self.act(ctx, ctx.proto.input[0])
        self.emit(ctx, "relu", [x], self.shapes[x])

    def _op_Clip(self, ctx: _Ctx):
        names = ctx.inputs()
        if self.opset >= 11:
            ctx.check_attrs(())
            bounds = []
            for i, what, default in ((1, "min", -math.inf), (2, "max", math.inf)):
                if len(names) > i and names[i]:
                    value = self.const(ctx, names[i], f"Clip {what}")
                    if value.size != 1:
                        ctx.fail(f"{what} {names[i]!r} has shape {value.shape}", f"a scalar {what}")
                    bounds.append(float(value.reshape(-1)[0]))
                else:
                    bounds.append(default)
        else:  # Clip-6: bounds are attributes
            ctx.check_attrs(("min", "max"))
            bounds = [float(ctx.attrs.get("min", -math.inf)), float(ctx.attrs.get("max", math.inf))]
        if bounds[0] > bounds[1]:
            ctx.fail(f"min {bounds[0]} > max {bounds[1]}", "min <= max")
        x = self.act(ctx, names[0])
        self.emit(ctx, "clip", [x], self.shapes[x], min=bounds[0], max=bounds[1])

    def _op_Add(self, ctx: _Ctx):
        self._binary(ctx, "add")

    def _op_Sub(self, ctx: _Ctx):
        self._binary(ctx, "sub")

    def _op_Mul(self, ctx: _Ctx):
        self._binary(ctx, "mul")

    def _op_Div(self, ctx: _Ctx):
        self._binary(ctx, "div")

    def _binary(self, ctx: _Ctx, op: str):
        expanded = [t for t in ctx.inputs() if t in self.expanded]
        if self._binary_high_rank(ctx, op):
            return
        self._binary_node(ctx, op)
        if expanded:  # an Expand turned identity: the broadcast must give ONNX's shape all the same
            shapes = [self.expanded.get(t) or self.shapes.get(self.resolve(t)) or self.consts[self.resolve(t)].shape
                      for t in ctx.inputs()]
            want = tuple(int(d) for d in np.broadcast_shapes(*[tuple(s) for s in shapes]))
            if self.shapes[ctx.proto.output[0]] != want:
                ctx.fail(f"an operand Expanded to {self.expanded[expanded[0]]}, giving {want}, but without the "
                         f"Expand the result is {self.shapes[ctx.proto.output[0]]}",
                         "an Expand whose shape the other operand already has")

    def _binary_high_rank(self, ctx: _Ctx, op: str) -> bool:
        """A binary op on activations of 5 or more axes (Swin's window mask, Twins' window biases): on the 3-D
        (prod(leading axes), M, N) between reshapes that ``passes_tokens`` folds, a constant broadcast to the
        activation's whole shape first (the token pass keeps only what varies). False: not such an op."""
        names = ctx.inputs()
        srcs = [self.resolve(t) for t in names]
        acts = [s for s in srcs if s not in self.consts]
        if len(names) != 2 or not acts or max(len(self.shapes[a]) for a in acts) < 5:
            return False
        shape = tuple(int(d) for d in np.broadcast_shapes(*[self.shapes[s] if s in self.shapes
                                                            else self.consts[s].shape for s in srcs]))
        if any(self.shapes[a] != shape for a in acts):
            ctx.fail(f"activations of shapes {[self.shapes[a] for a in acts]} broadcast to {shape}",
                     "activations of 5 or more axes of one shape (constants may broadcast)")
        rows = (math.prod(shape[:-2]), shape[-2], shape[-1])
        out, ins = ctx.proto.output[0], []
        for k, s in enumerate(srcs):
            if s in self.consts:
                v = self.consts[s]
                if v.dtype.kind != "f":
                    ctx.fail(f"constant {names[k]!r} has dtype {v.dtype}", "float32 constants")
                ins.append(self.new_param(f"{s}_{ctx.name}_rows",
                                          np.ascontiguousarray(np.broadcast_to(v.astype(np.float32), shape)).reshape(rows)))
            else:
                self._emit_to(ctx, f"{out}.in{k}", f"{ctx.name}.in{k}", "reshape", [s], rows, shape=rows)
                ins.append(f"{out}.in{k}")
        self._emit_to(ctx, f"{out}.rows", ctx.name, op, ins, rows)  # operand order kept, as written
        self._emit_to(ctx, out, f"{ctx.name}.back", "reshape", [f"{out}.rows"], shape, shape=shape)
        return True

    def _binary_node(self, ctx: _Ctx, op: str):
        """Add / Sub / Mul / Div with the broadcasting models use: two activations of one shape, an (N, C, H, W)
        activation and an (N or 1, C, 1, 1) one (squeeze-excitation's gate), or an activation and a constant that
        varies only along channels (stored in the activation's broadcast form (1, C, 1, 1) or (1, C)). Add and Mul
        put the full-size activation first; ``x - c`` becomes ``add(x, -c)`` and ``x / c`` ``mul(x, 1 / c)``."""
        ctx.check_attrs(())
        names = ctx.inputs()
        if len(names) != 2:
            ctx.fail(f"{len(names)} inputs", "2 inputs")
        srcs = [self.resolve(t) for t in names]
        is_const = [s in self.consts for s in srcs]
        commutes = op in ("add", "mul")
        if not any(is_const):
            a, b = srcs
            sa, sb = self.shapes[a], self.shapes[b]
            if sa == sb:
                self.emit(ctx, op, [a, b], sa)
                return
            scalar = [s for s in (sa, sb) if len(s) == len(sa) == len(sb) and len(s) in (2, 4) and
                      all(d == 1 for d in s[1:])]
            full = sb if sa in scalar and sb not in scalar else sa
            if scalar and full not in scalar and scalar[0][0] in (1, full[0]):
                # one value per image (ConvNeXt-V2's GRN divides by a mean over channels) broadcast over the rest
                self.emit(ctx, op, [b, a] if commutes and sa in scalar else [a, b], full)
                return
            gate = [s for s in (sa, sb) if len(s) == 4 and s[2:] == (1, 1)]
            full = sb if sa in gate and sb not in gate else sa
            if (len(sa) == len(sb) == 4 and len(gate) == 1 and gate[0][1] == full[1]
                    and gate[0][0] in (1, full[0])):
                self.emit(ctx, op, [b, a] if commutes and sa in gate else [a, b], full)
                return
            if len(sa) == len(sb) and all(p == q or 1 in (p, q) for p, q in zip(sa, sb)):
                # any other broadcast of equal ranks (attention's (N, h, T, 1) normalizers): the reference runs
                # it, lowering says which forms have a kernel
                self.emit(ctx, op, [a, b], tuple(max(p, q) for p, q in zip(sa, sb)))
                return
            ctx.fail(f"activations of shapes {sa} and {sb} (broadcasting)",
                     "two activations of the same shape, or of one rank broadcasting (an (N, C, H, W) activation "
                     "with an (N, C, 1, 1) one), or an activation and a per-channel constant")
        x_first = not is_const[0]
        x, c = (srcs[0], srcs[1]) if x_first else (srcs[1], srcs[0])
        shape, value = self.shapes[x], self.consts[c]
        if value.dtype.kind != "f":
            ctx.fail(f"constant {c!r} has dtype {value.dtype}", "float32 constants")
        form = tuple(shape[1] if axis == 1 else 1 for axis in range(len(shape)))  # (1, C, 1, 1) or (1, C)
        padded = (1,) * (len(shape) - value.ndim) + tuple(value.shape)
        last = len(shape) == 4 and value.ndim <= 4 and padded[:3] == (1, 1, 1) and padded[3] == shape[3] > 1
        tokens = len(shape) == 3 and value.ndim <= 3 and padded[0] == 1 and padded[1] in (1, shape[1]) \
            and padded[2] in (1, shape[2])
        whole = len(shape) >= 3 and value.ndim <= len(shape) and padded[0] == 1 and padded[1:] == tuple(shape[1:])
        if whole and not tokens:  # a constant of the activation's shape (an attention bias (1, heads, T, T))
            form = (1,) + tuple(shape[1:])
        elif last:  # along the last axis of an NHWC block (ConvNeXt's Linear bias, layer scale): the layout pass
            form = (1, 1, 1, shape[3])  # (passes_movement) moves it onto channels with the block's transposes
        elif tokens:  # (N, T, C) tokens: a bias or scale along C, or a (1, T, C) position embedding, in ONNX's
            form = (1, padded[1], shape[2])  # orientation; the tokens pass moves it with the activation
        elif (len(shape) == 4 and value.ndim >= 3 and padded[0] == 1 and padded[1] in (1, shape[1])
              and padded[2:] == tuple(shape[2:])):  # an attention bias (heads, M, N) on the scores: the
            form = padded  # tokens pass (passes_tokens.attention_ranks) runs the add on 3-D with the matmul
        elif (len(shape) < 2 or value.ndim > len(shape)
                or any(d != 1 and not (axis == 1 and d == shape[1]) for axis, d in enumerate(padded))):
            ctx.fail(f"constant {c!r} of shape {tuple(value.shape)} and an activation of shape {shape}",
                     f"a constant that varies only along channels, broadcastable as {form} (e.g. (C,), "
                     "(C, 1, 1), (1, C, 1, 1) or a scalar)")
        if x_first and op in ("sub", "div"):
            value = -value.astype(np.float64) if op == "sub" else 1.0 / value.astype(np.float64)
            op = "add" if op == "sub" else "mul"
            b = self.new_param(f"{c}_{ctx.name}", np.broadcast_to(value.reshape(padded), form))
        else:
            b = (self.param(ctx, c, "constant", form) if tuple(value.shape) == form
                 else self.new_param(f"{c}_{ctx.name}", np.broadcast_to(value.reshape(padded), form)))
        self.emit(ctx, op, [x, b] if x_first or op in ("add", "mul") else [b, x], shape)

    # -- activations ------------------------------------------------------------------------------------------

    def _activation(self, ctx: _Ctx, name: str, *params: float, attrs: tuple = ()):
        """A unary activation node ``activation`` with ``fn``, the spec string of tuner.ir.activations."""
        ctx.check_attrs(attrs)
        self.single_output(ctx)
        x = self.act(ctx, ctx.proto.input[0])
        self.emit(ctx, "activation", [x], self.shapes[x], fn=spec(name, *params))

    def _op_Sigmoid(self, ctx: _Ctx):
        self._activation(ctx, "sigmoid")

    def _op_Tanh(self, ctx: _Ctx):
        self._activation(ctx, "tanh")

    def _op_HardSwish(self, ctx: _Ctx):
        self._activation(ctx, "hardswish")

    def _op_HardSigmoid(self, ctx: _Ctx):
        self._activation(ctx, "hardsigmoid", float(ctx.attrs.get("alpha", 0.2)), float(ctx.attrs.get("beta", 0.5)),
                         attrs=("alpha", "beta"))

    def _op_LeakyRelu(self, ctx: _Ctx):
        self._activation(ctx, "leaky_relu", float(ctx.attrs.get("alpha", 0.01)), attrs=("alpha",))

    def _op_Elu(self, ctx: _Ctx):
        self._activation(ctx, "elu", float(ctx.attrs.get("alpha", 1.0)), attrs=("alpha",))

    def _op_Erf(self, ctx: _Ctx):
        ctx.check_attrs(())
        x = self.act(ctx, ctx.proto.input[0])
        self.emit(ctx, "erf", [x], self.shapes[x])

    def _unary(self, ctx: _Ctx, fn: str):
        """``unary`` with ``fn`` (kernels.UNARY_FNS: sqrt, exp, neg, abs, reciprocal, square, pow(p))."""
        ctx.check_attrs(())
        x = self.act(ctx, ctx.proto.input[0])
        self.emit(ctx, "unary", [x], self.shapes[x], fn=fn)

    def _op_Sqrt(self, ctx: _Ctx):
        self._unary(ctx, "sqrt")

    def _op_Exp(self, ctx: _Ctx):
        self._unary(ctx, "exp")

    def _op_Neg(self, ctx: _Ctx):
        self._unary(ctx, "neg")

    def _op_Abs(self, ctx: _Ctx):
        self._unary(ctx, "abs")

    def _op_Reciprocal(self, ctx: _Ctx):
        self._unary(ctx, "reciprocal")

    def _op_Pow(self, ctx: _Ctx):
        """An activation to a constant scalar power: 1 is the identity, 2 ``square`` (x * x), 0.5 ``sqrt``,
        -1 ``reciprocal``, any other ``pow(p)``."""
        ctx.check_attrs(())
        names = ctx.inputs()
        x = self.act(ctx, names[0])
        e = self.const(ctx, names[1], "exponent Y")
        if e.size != 1 or e.dtype.kind not in "fiu":
            ctx.fail(f"exponent of shape {e.shape} and dtype {e.dtype}", "a constant scalar exponent")
        p = float(np.asarray(e).reshape(-1)[0])
        if p == 1.0:
            self.alias[ctx.proto.output[0]] = x
            return
        fn = {2.0: "square", 0.5: "sqrt", -1.0: "reciprocal"}.get(p) or unary_pow_fn(p)
        self.emit(ctx, "unary", [x], self.shapes[x], fn=fn)

    # -- casts and shape operators on activations -------------------------------------------------------------

    _FLOAT_TYPES = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE,
                    onnx.TensorProto.BFLOAT16)

    def _op_Cast(self, ctx: _Ctx):
        """Between float types an identity on activations (the storage dtype is the model's); a Cast of
        constants (shape code, integer casts) was folded before this handler."""
        ctx.check_attrs(("to", "saturate"))
        x = self.act(ctx, ctx.proto.input[0])
        to = int(ctx.attrs.get("to", 0))
        if to not in self._FLOAT_TYPES:
            ctx.fail(f"a cast of activation {ctx.proto.input[0]!r} to "
                     f"{onnx.TensorProto.DataType.Name(to) if to in onnx.TensorProto.DataType.values() else to}",
                     "casts of activations to float types (FLOAT, FLOAT16, DOUBLE, BFLOAT16: an identity), "
                     "and casts of constants to any type")
        self.alias[ctx.proto.output[0]] = x

    def _reshape_to(self, ctx: _Ctx, x: str, out: tuple):
        """``reshape`` of activation ``x`` to ``out`` (the identity when the shape does not change)."""
        if tuple(out) == tuple(self.shapes[x]):
            self.alias[ctx.proto.output[0]] = x
            return
        self.emit(ctx, "reshape", [x], tuple(out), shape=tuple(out))

    def _axes(self, ctx: _Ctx, names: list, first_input_opset: int) -> list | None:
        """Unsqueeze / Squeeze axes: the ``axes`` input from ``first_input_opset`` on, else the attribute;
        None when absent."""
        if self.opset >= first_input_opset:
            ctx.check_attrs(())
            return self._ints(ctx, names[1], "axes") if len(names) > 1 and names[1] else None
        ctx.check_attrs(("axes",))
        return [int(a) for a in ctx.attrs["axes"]] if "axes" in ctx.attrs else None

    def _op_Unsqueeze(self, ctx: _Ctx):
        names = ctx.inputs()
        axes = self._axes(ctx, names, 13)
        x = self.act(ctx, names[0])
        shape = list(self.shapes[x])
        rank = len(shape) + len(axes or [])
        norm = sorted({a + rank if a < 0 else a for a in axes or []})
        if not axes or len(norm) != len(axes) or any(not 0 <= a < rank for a in norm):
            ctx.fail(f"axes {axes} for a {len(shape)}-D input", f"distinct axes in [-{rank}, {rank - 1}]")
        for a in norm:
            shape.insert(a, 1)
        self._reshape_to(ctx, x, tuple(shape))

    def _op_Squeeze(self, ctx: _Ctx):
        names = ctx.inputs()
        axes = self._axes(ctx, names, 13)
        x = self.act(ctx, names[0])
        shape = self.shapes[x]
        rank = len(shape)
        norm = ({a + rank if a < 0 else a for a in axes} if axes is not None
                else {a for a, d in enumerate(shape) if d == 1})
        if any(not 0 <= a < rank or shape[a] != 1 for a in norm) or len(norm) != len(axes if axes is not None
                                                                                        else norm):
            ctx.fail(f"axes {axes} for an input of shape {shape}", "distinct axes of extent 1")
        self._reshape_to(ctx, x, tuple(d for a, d in enumerate(shape) if a not in norm))

    def _op_Expand(self, ctx: _Ctx):
        """Expand of an activation (of a constant it is folded) read only by Add / Sub / Mul / Div: those
        broadcast it themselves, so it becomes the identity; each of them checks that its output keeps the
        expanded shape."""
        ctx.check_attrs(())
        names = ctx.inputs()
        x = self.act(ctx, names[0])
        target = self._ints(ctx, names[1], "shape")
        shape = self.shapes[x]
        try:
            out = tuple(int(d) for d in np.broadcast_shapes(tuple(shape), tuple(target)))
        except ValueError:
            ctx.fail(f"shape {target} for an input of shape {shape}", "a shape the input broadcasts to")
        if out == tuple(shape):
            self.alias[ctx.proto.output[0]] = x
            return
        y = ctx.proto.output[0]
        readers = [n for n in self.g.node if y in n.input]
        if y in {o.name for o in self.g.output} or any(n.op_type not in ("Add", "Sub", "Mul", "Div")
                                                      for n in readers):
            ctx.fail(f"Expand of activation {names[0]!r} {shape} to {out} read by "
                     f"{sorted({n.op_type for n in readers}) or 'the graph outputs'}",
                     "an Expand read only by Add, Sub, Mul or Div (which broadcast it themselves)")
        self.alias[y] = x
        self.expanded[y] = out

    # -- normalizations ---------------------------------------------------------------------------------------

    def _norm_affine(self, ctx: _Ctx, names: list, groups: int, channels: int, per_group: bool) -> list:
        """scale and bias params (C,) of ``group_norm``: given per channel, or per group (repeated)."""
        out = []
        for name, what in zip(names, ("scale", "bias")):
            v = self.const(ctx, name, what)
            size = groups if per_group else channels
            if v.dtype.kind != "f" or v.size != size:
                ctx.fail(f"{what} {name!r} of shape {v.shape} and dtype {v.dtype}",
                         f"a float {what} of {size} elements ({'one per group' if per_group else 'one per channel'})")
            if not per_group and tuple(v.shape) == (channels,):
                out.append(self.param(ctx, name, what, (channels,)))
            else:
                v = np.repeat(v.reshape(-1), channels // groups) if per_group else v.reshape(-1)
                out.append(self.new_param(f"{self.resolve(name)}_{ctx.name}", v))
        return out

    def _op_InstanceNormalization(self, ctx: _Ctx):
        """-> ``group_norm`` with one group per channel (statistics per (n, c) over the other axes); a torch
        GroupNorm export (Reshape to (N, G, -1), InstanceNormalization, Reshape back) becomes one 4-D
        ``group_norm`` in ``passes.fuse_group_norm``."""
        ctx.check_attrs(("epsilon",))
        names = ctx.inputs()
        if len(names) != 3:
            ctx.fail(f"{len(names)} inputs", "input, scale, B")
        x = self.act(ctx, names[0])
        shape = self.shapes[x]
        if len(shape) < 3:
            ctx.fail(f"input of shape {shape}", "an (N, C, D1, ...) input")
        c = shape[1]
        scale, bias = self._norm_affine(ctx, names[1:], c, c, False)
        self.emit(ctx, "group_norm", [x, scale, bias], shape, groups=c,
                  epsilon=float(ctx.attrs.get("epsilon", 1e-5)))

    def _op_GroupNormalization(self, ctx: _Ctx):
        """-> ``group_norm``; scale and bias per group (opset 18, repeated per channel) or per channel (21)."""
        ctx.check_attrs(("epsilon", "num_groups", "stash_type"))
        names = ctx.inputs()
        if len(names) != 3 or "num_groups" not in ctx.attrs:
            ctx.fail(f"{len(names)} inputs and attributes {sorted(ctx.attrs)}", "X, scale, bias and num_groups")
        x = self.act(ctx, names[0])
        shape = self.shapes[x]
        groups = int(ctx.attrs["num_groups"])
        if len(shape) < 3 or groups < 1 or shape[1] % groups:
            ctx.fail(f"num_groups={groups} for an input of shape {shape}",
                     "an (N, C, D1, ...) input with num_groups dividing C")
        scale, bias = self._norm_affine(ctx, names[1:], groups, shape[1], self.opset < 21)
        self.emit(ctx, "group_norm", [x, scale, bias], shape, groups=groups,
                  epsilon=float(ctx.attrs.get("epsilon", 1e-5)))

    def _op_PRelu(self, ctx: _Ctx):
        ctx.check_attrs(())
        names = ctx.inputs()
        x = self.act(ctx, names[0])
        slope = self.const(ctx, names[1], "slope")
        shape = self.shapes[x]
        if slope.size == 1:
            self._activation(ctx, "leaky_relu", float(slope.reshape(-1)[0]))
            return
        form = tuple(shape[1] if axis == 1 else 1 for axis in range(len(shape)))
        padded = (1,) * (len(shape) - slope.ndim) + tuple(slope.shape)
        if slope.ndim > len(shape) or len(shape) < 2 or padded != form:
            ctx.fail(f"slope of shape {tuple(slope.shape)} for an input of shape {shape}",
                     f"a scalar or per-channel slope broadcastable as {form}")
        self.emit(ctx, "prelu", [x, self.new_param(f"{names[1]}_{ctx.name}", slope.reshape(form))], shape)

    # -- reductions and softmax -------------------------------------------------------------------------------

    def _reduce(self, ctx: _Ctx, op: str, axes_input_from: int):
        """ReduceMean / ReduceMax / ReduceSum / ReduceL2 over any axes (an attribute, or from opset
        ``axes_input_from`` an input) of an activation of any rank -> ``op`` with ``axes`` (sorted, non-negative,
        in the input's rank) and ``keepdims``; no axes reduce every axis (an identity with
        ``noop_with_empty_axes``)."""
        names = ctx.inputs()
        if self.opset >= axes_input_from:
            ctx.check_attrs(("keepdims", "noop_with_empty_axes"))
            axes = self._ints(ctx, names[1], "axes") if len(names) > 1 and names[1] else []
        else:
            ctx.check_attrs(("axes", "keepdims"))
            axes = [int(a) for a in ctx.attrs.get("axes", [])]
        x = self.act(ctx, names[0])
        shape = self.shapes[x]
        rank = len(shape)
        if not axes and ctx.attrs.get("noop_with_empty_axes", 0):
            self.alias[ctx.proto.output[0]] = x  # ONNX: no axes and noop_with_empty_axes=1 is an identity
            return
        norm = sorted({a + rank if a < 0 else a for a in axes}) if axes else list(range(rank))
        if len(norm) != len(axes or norm) or any(not 0 <= a < rank for a in norm):
            ctx.fail(f"axes {axes} on a {rank}-D input of shape {shape}",
                     f"distinct axes in [-{rank}, {rank - 1}]")
        keepdims = int(ctx.attrs.get("keepdims", 1))
        if keepdims not in (0, 1):
            ctx.fail(f"keepdims={keepdims}", "keepdims 0 or 1")
        out = tuple(1 if a in norm else d for a, d in enumerate(shape)) if keepdims else \
            tuple(d for a, d in enumerate(shape) if a not in norm)
        if not out:
            ctx.fail(f"a reduction of every axis of {shape} with keepdims=0 (a 0-D result)",
                     "keepdims=1, or a reduction that keeps an axis")
        self.emit(ctx, op, [x], out, axes=tuple(norm), keepdims=keepdims)

    def _op_ReduceMean(self, ctx: _Ctx):
        self._reduce(ctx, "reduce_mean", 18)

    def _op_ReduceMax(self, ctx: _Ctx):
        self._reduce(ctx, "reduce_max", 18)

    def _op_ReduceSum(self, ctx: _Ctx):
        self._reduce(ctx, "reduce_sum", 13)

    def _op_ReduceL2(self, ctx: _Ctx):
        self._reduce(ctx, "reduce_l2", 18)

    def _op_GlobalMaxPool(self, ctx: _Ctx):
        ctx.check_attrs(())
        x = self.act(ctx, ctx.proto.input[0], rank=(4,))
        self.emit(ctx, "global_max_pool", [x], self.shapes[x][:2] + (1, 1))

    def _op_Softmax(self, ctx: _Ctx):
        ctx.check_attrs(("axis",))
        x = self.act(ctx, ctx.proto.input[0])
        shape = self.shapes[x]
        axis = int(ctx.attrs.get("axis", -1 if self.opset >= 13 else 1))
        if not -len(shape) <= axis < len(shape):  # ONNX refuses it; never normalized into another axis
            ctx.fail(f"axis={axis} on a {len(shape)}-D input of shape {shape}",
                     f"an axis in [-{len(shape)}, {len(shape) - 1}]")
        axis = axis + len(shape) if axis < 0 else axis
        # before opset 13 Softmax flattens the axes from ``axis`` on: channels only when H = W = 1
        last = self.opset >= 13 and len(shape) > 2 and 0 < axis  # attention, any axis: passes_tokens
        if not last and (axis != 1 or len(shape) == 3 or (self.opset < 13 and math.prod(shape[2:]) != 1)):
            ctx.fail(f"axis={ctx.attrs.get('axis', 'default')} on an input of shape {shape} (opset {self.opset})",
                     "softmax over the channel axis (1) of (N, C) or NCHW (opset >= 13; before, H = W = 1), or "
                     "over any axis but the batch of a tensor of 3 or more axes (opset >= 13)")
        self.emit(ctx, "softmax", [x], shape, axis=axis)

    def _op_BatchNormalization(self, ctx: _Ctx):
        ctx.check_attrs(("epsilon", "momentum", "spatial", "training_mode", "is_test"))
        if ctx.attrs.get("training_mode", 0):
            ctx.fail("training_mode=1", "inference (training_mode=0)")
        if ctx.attrs.get("spatial", 1) != 1:
            ctx.fail(f"spatial={ctx.attrs['spatial']}", "spatial=1")
        self.single_output(ctx)
        names = ctx.inputs()
        if len(names) != 5:
            ctx.fail(f"{len(names)} inputs", "X, scale, B, mean, var")
        x = self.act(ctx, names[0])
        if len(self.shapes[x]) < 2:
            ctx.fail(f"input of shape {self.shapes[x]}", "(N, C, ...) input")
        c = self.shapes[x][1]
        ps = [self.param(ctx, t, what, (c,)) for t, what in zip(names[1:], ("scale", "B", "mean", "var"))]
        self.emit(ctx, "batch_norm", [x, *ps], self.shapes[x], epsilon=float(ctx.attrs.get("epsilon", 1e-5)))

    def _op_Conv(self, ctx: _Ctx):
        ctx.check_attrs(("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"))
        names = ctx.inputs()
        x = self.act(ctx, names[0], rank=(4,))
        n, c, h, w_in = self.shapes[x]
        weight = self.const(ctx, names[1], "weight W")
        if weight.ndim != 4:
            ctx.fail(f"weight of shape {weight.shape} ({weight.ndim - 2}-D convolution)", "2-D convolution (OIHW)")
        o, i, r, s = weight.shape
        if "kernel_shape" in ctx.attrs and tuple(ctx.attrs["kernel_shape"]) != (r, s):
            ctx.fail(f"kernel_shape={ctx.attrs['kernel_shape']} but the weight is {weight.shape}",
                     "kernel_shape equal to the weight's spatial dims")
        group = ctx.attrs.get("group", 1)
        if group == 1:
            if i != c:
                ctx.fail(f"weight {weight.shape} for {c} input channels", f"weights of shape (O, {c}, R, S)")
        elif group < 1 or c % group or o % group or i != c // group:
            ctx.fail(f"group={group} with {c} input channels, {o} output channels and weight {weight.shape}",
                     "groups dividing the input and output channels, with weights (O, C/group, R, S)")
        stride, dilation = self.pair(ctx, "strides"), self.pair(ctx, "dilations")
        pads = self.pads(ctx, (h, w_in), (r, s), stride, dilation)
        inputs = [x, self.param(ctx, names[1], "weight W", weight.shape)]
        if len(names) > 2 and names[2]:
            inputs.append(self.param(ctx, names[2], "bias B", (o,)))
        oh, ow = (_out_size(ctx, size, k, st, d, pb, pe) for size, k, st, d, pb, pe in
                  zip((h, w_in), (r, s), stride, dilation, pads[:2], pads[2:]))
        self.emit(ctx, "conv2d", inputs, (n, o, oh, ow), stride=stride, padding=pads, dilation=dilation,
                  groups=group)

    def _op_Gemm(self, ctx: _Ctx):
        ctx.check_attrs(("alpha", "beta", "transA", "transB"))
        if ctx.attrs.get("transA", 0):
            ctx.fail("transA=1", "transA=0 (A is the (N, K) activation)")
        names = ctx.inputs()
        a = self.act(ctx, names[0], rank=(2,))
        b = self.const(ctx, names[1], "B")
        if b.ndim != 2 or b.dtype.kind != "f":
            ctx.fail(f"B of shape {b.shape} and dtype {b.dtype}", "a 2-D float32 B")
        alpha, beta = float(ctx.attrs.get("alpha", 1.0)), float(ctx.attrs.get("beta", 1.0))
        trans_b = ctx.attrs.get("transB", 0)
        w_value = (b if trans_b else b.T) * alpha
        m, k = w_value.shape
        if k != self.shapes[a][1]:
            ctx.fail(f"A {self.shapes[a]} times B {b.shape} (transB={trans_b}) do not match", "K of A == K of B")
        w = (self.param(ctx, names[1], "B", b.shape) if trans_b and alpha == 1.0
             else self.new_param(f"{self.resolve(names[1])}_w", w_value))
        inputs = [a, w]
        if len(names) > 2 and names[2] and beta != 0.0:
            cv = self.const(ctx, names[2], "C")
            if cv.dtype.kind != "f" or cv.size not in (1, m) or (cv.ndim == 2 and cv.shape[0] != 1) or cv.ndim > 2:
                ctx.fail(f"C of shape {cv.shape} and dtype {cv.dtype}", f"a float32 bias C of shape ({m},), (1, {m}) "
                         "or a scalar")
            if beta == 1.0 and cv.shape == (m,):
                inputs.append(self.param(ctx, names[2], "C", (m,)))
            else:
                inputs.append(self.new_param(f"{self.resolve(names[2])}_b", np.broadcast_to(cv.reshape(-1) * beta,
                                                                                            (m,))))
        self.emit(ctx, "dense", inputs, (self.shapes[a][0], m))

    def _op_MatMul(self, ctx: _Ctx):
        ctx.check_attrs(())
        names = ctx.inputs()
        if self.resolve(names[0]) in self.shapes and len(self.shapes[self.resolve(names[0])]) >= 3:
            return self._matmul_nd(ctx)  # frontend_movement: MatMul on activations of 3 or more axes
        a = self.act(ctx, names[0], rank=(2,))
        b = self.const(ctx, names[1], "right operand B")
        if b.ndim != 2 or b.dtype.kind != "f" or b.shape[0] != self.shapes[a][1]:
            ctx.fail(f"A {self.shapes[a]} times B {b.shape} ({b.dtype})", "a 2-D (N, K) activation times a float32 "
                     "(K, M) constant")
        w = self.new_param(f"{self.resolve(names[1])}_T", b.T)
        self.emit(ctx, "dense", [a, w], (self.shapes[a][0], b.shape[1]))

    def _op_GlobalAveragePool(self, ctx: _Ctx):
        ctx.check_attrs(())
        x = self.act(ctx, ctx.proto.input[0], rank=(4,))
        self.emit(ctx, "global_avg_pool", [x], self.shapes[x][:2] + (1, 1))

    def _op_AveragePool(self, ctx: _Ctx):
        ctx.check_attrs(("auto_pad", "ceil_mode", "count_include_pad", "dilations", "kernel_shape", "pads",
                         "strides"))
        self._pool(ctx, "avg_pool", count_include_pad=int(ctx.attrs.get("count_include_pad", 0)))

    def _op_MaxPool(self, ctx: _Ctx):
        ctx.check_attrs(("auto_pad", "ceil_mode", "dilations", "kernel_shape", "pads", "storage_order", "strides"))
        if ctx.attrs.get("storage_order", 0) != 0:
            ctx.fail(f"storage_order={ctx.attrs['storage_order']}", "storage_order=0")
        self.single_output(ctx)
        self._pool(ctx, "max_pool")

    def _pool(self, ctx: _Ctx, op: str, **extra):
        x = self.resolve(ctx.proto.input[0])
        if x in self.shapes and len(self.shapes[x]) == 3:
            return self._pool_1d(ctx, op, **extra)
        ceil_mode = int(ctx.attrs.get("ceil_mode", 0))
        if ceil_mode not in (0, 1):
            ctx.fail(f"ceil_mode={ceil_mode}", "ceil_mode 0 or 1")
        if self.pair(ctx, "dilations") != (1, 1):
            ctx.fail(f"dilations={ctx.attrs['dilations']}", "dilations=1")
        x = self.act(ctx, ctx.proto.input[0], rank=(4,))
        n, c, h, w = self.shapes[x]
        if "kernel_shape" not in ctx.attrs:
            ctx.fail("no kernel_shape", "kernel_shape (required)")
        kernel = self.pair(ctx, "kernel_shape")
        stride = self.pair(ctx, "strides")
        pads = self.pads(ctx, (h, w), kernel, stride, (1, 1))
        if any(p >= k for p, k in zip(pads, kernel + kernel)):
            ctx.fail(f"pads {pads} not smaller than kernel_shape {kernel}", "pads < kernel_shape")
        oh, ow = (_out_size(ctx, size, k, st, 1, pb, pe) for size, k, st, pb, pe in
                  zip((h, w), kernel, stride, pads[:2], pads[2:]))
        if ceil_mode:
            oh, ow = pool_out_shape((n, c, h, w), kernel, stride, pads, ceil_mode=True)[2:]
            extra["ceil_mode"] = 1
        self.emit(ctx, op, [x], (n, c, oh, ow), kernel=kernel, stride=stride, padding=pads, **extra)

    def _pool_1d(self, ctx: _Ctx, op: str, **extra):
        """A 1-D pool over L of an (N, C, L) tensor (Next-ViT's spatial reduction) as the 2-D pool of (N, C, 1, L)
        between reshapes (``passes_tokens.movement_views`` folds them into copies)."""
        x = self.act(ctx, ctx.proto.input[0])
        n, c, length = self.shapes[x]
        one = lambda key, default: [int(v) for v in ctx.attrs.get(key, default)]  # noqa: E731
        kernel, stride, dil = one("kernel_shape", []), one("strides", [1]), one("dilations", [1])
        pads = one("pads", [0, 0])
        auto_pad = ctx.attrs.get("auto_pad", b"NOTSET")
        if (len(kernel) != 1 or len(stride) != 1 or dil != [1] or len(pads) != 2 or min(pads) < 0
                or (auto_pad.decode() if isinstance(auto_pad, bytes) else str(auto_pad)) != "NOTSET"
                or int(ctx.attrs.get("ceil_mode", 0))):
            ctx.fail(f"a 1-D pool with kernel_shape {kernel}, strides {stride}, pads {pads}, dilations {dil}",
                     "one kernel size, stride and pad pair, dilation 1, explicit pads, ceil_mode 0")
        if max(pads) >= kernel[0]:
            ctx.fail(f"pads {pads} not smaller than kernel_shape {kernel}", "pads < kernel_shape")
        out_len = _out_size(ctx, length, kernel[0], stride[0], 1, pads[0], pads[1])
        name, out = ctx.name, ctx.proto.output[0]
        self._emit_to(ctx, f"{out}.2d_in", f"{name}.to_2d", "reshape", [x], (n, c, 1, length),
                      shape=(n, c, 1, length))
        self._emit_to(ctx, f"{out}.2d", name, op, [f"{out}.2d_in"], (n, c, 1, out_len), kernel=(1, kernel[0]),
                      stride=(1, stride[0]), padding=(0, pads[0], 0, pads[1]), **extra)
        self._emit_to(ctx, out, f"{name}.to_1d", "reshape", [f"{out}.2d"], (n, c, out_len), shape=(n, c, out_len))

    def _op_Flatten(self, ctx: _Ctx):
        """axis 1 of NCHW -> ``flatten``; of (N, C) the identity; any other -> ``reshape`` to
        (prod(dims before axis), prod(dims from axis))."""
        ctx.check_attrs(("axis",))
        x = self.act(ctx, ctx.proto.input[0])
        shape = self.shapes[x]
        rank = len(shape)
        axis = int(ctx.attrs.get("axis", 1))
        axis = axis + rank if axis < 0 else axis
        if not 0 <= axis <= rank:
            ctx.fail(f"axis={ctx.attrs.get('axis', 1)} on a {rank}-D input", f"an axis in [-{rank}, {rank}]")
        if axis == 1 and rank == 4:
            n, c, h, w = shape
            self.emit(ctx, "flatten", [x], (n, c * h * w))
            return
        self._reshape_to(ctx, x, (math.prod(shape[:axis]), math.prod(shape[axis:])))

    def _op_Reshape(self, ctx: _Ctx):
        names = ctx.inputs()
        if self.opset >= 5:
            ctx.check_attrs(("allowzero",))
            target = self.const(ctx, names[1], "shape")
            if target.dtype.kind not in "iu" or target.ndim != 1:
                ctx.fail(f"shape of dtype {target.dtype} and rank {target.ndim}", "a 1-D int64 shape")
        else:  # Reshape-1: the shape is an attribute
            ctx.check_attrs(("shape", "consumed_inputs"))
            target = np.array(ctx.attrs.get("shape", []), dtype=np.int64)
        target = [int(d) for d in target]
        if ctx.attrs.get("allowzero", 0) and 0 in target:
            ctx.fail(f"allowzero=1 with shape {target}", "allowzero=0 (0 copies the input dim)")
        x = self.act(ctx, names[0])
        shape = self.shapes[x]
        if target.count(-1) > 1 or any(d < -1 for d in target):
            ctx.fail(f"shape {target}", "positive dims, 0 (copy the input dim) and at most one -1")
        out = []
        for axis, d in enumerate(target):
            if d == 0:
                if axis >= len(shape):
                    ctx.fail(f"shape {target} copies axis {axis} of a {len(shape)}-D input", "0 at existing axes")
                d = shape[axis]
            out.append(d)
        total = math.prod(shape)
        if -1 in out:
            known = math.prod(d for d in out if d != -1)
            if known == 0 or total % known:
                ctx.fail(f"shape {target} for an input of shape {shape}", "a shape with the same element count")
            out[out.index(-1)] = total // known
        if math.prod(out) != total:
            ctx.fail(f"shape {target} (resolved {tuple(out)}) for an input of shape {shape}",
                     "a shape with the same element count")
        self.emit(ctx, "reshape", [x], tuple(out), shape=tuple(out))

    def _op_Concat(self, ctx: _Ctx):
        """-> ``concat`` along any axis; constant inputs (a ViT's class token, ``Expand`` of a (1, 1, C) param)
        become params, as long as one input is an activation."""
        ctx.check_attrs(("axis",))
        names = ctx.inputs()
        srcs = [self.resolve(t) for t in names]  # not all constants: those were folded
        shapes = [tuple(self.consts[s].shape) if s in self.consts else self.shapes[s] for s in srcs]
        rank = len(shapes[0])
        if "axis" not in ctx.attrs:
            ctx.fail("no axis", "an axis (required)")
        axis = int(ctx.attrs["axis"])
        axis = axis + rank if axis < 0 else axis
        if not 0 <= axis < rank:
            ctx.fail(f"axis={ctx.attrs['axis']} on {rank}-D inputs", f"an axis in [-{rank}, {rank - 1}]")
        if any(len(s) != rank or s[:axis] + s[axis + 1:] != shapes[0][:axis] + shapes[0][axis + 1:]
               for s in shapes):
            ctx.fail(f"inputs of shapes {shapes}", f"inputs that differ only along axis {axis}")
        xs = []
        for t, src in zip(names, srcs):
            if src not in self.consts:
                xs.append(src)
                continue
            value = self.consts[src]
            if value.dtype.kind != "f":
                ctx.fail(f"constant input {t!r} has dtype {value.dtype}", "float constants")
            xs.append(self.param(ctx, t, "constant input", value.shape) if value.dtype == np.float32
                      else self.new_param(f"{src}_{ctx.name}", value))
        out = shapes[0][:axis] + (sum(s[axis] for s in shapes),) + shapes[0][axis + 1:]
        self.emit(ctx, "concat", xs, out, axis=axis)

    # -- attribute helpers ------------------------------------------------------------------------------------

    def pair(self, ctx: _Ctx, key: str) -> tuple:
        value = ctx.attrs.get(key, [1, 1])
        if len(value) != 2 or any(int(v) < 1 for v in value):
            ctx.fail(f"{key}={list(value)}", f"2 positive {key} (2-D operators)")
        return tuple(int(v) for v in value)

    def pads(self, ctx: _Ctx, size: tuple, kernel: tuple, stride: tuple, dilation: tuple) -> tuple:
        """(top, left, bottom, right) from ``pads`` or ``auto_pad``."""
        auto_pad = ctx.attrs.get("auto_pad", b"NOTSET")
        auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else str(auto_pad)
        if auto_pad == "NOTSET":
            pads = ctx.attrs.get("pads", [0, 0, 0, 0])
            if len(pads) != 4 or any(int(p) < 0 for p in pads):
                ctx.fail(f"pads={list(pads)}", "4 non-negative pads [top, left, bottom, right]")
            return tuple(int(p) for p in pads)
        if any(int(p) for p in ctx.attrs.get("pads", [])):
            ctx.fail(f"both auto_pad={auto_pad} and pads={list(ctx.attrs['pads'])}", "one of them")
        if auto_pad == "VALID":
            return (0, 0, 0, 0)
        if auto_pad not in ("SAME_UPPER", "SAME_LOWER"):
            ctx.fail(f"auto_pad={auto_pad!r}", "auto_pad NOTSET, SAME_UPPER, SAME_LOWER or VALID")
        if dilation != (1, 1):  # onnxruntime rejects it too, so nothing could check our padding
            ctx.fail(f"auto_pad={auto_pad} with dilations={list(dilation)}",
                     "SAME_* with dilations 1, or explicit pads")
        begin, end = [], []
        for n, k, st, d in zip(size, kernel, stride, dilation):
            total = max((-(-n // st) - 1) * st + (k - 1) * d + 1 - n, 0)
            small, big = total // 2, total - total // 2
            begin.append(small if auto_pad == "SAME_UPPER" else big)
            end.append(big if auto_pad == "SAME_UPPER" else small)
        return (*begin, *end)


def _out_size(ctx: _Ctx, size: int, kernel: int, stride: int, dilation: int, pad_begin: int, pad_end: int) -> int:
    span = (kernel - 1) * dilation + 1
    if size + pad_begin + pad_end < span:
        ctx.fail(f"a window of {span} over an input of {size} padded by {pad_begin}+{pad_end}",
                 "inputs at least as large as the (dilated) kernel")
    return (size + pad_begin + pad_end - span) // stride + 1


def _evaluate(proto: onnx.NodeProto, feeds: dict, opset: int) -> list:
    """One node run by onnx's ReferenceEvaluator at the model's opset."""
    from onnx import helper
    from onnx.reference import ReferenceEvaluator
    inputs = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(np.asarray(v).dtype), None)
              for k, v in feeds.items()]
    outputs = [helper.make_value_info(t, onnx.TypeProto()) for t in proto.output if t]
    node = onnx.NodeProto()
    node.CopyFrom(proto)
    graph = helper.make_graph([node], "fold", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    values = ReferenceEvaluator(model).run(None, feeds)
    it = iter(values)
    return [next(it) if t else None for t in proto.output]


def _attrs(proto: onnx.NodeProto) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in proto.attribute}


# The ONNX operators with a handler (``_op_<Type>`` here or in a mixin), for error messages and the README.
SUPPORTED_OPS = tuple(sorted(name[4:] for name in dir(_Converter) if name.startswith("_op_")))
