"""What the templates share: the ``Template`` record and its workload arguments (``WorkloadArg``), workload
labels, the epilogue a graph node fuses (``node_epilogue``), and the convolution family's building blocks --
its workload (``Conv2dWorkload``), NumPy reference and random inputs, the operands' declarations by scope,
arithmetic in the storage type, the local-memory input tile, split-K sums, the tile store, work-group fitting
and the window features of the cost model. conv2d, depthwise conv2d, Winograd, dense, matmul and the glue
kernels build on these; the registry (``tuner.templates``) imports the templates, which import only this."""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import operator
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from typing import Callable

import numpy as np

from tuner.errors import TunerError
from tuner.ir.activations import apply_ir, apply_numpy, apply_prelu_ir, apply_prelu_numpy, canonical
from tuner.ir.buffer import buffer
from tuner.ir.dtype import DType
from tuner.ir.expr import Broadcast, Cast, ExtractLane, Ramp, as_expr, call, const, max_, min_, select
from tuner.ir.layouts import apply_patch_view, check_out_view, patch_position, patch_stored_shape


@dataclass(frozen=True)
class WorkloadArg:
    """One workload field as a command-line option ``--<name>`` (``tuner op / tune-op / space``): ``kind`` says
    how its text parses -- ``shape`` (comma-separated integers), ``ints`` (1 or ``lengths`` integers; one stays an
    int), ``int``, ``flag``, ``activation`` (a fused activation spec), ``dtype`` (the storage dtype)."""
    name: str
    kind: str
    metavar: str = ""
    help: str = ""
    required: bool = False
    lengths: tuple = (1, 2)
    choices: tuple = ()  # a ``str`` field's allowed values

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def parse(self, text):
        """The field's value from the option's text (argparse already parsed flags, activations, dtypes)."""
        if self.kind not in ("shape", "ints", "int"):
            return text
        try:
            values = tuple(int(x) for x in str(text).split(","))
        except ValueError:
            raise TunerError(f"{self.flag} must be comma-separated integers, e.g. 1,64,56,56; got {text!r}") from None
        if self.kind == "int" or (self.kind == "ints" and len(values) == 1):
            if len(values) != 1:
                raise TunerError(f"{self.flag} takes one integer; got {text!r}")
            return values[0]
        if self.kind == "ints" and len(values) not in self.lengths:
            counts = ", ".join(map(str, self.lengths[:-1])) + f" or {self.lengths[-1]}"
            raise TunerError(f"{self.flag} takes {counts} integers; got {text!r}")
        return values


# the fused epilogue and storage type: every template's workload has these fields
EPILOGUE_ARGS = (
    WorkloadArg("bias", "flag", help="fuse a bias add"),
    WorkloadArg("activation", "activation", "ACT", "fused activation: none, relu, relu6, hardswish, sigmoid, silu, "
                "leaky_relu(0.1), ... (default none)"),
    WorkloadArg("dtype", "dtype", help="storage dtype (arithmetic is float32 unless the compute knob says half)"))
# a 2-D window's geometry: convolution-like templates share these fields
WINDOW_ARGS = (
    WorkloadArg("stride", "ints", "S[,S]"),
    WorkloadArg("padding", "ints", "P[,P[,P,P]]", "all, (h,w) or (top,left,bottom,right)", lengths=(1, 2, 4)),
    WorkloadArg("dilation", "ints", "D[,D]"))
PAD_MODES = ("zeros", "reflect", "edge")  # what a convolution's padding reads (``Conv2dWorkload.pad_mode``)
PAD_MODE_ARG = WorkloadArg("pad_mode", "str", "MODE", "what the padding reads: zeros (default), reflect or edge",
                           choices=PAD_MODES)


@dataclass(frozen=True)
class Template:
    name: str
    workload: type  # frozen dataclass: the canonical key (``.key()``, ``.flops``, ``.out_shape``)
    config: type  # frozen dataclass: one value per knob of the search space
    build: Callable  # (workload, config) -> Kernel | Program
    reference: Callable  # (workload, inputs: dict) -> float64 ndarray of the output
    random_inputs: Callable  # (workload, rng) -> {param name: array} (random, never zeros)
    fallback: Callable  # (workload, DeviceInfo) -> config
    space_vars: Callable  # (workload) -> {name: value} the search space's constraints may use
    variables: dict  # name -> meaning, of what space_vars returns (documents the constraints' vocabulary)
    output: str = "Y"
    space_file: str | None = None  # search-space name or path when not the template's own name
    features: Callable | None = None  # (space_vars, knob values) -> {name: number}: what a config implies, for
    # the cost model (work per work-item, work-group size, bytes read per multiply-add, registers, ...)
    describe: Callable | None = None  # (workload) -> short text for labels where the generic label of the
    # workload's fields (workload_label: "64->64 3x3 p1 @56x56 +relu") does not read well (matmul)
    model_knobs: dict = field(default_factory=dict)  # knobs a model pins so that neighbouring kernels agree
    workload_args: tuple = ()  # WorkloadArg per workload field the command line sets
    graph_ops: tuple = ()  # the graph operators (``Node.op``: "conv2d", "dense") whose nodes ``lower`` may take
    scope_inputs: dict = field(default_factory=lambda: {"input": "X"})  # scope role -> the kernel input whose
    # activation's scope the role takes in a model (plan.plan_storage); a role not named (conv2d's weights) is
    # the template's to choose. matmul: {"input": "A", "weight": "Bm"}, both activations
    lower: Callable | None = None  # (LowerCtx, node, ins) -> (workload, {kernel param: tensor or param name},
    # {new param name: array}), or None when the template does not take this node (another one is asked);
    # a ValueError names what is wrong with a node it takes (the planner adds the node's name)
    reduction: Callable | None = None  # (workload) -> terms in one output's sum (conv2d: C/G x R x S), which
    # the tolerance of half accumulation grows with (``tolerance``); None: the template sums nothing in half
    side_outputs: tuple = ()  # kernel outputs beside Y that a graph node's further outputs bind to, in order
    # (depthwise_conv2d: "Q", its row sums); a template without them does not take a node with several outputs

    def label(self, workload) -> str:
        """The workload in a few words (``64->128 3x3 s2 p1 @56x56 +bias+relu``): the template's ``describe``,
        else the generic label of its fields (``workload_label``). The one label of a workload, in task names,
        compile summaries, ``tuner logs`` and reports."""
        if self.describe is not None:
            return self.describe(workload)
        return workload_label(self.name, workload.key()).split(" ", 1)[-1]

    def key_label(self, key: dict) -> str:
        """``label`` of a logged workload key; a key this template cannot rebuild gets the generic label."""
        try:
            return self.label(self.workload(**{k: v for k, v in key.items() if k != "op"}))
        except (TypeError, ValueError):
            return workload_label(self.name, key).split(" ", 1)[-1]

    def space(self, workload=None, device=None, **fixed):
        """The declarative search space (``search_space/<name>.toml``); given a workload and a device
        (DeviceInfo), the bound space of its valid configs, with the storage dtype fixed to the workload's
        and any other knobs given in ``fixed`` (e.g. ``input_scope="texture"``)."""
        from tuner.search_space import load_space
        space = load_space(self.space_file or self.name, {f.name for f in dataclasses.fields(self.config)}, set(self.variables))
        if workload is None:
            return space
        info = getattr(device, "info", device)
        return space.bind(self.space_vars(workload), info, {"dtype": workload.dtype, **fixed})

    def fallback_with(self, workload, device, **fixed):
        """The fallback config for ``device`` with ``fixed`` knobs applied (scopes, a model's pinned layout);
        if that breaks a constraint of the space, a valid config drawn with seed 0 instead."""
        cfg = dataclasses.replace(self.fallback(workload, getattr(device, "info", device)), **fixed)
        space = self.space(workload, device, **fixed)
        if not space.violations(self.config_values(workload, cfg)):
            return cfg
        return self.make_config(space.sample(np.random.default_rng(0)))

    def make_config(self, values: dict):
        """A config from a search-space assignment (the task knob ``dtype`` belongs to the workload)."""
        return self.config(**{k: v for k, v in values.items() if k != "dtype"})

    def config_values(self, workload, config) -> dict:
        return {"dtype": workload.dtype, **dataclasses.asdict(config)}

    def storage_tolerance(self, workload) -> float:
        """Max relative error of float arithmetic on the workload's storage: float32 1e-4, float16 1e-2 (its
        output's rounding alone reaches ~5e-4)."""
        return 1e-2 if workload.dtype == "float16" else 1e-4

    def tolerance(self, workload, config=None) -> float:
        """Max relative error accepted against the reference, for ``config``'s arithmetic (its ``compute`` knob;
        None or a template without one: float): ``arithmetic_tolerance`` of the storage's tolerance, the
        precision of products and sums, and the length of one output's sum (``reduction``)."""
        compute = getattr(config, "compute", "float32")
        length = self.reduction(workload) if self.reduction is not None else 1
        bound = output_bound(getattr(workload, "activation", "none"))
        # a bounded activation (relu6 clips at 6) shrinks the reference's largest magnitude, not the sums'
        # rounding: the sums of the check's random normal inputs reach about 3 sqrt(length)
        magnify = 1.0 if bound is None else max(1.0, 3 * math.sqrt(length) / bound)
        return arithmetic_tolerance(self.storage_tolerance(workload), compute, length, magnify)

    def expected(self, ref) -> dict:
        """``{kernel output: float64 array}`` of what ``reference`` returned: one array is ``output``'s; a
        workload that writes two outputs (depthwise ``row_sums``: Y and Q) returns a dict of them."""
        return dict(ref) if isinstance(ref, dict) else {self.output: ref}

    def check(self, workload, outputs: dict, inputs: dict) -> float:
        """Max error relative to the reference's largest magnitude, the worst of the outputs."""
        expected = self.expected(self.reference(workload, inputs))
        rel, wrong = output_error({k: outputs[k] for k in expected}, expected)
        if wrong:
            raise TunerError(f"{self.name}: {wrong}")
        return rel


def output_error(got: dict, ref: dict) -> tuple:
    """``(max relative error, "")`` of the outputs ``got`` against the float64 ``ref`` (each relative to its
    reference's largest magnitude, the worst taken), or ``(None, why)`` when an output's shape differs."""
    worst = 0.0
    for name, r in ref.items():
        g = np.asarray(got[name], dtype=np.float64)
        if g.shape != r.shape:
            return None, f"output shape {g.shape} vs reference {r.shape}" + (f" ({name})" if len(ref) > 1 else "")
        e = float(np.abs(g - r).max() / max(np.abs(r).max(), 1e-30))
        worst = e if e != e or not e <= worst else worst  # NaN: kept, a wrong answer
    return worst, ""


UNIT_ROUNDOFF = {"float32": 2.0 ** -24, "float16": 2.0 ** -11}  # half's 11-bit significand: 4.9e-4
COMPUTE = {"float32": ("float32", "float32"), "half": ("float16", "float32"), "half_acc": ("float16", "float16")}
# the ``compute`` knob: (precision of products, of accumulators)


def output_bound(activation: str) -> float | None:
    """The largest magnitude a fused activation lets out (relu6: 6; sigmoid, hardsigmoid, tanh: 1; clip: its
    bounds), or None when it does not bound its output."""
    from tuner.ir.activations import parse
    try:
        name, p = parse(activation)
    except ValueError:
        return None
    if name == "relu6":
        return 6.0
    if name in ("sigmoid", "hardsigmoid", "tanh"):
        return 1.0
    if name == "clip" and all(math.isfinite(x) for x in p):
        return max(abs(p[0]), abs(p[1]), 1e-3)
    return None


def arithmetic_tolerance(storage: float, compute: str, length: int, magnify: float = 1.0) -> float:
    """The max relative error (against the largest magnitude of the float64 reference) a correct kernel may
    reach: the storage's tolerance ``storage``, or, when the arithmetic is less precise, 4 unit roundoffs of
    the products' type plus 2 of the accumulators' times the square root of ``length``, the terms one output
    sums. A sum's rounding errors add up like a random walk over partial sums that grow like sqrt(k), while the
    sum itself grows like sqrt(length): relative to it, the error of half accumulators grows like
    u * sqrt(length). Measured on Intel's CPU runtime (random normal inputs, max over the output, conv2d):
    ``half_acc`` 3e-3 at 144 terms, 6e-3 at 576, 1.3e-2 at 1152 and 2304, about 0.55 u sqrt(length) -- the
    bound is 3.6x that; ``half`` (half products, float sums) ~5e-4 at any length, as float arithmetic.
    ``magnify``: how much larger the sums are than the output's largest magnitude (a clipping activation's:
    MobileNetV2's 96-channel 1x1 conv with relu6 reaches 9.6e-3 in half sums, 4x its unclipped error)."""
    if compute not in COMPUTE:
        raise ValueError(f"compute {compute!r}: one of {', '.join(COMPUTE)}")
    mult, acc = COMPUTE[compute]
    if compute == "float32":
        return storage  # float arithmetic: the storage's rounding dominates
    return max(storage, magnify * (4 * UNIT_ROUNDOFF[mult] + 2 * UNIT_ROUNDOFF[acc] * math.sqrt(max(length, 1))))


def shape_text(shape) -> str:
    return "x".join(map(str, shape))


def epilogue_text(wl) -> str:
    """`` +bias +relu +res f16``: what a workload fuses, and its storage type when not float32."""
    parts = [" +bias" if wl.bias else "", f" +{wl.activation}" if wl.activation != "none" else "",
             " +res" if getattr(wl, "residual", False) else "",
             "" if not getattr(wl, "in_scale", False) else " +row scale" if getattr(wl, "scale_rows", False)
             else " +scale",
             " +in norm" if getattr(wl, "in_norm", 0) else "", " +in add" if getattr(wl, "in_add", ()) else "",
             " f16" if wl.dtype == "float16" else ""]
    return "".join(parts)



# ---- the one workload label: tasks, compile summaries, logs, reports ----

def _dims(xs) -> str:
    return "x".join(str(x) for x in xs)


def _pair(p, default) -> str | None:
    """``s2`` for (2, 2), ``s(2,1)`` for (2, 1), None for the default."""
    p = tuple(p) if isinstance(p, (list, tuple)) else (p, p)
    if all(v == default for v in p):
        return None
    return str(p[0]) if len(set(p)) == 1 else "(" + ",".join(map(str, p)) + ")"


def _padding(p) -> str | None:
    p = tuple(p) if isinstance(p, (list, tuple)) else (p,) * 4
    if not any(p):
        return None
    if len(set(p)) == 1:
        return str(p[0])
    if len(p) == 4 and p[:2] == p[2:]:
        return f"({p[0]},{p[1]})"  # symmetric: height, width
    return "(" + ",".join(map(str, p)) + ")"


_KNOWN = {"op", "data", "kernel", "weight", "stride", "padding", "dilation", "groups", "dtype", "bias",
          "activation", "residual", "in_scale", "scale_rows"}


def workload_label(template: str, wl: dict) -> str:
    """A short readable workload name that still tells workloads apart, defaults left out:
    ``conv2d 64->128 3x3 s2 p1 @56x56``, ``depthwise_conv2d 32 3x3 p1 @112x112 +bias+relu6``,
    ``dense 512->1000``. Fields this function does not know are appended as ``name=value``."""
    parts = [template]
    data = wl.get("data")
    if "kernel" in wl and data and len(data) == 4 and len(wl["kernel"]) == 4:
        n, c, h, w = data
        o, _, r, s = wl["kernel"]
        parts.append(str(c) if template.startswith("depthwise") and o == c else f"{c}->{o}")
        parts.append(f"{r}x{s}")
        for prefix, key, default in (("s", "stride", 1), ("d", "dilation", 1)):
            v = _pair(wl.get(key, default), default)
            if v:
                parts.append(prefix + v)
        pad = _padding(wl.get("padding", 0))
        if pad:
            parts.append("p" + pad)
        if wl.get("groups", 1) != 1:
            parts.append(f"g{wl['groups']}")
        parts.append(f"@{h}x{w}")
    elif "weight" in wl and data and len(data) == 2:
        n, k = data
        parts.append(f"{k}->{wl['weight'][0]}")
    else:
        n = None
        if data is not None:
            parts.append(_dims(data))
    if n not in (None, 1):
        parts.append(f"n{n}")
    if wl.get("dtype", "float32") != "float32":
        parts.append(str(wl["dtype"]).replace("float", "fp"))
    epilogue = [e for e, on in (("bias", wl.get("bias")), ("res", wl.get("residual")),
                                ("scale", wl.get("in_scale") and not wl.get("scale_rows")),
                                ("row scale", wl.get("scale_rows"))) if on]
    if wl.get("activation", "none") not in ("none", None):
        epilogue.append(str(wl["activation"]))
    if epilogue:
        parts.append("+" + "+".join(epilogue))
    parts += [f"{k}={json.dumps(v, separators=(',', ':'))}" for k, v in wl.items() if k not in _KNOWN]
    return " ".join(parts)


def node_epilogue(ctx, node, norm_sums=None) -> tuple:
    """What a graph node fuses, for a template's ``lower``: ``(fields, inputs)`` -- the workload fields every
    template has (``dtype`` of the plan, ``bias``, ``activation``) and the kernel inputs they bring (``B``: the
    bias param; ``Res``: the residual's tensor in the plan, when the node adds one: ``node.attrs["residual"]``).
    ``norm_sums``: an ``in_norm`` convolution's weight sums, packed into B after the biases and any PReLU slopes
    (``bias_length``)."""
    g, a = ctx.graph, node.attrs
    bias = next((t for t in node.inputs[2:] if t in g.params
                 and t not in (a.get("slope"), a.get("norm_affine"), a.get("out_norm_affine"),
                               a.get("residual_scale"), a.get("response_affine"), *a.get("gate", ()))), None)
    fields = dict(dtype=ctx.dtype, bias=bias is not None, activation=a.get("activation", "none"))
    inputs = {}
    tails = ([g.params[a["slope"]]] if a.get("activation") == "prelu" else []) + \
        ([norm_sums] if norm_sums is not None else [])
    if tails:  # per-channel slopes, weight sums: packed after the bias in B (``bias_length``)
        packed = packed_after_biases(g.params[bias] if bias is not None else None, *tails)
        bias = f"{node.name}.bias_norm" if norm_sums is not None else f"{node.name}.bias_prelu"
        ctx.extra[bias] = packed
        fields["bias"] = True
    if bias is not None:
        inputs["B"] = bias
    if a.get("residual") is not None:
        inputs["Res"] = ctx.packed(a["residual"])
    if a.get("in_scale") is not None:  # only the templates whose ``lower`` takes ``in_scale`` read it
        inputs["S"] = ctx.packed(a["in_scale"])
    return fields, inputs


# -- the convolution family --------------------------------------------------------------------------------

IN_READS = ("copy", "nearest", "max", "avg")  # how a part of a convolution's input is read (``in_read``)
MAX_IN_PARTS = 4  # X, X1, X2, X3


def _listed(v):
    """A workload field as JSON keeps it: tuples as lists."""
    return list(v) if isinstance(v, tuple) else v


def in_read_text(parts) -> str:
    """``in_read`` in a workload key: the parts' fields comma-separated, the parts by semicolons
    (``8,24,24,copy,1,1,1,1;16,12,12,nearest,2,2,1,1``; a part read at a channel offset of a larger tensor adds
    the offset and that tensor's channels) -- a log record's workload fields are numbers, strings or lists of
    numbers."""
    return ";".join(",".join(str(v) for v in (p if p[8:] != (0, p[0]) else p[:8])) for p in parts)


def _as_pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


@dataclass(frozen=True)
class Conv2dWorkload:
    """The canonical key of one convolution: shapes, stride, padding (top, left, bottom, right), dilation,
    groups, storage dtype and fused epilogue."""
    data: tuple  # N, C, H, W
    kernel: tuple  # O, C/groups, R, S
    stride: tuple = (1, 1)
    padding: tuple = (0, 0, 0, 0)
    dilation: tuple = (1, 1)
    groups: int = 1
    dtype: str = "float32"
    bias: bool = False
    activation: str = "none"
    residual: bool = False
    residual_scale: bool = False  # with residual: the residual times a per-channel constant ``Rs`` (float32, (OB, 4))
    # as it is added -- PoolFormerV2's ``res_scale``, ``x * r + ls * mlp(x)`` (``passes._scaled_residual``); in the
    # key only when set
    in_scale: bool = False  # the input read times a per-(n, channel) gate S (N, C, 1, 1): squeeze-excite's x * s
    scale_rows: bool = False  # with in_scale: S is (N, C, H, 1), a gate a channel and input row (timm's MobileViTv2:
    # relu(values) times the context over the patches, one a patch position); in the key only when set
    in_norm: float = 0.0  # > 0: the input layer-normalized over its channels at each pixel (this epsilon) as it is
    # read -- a LayerNorm over channels before a 1x1 convolution, its affine folded into the weights and bias
    # (``passes_layer_norm``). The statistics are summed in the reduction loop itself; the epilogue is
    # ``rstd * (acc - mean * U[o]) + bias``, U the weights' sums over the input channels, stored in B after the
    # biases (``bias_length``). 1x1, stride 1, no padding, groups 1; in the key only when set
    norm_partials: int = 0  # > 0, with in_norm: the input GroupNorm(1)-normalized over its whole image instead, the
    # statistics read from ``P`` (float32, (N * norm_partials * 2, 4): per image that many chunks' float4 sums of
    # d = x - K and d^2, K the image's first element; ``group_norm``'s ``stats``); in the key only when set
    pad_mode: str = "zeros"  # what the padding reads: zeros, or the input reflected or its edge repeated (a
    # reflection or edge Pad before the convolution, read in place: no kernel runs for it)
    in_group_norm: tuple = ()  # (groups, chunks, epsilon, activation): the input group-normalized as it is read --
    # each (image, group of C / groups channels) over its channels and pixels (groups = C: an InstanceNorm), then its
    # affine and the activation, act((x - mean) * rstd * gamma + beta), before any padding of zeros (a GroupNorm or
    # InstanceNorm -> ReLU / SiLU read only by convolutions, ``passes_layer_norm``). The statistics come from ``Q``
    # (float32, ``reduction.chunk_statistics``: per unit that many chunks' float4 sums of d = x - K and d^2;
    # ``group_norm``'s ``stats``), gamma and beta from ``A`` (float32, (2 * C4, 4)). Groups of whole blocks of 4
    # channels, of one channel each, or one group; in the key when set
    in_response: float = 0.0  # > 0, with in_scale: the gate computed from S as it is read -- S holds a global
    # response norm's statistics G (each channel's L2 norm over its map) and the gate is ``c + gamma * G / (mean_c(G)
    # + eps)`` (this eps), gamma and c from ``Rg`` (float32, (2 * C4, 4)): ConvNeXtV2's GRN, whose gate needs the
    # mean over the channels, with no kernel for it (``passes_response_norm.response_gates_in_convs``); each
    # work-item sums G's C4 blocks first. Not with scale_rows; in the key when set
    in_gate: int = 0  # S > 0, with in_scale: the gate computed from S by every work-group before its reduction loop
    # -- S holds the row sums (N, C, H, 1) of the input's maps (its depthwise producer's ``row_sums``) and the gate
    # is ``se_gate``'s with S squeeze channels: the maps' means, the squeeze (W1, B1, ``gate_act1``), the excite (W2,
    # B2, ``gate_activation``), kept in local memory (``passes_se.gates_in_readers``: no launch for the gate). Not
    # with scale_rows, in_response or any norm as read; in the key when set
    gate_act1: str = "none"  # with in_gate: the squeeze's activation (``se_gate``'s act1); in the key with in_gate
    gate_activation: str = "none"  # with in_gate: the gate's activation (Sigmoid, HardSigmoid); in the key with it
    in_layer_norm: float = 0.0  # > 0: the input layer-normalized over its channels at each pixel (this epsilon) as it
    # is read, (x - mean) * rstd * gamma + beta before any padding of zeros, gamma and beta from ``A`` (float32,
    # (2 * C4, 4)) -- a LayerNorm over channels read by convolutions of any window (ConvNeXt's, EdgeNeXt's and
    # PoolFormerV2's downsampling layers: ``passes_layer_norm.norms_applied_as_read``). The work-item sums the
    # channels of every input pixel its windows read before its reduction loop (``conv2d_nchw4c.pixel_norms``): no
    # kernel and no statistics tensor. Groups 1, zero padding; in the key when set
    out_norm: tuple = ()  # (groups, epsilon): the output group-normalized in the epilogue -- each (image, group of
    # O / groups channels) over its channels and pixels (groups = O: an InstanceNorm), the statistics summed over a
    # work-group that holds the group's whole planes (the space), then gamma and beta from ``Na`` (float32,
    # (2 * OB, 4)), then ``residual`` and ``activation``: act(norm(conv(x) + bias) * gamma + beta + Res), a
    # GroupNorm or InstanceNorm in the launch of the convolution it reads (``passes_layer_norm.norms_into_convs``).
    # Groups of one or two channels, of whole blocks of 4, or one group of whole blocks; in the key when set
    out_stats: int = 0  # the groups of a norm of the output whose statistics this launch writes too, to ``St``
    # (float32, (N * units * 2, 4): ``group_norm``'s ``stats`` with one chunk a unit, ``reduction.unit_statistics``)
    # -- 1 (GroupNorm(1): a unit an image; True reads as 1), O (an InstanceNorm: a block of 4 channels, a lane
    # each), or groups of whole blocks of 4 -- computed in the epilogue: each work-group's (count, mean, M2) merged
    # by the last one to finish (``reduction.last_group_statistics``, ``last_group_unit_statistics``), so that no
    # launch is left for them (``passes_layer_norm.norm_statistics_into_producers``). O a multiple of 4, the output
    # written whole (no out_view, side_copy or shuffle_view, no out_norm). Not in the key: the loop nest is the
    # same, and a record of the workload without it applies
    out_view: tuple = ()  # (offset, channels): write channels [offset, offset + O) of a larger output (a concat's);
    # not in the key: the loop nest is the same, a record of the workload without it applies
    side_copy: tuple = ()  # (source shape, channels, offset, source scope): the same launch also writes the channel
    # gather ``channels`` of a source tensor (same N, H, W as the output) at channel ``offset`` of the output -- a
    # concat's other part (ShuffleNetV2's passed-through half, ``plan.views``); not in the key either
    shuffle_view: tuple = ()  # (bh, bw, top, left, out_h, out_w): write the DCR depth_to_space of the output -- its
    # bh * bw phases interleaved, the window of out_h x out_w from (top, left) -- instead of the output (a phase
    # convolution's or a PixelShuffle's interleave, ``plan.views``); not in the key either
    patch_view: tuple = ()  # (unfold or fold, ph, pw, patches a row): write each output pixel where MobileViT's
    # unfold into (patch position, patch) or its fold back into the image puts it (``ir.layouts.patch_position``):
    # no copy kernel for either; not in the key either
    plain_input: bool = False  # X is the model input's row-major NCHW host buffer, read in place (no relayout
    # kernel: ``tuner.plan.io_views``); a pixel is a gather of 4 planes. Not in the key: the loop nest is the same
    plain_output: bool = False  # Y is the model output's row-major NCHW host buffer, each pixel scattered to its 4
    # planes (no relayout kernel after it); not in the key either
    in_read: tuple = ()  # the input as channel parts, each read through a view of its own tensor, so that no kernel
    # runs for the concat, resize or pool between (``tuner.plan.input_views``): per part (channels, source H,
    # source W, kind, kh, kw, sh, sw[, at, of]) with kind ``copy`` (as is), ``nearest`` (source[h // kh, w // kw]:
    # an integer-factor nearest upsample; sh = sw = 1) or ``max`` / ``avg`` (a kh x kw pool of stride sh x sw
    # over the source, no padding), the part's channels at channel ``at`` (a multiple of 4; default 0) of a source
    # of ``of`` channels (default the part's: a channel slice read in place). The first part is X, the next X1,
    # X2, X3; every part but the last holds a multiple of 4 channels (whole RGBA pixels). In the key when set

    def __post_init__(self):
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731
        set_("data", tuple(int(x) for x in self.data))
        set_("kernel", tuple(int(x) for x in self.kernel))
        set_("stride", _as_pair(self.stride))
        set_("dilation", _as_pair(self.dilation))
        p = self.padding
        p = (p, p, p, p) if isinstance(p, int) else tuple(p)
        set_("padding", p if len(p) == 4 else (p[0], p[1], p[0], p[1]))
        if len(self.data) != 4 or len(self.kernel) != 4:
            raise ValueError(f"conv2d wants data N,C,H,W and kernel O,C,R,S; got {self.data} and {self.kernel}")
        if min(self.data + self.kernel) < 1:
            raise ValueError(f"conv2d shapes must be positive: data {list(self.data)}, kernel {list(self.kernel)}")
        if len(self.stride) != 2 or min(self.stride) < 1:
            raise ValueError(f"stride must be at least 1, got {list(self.stride)}")
        if len(self.dilation) != 2 or min(self.dilation) < 1:
            raise ValueError(f"dilation must be at least 1, got {list(self.dilation)}")
        if len(self.padding) != 4 or min(self.padding) < 0:
            raise ValueError(f"padding must be non-negative, got {list(self.padding)}")
        set_("groups", int(self.groups))
        C, O, G = self.data[1], self.kernel[0], self.groups
        if G < 1 or C % G or O % G or self.kernel[1] != C // G:
            raise ValueError(f"conv2d with groups={G} wants C and O divisible by groups and a kernel of "
                             f"{C // max(G, 1)} input channels per group; got data C {C}, kernel {list(self.kernel)}")
        if G > 1 and G == C and self.kernel[1] == 1 and O == C:
            raise ValueError("a depthwise convolution (groups == C == O): use depthwise_conv2d")
        if G > 1 and ((C // G) % 4 or (O // G) % 4):
            raise ValueError(f"grouped conv2d packs each group into whole RGBA pixels: channels per group must be "
                             f"multiples of 4, got {C // G} in and {O // G} out (groups={G})")
        set_("activation", canonical(self.activation))  # a ValueError names the supported activations
        if self.dtype not in ("float32", "float16"):
            raise ValueError(f"dtype {self.dtype!r}: float32 or float16 storage")
        if min(self.out_shape) < 1:
            raise ValueError(f"conv2d output {self.out_shape} is empty: kernel larger than padded input")
        if self.shuffle_view:
            set_("shuffle_view", self._checked_shuffle_view())
        set_("out_view", check_out_view(self.out_view, self.written_channels))
        if self.plain_output and (self.shuffle_view or self.out_view or self.side_copy or self.residual):
            raise ValueError("plain_output writes the model output's own row-major buffer: no shuffle_view, out_view, "
                             "side_copy or residual with it")
        if self.in_read:
            set_("in_read", self._checked_in_read())
        if self.in_norm:
            object.__setattr__(self, "in_norm", float(self.in_norm))
            if self.kernel[2:] != (1, 1) or self.stride != (1, 1) or any(self.padding) or self.groups != 1 \
                    or not self.bias or self.in_scale or self.in_read \
                    or self.plain_input or self.in_norm < 0:
                raise ValueError(f"in_norm {self.in_norm}: a LayerNorm over the input's channels needs a 1x1 "
                                 "convolution of stride 1, no padding, groups 1, with a bias (it holds the weights' "
                                 "sums) and no in_scale, in_read or plain_input")
        if self.norm_partials and (not self.in_norm or int(self.norm_partials) < 0):
            raise ValueError(f"norm_partials {self.norm_partials}: the statistics of a normalized input (in_norm)")
        if self.in_group_norm:
            set_("in_group_norm", self._checked_group_norm())
        if self.in_response:
            set_("in_response", float(self.in_response))
            if self.in_response < 0 or not self.in_scale or self.scale_rows or self.in_layer_norm \
                    or self.in_group_norm or self.in_norm:
                raise ValueError(f"in_response {self.in_response}: a response norm's epsilon (> 0) for a gate "
                                 "computed from S (in_scale, not scale_rows), with no in_norm, in_group_norm or "
                                 "in_layer_norm")
        set_("in_gate", int(self.in_gate))
        set_("gate_act1", canonical(self.gate_act1))
        set_("gate_activation", canonical(self.gate_activation))
        if self.in_gate and (self.in_gate < 0 or not self.in_scale or self.scale_rows or self.in_response
                             or self.in_layer_norm or self.in_group_norm or self.in_norm or self.in_read
                             or self.out_norm or self.out_stats or "prelu" in (self.gate_act1, self.gate_activation)):
            raise ValueError(f"in_gate {self.in_gate}: the squeeze channels (> 0) of a gate computed from the row sums "
                             "S (in_scale, not scale_rows), with no in_response, norm as read, in_read, out_norm or "
                             "out_stats (their local memory is counted apart), and activations without parameters")
        if not self.in_gate and (self.gate_act1, self.gate_activation) != ("none", "none"):
            raise ValueError("gate_act1 and gate_activation are in_gate's activations: they need in_gate")
        if self.in_layer_norm:
            set_("in_layer_norm", float(self.in_layer_norm))
            if self.in_layer_norm < 0 or self.groups != 1 or self.pad_mode != "zeros" or self.in_norm \
                    or self.in_group_norm or self.in_scale or self.in_read or self.plain_input:
                raise ValueError(f"in_layer_norm {self.in_layer_norm}: a LayerNorm's epsilon (> 0) over the input's "
                                 "channels, for a convolution of groups 1 padded with zeros, with no in_norm, "
                                 "in_group_norm, in_scale, in_read or plain_input")
        if self.out_norm:
            set_("out_norm", self._checked_out_norm())
        if self.out_stats and (self.kernel[0] % 4 or self.out_view or self.side_copy or self.shuffle_view
                               or self.out_norm):
            raise ValueError(f"out_stats: the statistics of the whole output, of {self.kernel[0]} channels (a multiple "
                             "of 4), written whole: no out_view, side_copy, shuffle_view or out_norm with it")
        if self.out_stats:
            groups, O = int(self.out_stats), self.kernel[0]
            if groups < 1 or O % groups or (groups not in (1, O) and (O // groups) % 4):
                raise ValueError(f"out_stats={self.out_stats}: the groups of a norm of the {O} output channels -- 1, "
                                 f"{O} (an InstanceNorm), or a divisor of {O} in groups of whole blocks of 4 channels")
            set_("out_stats", groups)
        if self.residual_scale and not self.residual:
            raise ValueError("residual_scale scales the residual Res as it is added: it needs residual")
        if self.scale_rows and not self.in_scale:
            raise ValueError("scale_rows: the gate S is one a channel and input row -- it needs in_scale")
        if self.plain_input and self.in_scale:
            raise ValueError("plain_input reads the model input's row-major buffer: no in_scale gate with it")
        if self.patch_view:
            set_("patch_view", (str(self.patch_view[0]), *(int(v) for v in self.patch_view[1:])))
            patch_stored_shape(self.patch_view, self.out_shape)  # a ValueError where the view does not tile
            if self.shuffle_view or self.out_view or self.side_copy or self.plain_output:
                raise ValueError("patch_view moves the output's pixels: no shuffle_view, out_view, side_copy or "
                                 "plain_output with it")
        if self.side_copy and self.shuffle_view:
            raise ValueError("side_copy with shuffle_view: the copy is written at the convolution's own pixels, which "
                             "the interleave moves")
        if self.side_copy:
            src, channels, offset, scope = self.side_copy
            src, channels, offset = tuple(int(x) for x in src), tuple(int(c) for c in channels), int(offset)
            set_("side_copy", (src, channels, offset, scope))
            total, own = self.stored_shape[1], self.out_view[0] if self.out_view else 0
            nhw = (self.out_shape[0], *self.out_shape[2:])
            if len(src) != 4 or (src[0], *src[2:]) != nhw or not channels or min(channels) < 0 \
                    or max(channels) >= src[1] or scope not in ("texture", "buffer"):
                raise ValueError(f"side_copy: a gather of channels 0..{src[1] - 1} of a {scope} texture or buffer "
                                 f"of this output's (N, H, W) {nhw}; got {list(src)} and channels "
                                 f"{min(channels, default=None)}..{max(channels, default=None)}")
            if offset % 4 or offset < 0 or offset + len(channels) > total or (offset < own + O
                                                                             and own < offset + len(channels)):
                raise ValueError(f"side_copy at channel {offset}: a multiple of 4 with its {len(channels)} channels "
                                 f"inside the {total} stored and outside this layer's own {own}..{own + O}")
        if self.pad_mode not in PAD_MODES:
            raise ValueError(f"pad_mode {self.pad_mode!r}: one of {', '.join(PAD_MODES)}")
        pt, pl, pb, pr = self.padding
        if self.pad_mode == "reflect" and (max(pt, pb) >= self.data[2] or max(pl, pr) >= self.data[3]):
            raise ValueError(f"pad_mode reflect with padding {list(self.padding)} on a {self.data[2]}x{self.data[3]} "
                             f"input: a reflection pad must be smaller than the input")

    @property
    def out_shape(self) -> tuple:
        (N, C, H, W), (O, _, R, S) = self.data, self.kernel
        (sh, sw), (dh, dw), (pt, pl, pb, pr) = self.stride, self.dilation, self.padding
        return N, O, (H + pt + pb - dh * (R - 1) - 1) // sh + 1, (W + pl + pr - dw * (S - 1) - 1) // sw + 1

    @property
    def flops(self) -> int:
        N, O, OH, OW = self.out_shape
        return 2 * N * O * OH * OW * self.kernel[1] * self.kernel[2] * self.kernel[3]

    def key(self) -> dict:
        """The log's key; ``in_scale`` and ``pad_mode`` only when set, so the keys (and records) of every other
        convolution stay as they were before the fields existed."""
        return {"op": "conv2d", **{k: in_read_text(v) if k == "in_read" else _listed(v) for k, v in asdict(self).items()
                                   if (k not in ("in_scale", "in_read", "scale_rows", "in_norm", "norm_partials",
                                                 "in_group_norm", "in_layer_norm", "in_response", "out_norm",
                                                 "residual_scale", "in_gate") or v)
                                   and (k not in ("gate_act1", "gate_activation") or self.in_gate)
                                   and (k != "pad_mode" or v != "zeros")
                                   and k not in ("out_view", "side_copy", "shuffle_view", "patch_view", "plain_input",
                                                 "plain_output", "out_stats")}}

    def _checked_out_norm(self) -> tuple:
        """``out_norm`` as (groups, epsilon), or a ValueError naming what is wrong."""
        try:
            groups, epsilon = self.out_norm
            groups, epsilon = int(groups), float(epsilon)
        except (TypeError, ValueError):
            raise ValueError(f"out_norm {self.out_norm!r}: (groups, epsilon), e.g. (32, 1e-5)") from None
        O = self.kernel[0]
        cg = O // groups if groups >= 1 and O % groups == 0 else 0
        if not cg or not (cg in (1, 2) or (cg % 4 == 0 and O % 4 == 0)) or epsilon < 0:
            raise ValueError(f"out_norm groups={groups} of {O} output channels: a divisor of O whose groups are one or "
                             f"two channels, or whole blocks of 4 (then O a multiple of 4); epsilon {epsilon} at least 0")
        if self.activation == "prelu" or self.in_norm:
            raise ValueError("out_norm with activation prelu or in_norm: the norm's activation takes no parameters "
                             "here, and B holds the biases alone")
        return groups, epsilon

    def _checked_group_norm(self) -> tuple:
        """``in_group_norm`` as (groups, chunks, epsilon, activation), or a ValueError naming what is wrong."""
        try:
            groups, chunks, epsilon, act = self.in_group_norm
            groups, chunks, epsilon, act = int(groups), int(chunks), float(epsilon), canonical(str(act))
        except (TypeError, ValueError):
            raise ValueError(f"in_group_norm {self.in_group_norm!r}: (groups, chunks, epsilon, activation), e.g. "
                             f"(32, 8, 1e-5, 'silu')") from None
        C = self.data[1]
        if groups < 1 or C % groups or not (groups in (1, C) or (C // groups) % 4 == 0):
            raise ValueError(f"in_group_norm groups={groups} of {C} channels: a divisor of C whose groups are whole "
                             f"blocks of 4 channels, or C (an InstanceNorm), or 1")
        if chunks < 1 or epsilon < 0 or act == "prelu":
            raise ValueError(f"in_group_norm {self.in_group_norm!r}: at least one chunk, a non-negative epsilon and "
                             f"an activation without parameters")
        if self.in_norm or self.in_scale or self.in_read or self.plain_input:
            raise ValueError("in_group_norm normalizes the input as read: no in_norm, in_scale, in_read or "
                             "plain_input with it")
        return groups, chunks, epsilon, act

    def _checked_in_read(self) -> tuple:
        """``in_read`` as tuples of ints and a kind (from them, or from the key's text: ``in_read_text``), or a
        ValueError naming what is wrong."""
        raw = self.in_read
        if isinstance(raw, str):
            raw = [p.split(",") for p in raw.split(";")]
        try:
            parts = tuple((int(c), int(hs), int(ws), str(kind), *(int(v) for v in rest))
                          for c, hs, ws, kind, *rest in raw)
        except (TypeError, ValueError):
            raise ValueError(f"in_read {self.in_read!r}: parts (channels, source H, source W, kind, kh, kw, sh, sw"
                             f"[, at, of])") from None
        (N, C, H, W) = self.data
        if not 1 <= len(parts) <= MAX_IN_PARTS or any(len(p) not in (8, 10) for p in parts):
            raise ValueError(f"in_read: 1 to {MAX_IN_PARTS} parts (channels, source H, source W, kind, kh, kw, sh, "
                             f"sw[, at, of]); got {list(self.in_read)}")
        parts = tuple(p if len(p) == 10 else (*p, 0, p[0]) for p in parts)
        if any(at % 4 or at < 0 or at + c > of for c, *_, at, of in parts):
            raise ValueError(f"in_read: a part at channel `at` (a multiple of 4) of a source of `of` channels holds "
                             f"them; got {[(p[0], p[8], p[9]) for p in parts]} (channels, at, of)")
        if sum(p[0] for p in parts) != C or any(p[0] % 4 for p in parts[:-1]) or min(p[0] for p in parts) < 1:
            raise ValueError(f"in_read: parts of {[p[0] for p in parts]} channels for the input's {C}: every part "
                             f"but the last a multiple of 4")
        if self.groups != 1 or self.plain_input:
            raise ValueError("in_read: a convolution with groups 1 and a packed input")
        for c, hs, ws, kind, kh, kw, sh, sw, _, _ in parts:
            if kind not in IN_READS or min(hs, ws, kh, kw, sh, sw) < 1:
                raise ValueError(f"in_read part {kind!r} {kh}x{kw} s{sh}x{sw}: kinds {', '.join(IN_READS)}, sizes at "
                                 f"least 1")
            out = {"copy": (hs, ws), "nearest": (hs * kh, ws * kw)}.get(kind, ((hs - kh) // sh + 1,
                                                                               (ws - kw) // sw + 1))
            if out != (H, W) or (kind == "copy" and (kh, kw, sh, sw) != (1, 1, 1, 1)) or \
                    (kind == "nearest" and (sh, sw) != (1, 1)) or \
                    (kind in ("max", "avg") and min(hs - kh, ws - kw) < 0):
                raise ValueError(f"in_read part {kind} {kh}x{kw} s{sh}x{sw} of a {hs}x{ws} source reads {out[0]}x"
                                 f"{out[1]}, not the input's {H}x{W}")
        return parts

    @property
    def written_channels(self) -> int:
        """The channels the kernel writes: its outputs, or a phase's under ``shuffle_view``."""
        return self.kernel[0] // (self.shuffle_view[0] * self.shuffle_view[1]) if self.shuffle_view else self.kernel[0]

    @property
    def stored_shape(self) -> tuple:
        """The output tensor the kernel writes into: ``out_shape``, the interleave's that ``shuffle_view`` names,
        and within either the concat's that ``out_view`` names."""
        N, _, OH, OW = self.out_shape
        if self.shuffle_view:
            OH, OW = self.shuffle_view[4:]
        if self.patch_view:
            return patch_stored_shape(self.patch_view, (N, self.written_channels, OH, OW))
        return N, self.out_view[1] if self.out_view else self.written_channels, OH, OW

    def _checked_shuffle_view(self) -> tuple:
        """``shuffle_view`` as six ints, or a ValueError naming what is wrong: the channels divide into the phases,
        each output pixel's channels are in one RGBA pixel of the convolution's (a phase's channels a multiple of 4,
        or 1 or 2: whole pixels written, no two work-items share one), and the window is inside the interleave."""
        view = tuple(int(v) for v in self.shuffle_view)
        if len(view) != 6:
            raise ValueError(f"shuffle_view {list(view)}: (bh, bw, top, left, out_h, out_w)")
        (bh, bw, top, left, oh, ow), (_, O, H, W) = view, self.out_shape
        if bh < 1 or bw < 1 or O % (bh * bw):
            raise ValueError(f"shuffle_view: {O} output channels do not divide into {bh}x{bw} phases")
        c = O // (bh * bw)
        if c % 4 and 4 % c:
            raise ValueError(f"shuffle_view: {c} channels a phase are not whole RGBA pixels (a multiple of 4, or 1 "
                             f"or 2): an output pixel's channels would span two pixels of the convolution's")
        if min(top, left) < 0 or min(oh, ow) < 1 or top + oh > H * bh or left + ow > W * bw:
            raise ValueError(f"shuffle_view window {oh}x{ow} at ({top}, {left}) outside the {H * bh}x{W * bw} "
                             f"interleave of the {H}x{W} output")
        return view


def scope_layout(scope: str, texture_layout: str, buffer_layout: str, weight=False):
    """(IR scope, layout name) of an operand declared with a user-facing scope ``texture`` or ``buffer``."""
    if scope == "texture":
        return ("texture:weight" if weight else "texture"), texture_layout
    if scope == "buffer":
        return "global", buffer_layout
    raise ValueError(f"scope {scope!r}: texture or buffer")


class Arithmetic:
    """The ``compute`` knob: ``float32`` (half storage read as float), ``half`` (half loads and products,
    float32 accumulators) or ``half_acc`` (half accumulators too). Half modes need float16 storage and a
    device with cl_khr_fp16 (the search spaces' ``half_compute`` constraint)."""

    def __init__(self, compute: str, dtype: str):
        if compute not in ("float32", "half", "half_acc"):
            raise ValueError(f"compute {compute!r}: float32, half or half_acc")
        if compute != "float32" and dtype != "float16":
            raise ValueError(f"compute={compute} needs float16 storage, got {dtype}")
        self.half = compute != "float32"
        self.value = "float16x4" if self.half else "float32x4"  # loaded pixels, products, the local tile
        self.acc = "float16x4" if compute == "half_acc" else "float32x4"

    def load(self, v):
        """A load of storage (read as float32) in the compute type: half loads are read as half."""
        return Cast(DType.parse(self.value).with_lanes(v.lanes), v) if self.half else v

    def accumulators(self, b, n: int):
        acc = b.allocate("acc", (n,), self.acc, "private")
        for i in range(n):
            b.store(acc, i, const(0.0, self.acc))
        return acc

    def mac(self, acc_value, product):
        """``acc + product``: a half product joins float32 accumulators as float."""
        if self.half and self.acc == "float32x4":
            product = Cast(DType("float32", product.lanes), product)
        return acc_value + product


def padded_index(i, n, pad_mode: str = "zeros"):
    """``(inside, index)`` of input row or column ``i`` (in [-pad, n + pad)) of an axis of ``n``: with zeros, whether
    it is inside and a clamped index to read there; reflected (``reflect``: -1 reads 1, n reads n - 2) or
    clamped (``edge``) every position reads the input, and ``inside`` is None."""
    if pad_mode == "zeros":
        return (i >= 0) & (i < n), clamp(i, n)
    if pad_mode == "edge":
        return None, clamp(i, n)
    # clamped too: a partial tile's rows past the padded input (their outputs are not stored) must read in bounds
    return None, clamp(select(i < 0, -i, select(i > n - 1, (n - 1) * 2 - i, i)), n)


def padded_tap(ih, iw, H, W, pad_mode: str = "zeros"):
    """``(inside, row, column)`` of an input tap: ``inside`` None where every tap reads the input."""
    inside_h, ih = padded_index(ih, H, pad_mode)
    inside_w, iw = padded_index(iw, W, pad_mode)
    return (None if inside_h is None else inside_h & inside_w), ih, iw


def padded(inside, value):
    """``value`` where the tap is inside the input, else zero; as is where the padding reads the input."""
    return value if inside is None else select(inside, value, 0.0)


def is_plain(buf) -> bool:
    """Whether an activation operand is a row-major host buffer (a model input or output read or written in
    place: ``plain_input`` / ``plain_output``) rather than NCHW4c / row4 packed."""
    return buf.scope == "global" and buf.layout is None


def pixel(X, n, cb, h, w):
    """``X``'s RGBA pixel of channel block ``cb`` at (``h``, ``w``): one packed load, or from a row-major buffer
    (``is_plain``) a gather of the 4 channels' planes, channels past C clamped to the last (their lanes are
    never used: OIHW4o weights do not pad C)."""
    if isinstance(X, InputParts):
        return X.pixel(n, cb, h, w)
    if not is_plain(X):
        return X[n, Ramp(cb * 4, as_expr(1), 4), h, w]
    C = X.shape[1]
    if C % 4 == 0:
        return X[n, Ramp(cb * 4, as_expr(1), 4), h, w]
    return call("make_vector", [X[n, cb * 4 + k if k < C % 4 else min_(cb * 4 + k, C - 1), h, w]
                                for k in range(4)], "float32x4")


def store_pixel(b, Y, n, ob, h, w, v, name: str) -> None:
    """Store RGBA pixel ``v`` of channel block ``ob`` at (``h``, ``w``) of an NCHW tensor (of feature block ``ob`` of
    row ``n`` of an (N, K) one: ``h``, ``w`` None): one packed store, or into a row-major buffer (``is_plain``) a
    scatter to the channels' planes (4 contiguous features), lanes past the channels not written."""
    at = lambda c: (n, c, h, w) if len(Y.shape) == 4 else (n, c)  # noqa: E731 - NCHW, or (N, K) rows
    if not is_plain(Y) or Y.shape[1] % 4 == 0:
        b.store(Y, at(Ramp(ob * 4, as_expr(1), 4)), v)
        return
    O = Y.shape[1]
    v = b.let(name, v)
    for k in range(4):
        idx = at(ob * 4 + k)
        with b.if_(ob * 4 + k < O) if k >= O % 4 else nullcontext():
            b.store(Y, idx, ExtractLane(v, k))


def part_block(cb, first: int, blocks: int, at: int = 0):
    """Channel block ``cb`` of a logical input read in parts (``in_read``), as a block of the part that starts at
    block ``first`` and holds ``blocks`` blocks: clamped into the part -- the last part too, so that every part's
    read is in bounds for any ``cb`` the loop bounds allow (the caller selects the part that holds ``cb``) -- then
    offset by the part's channel offset ``at`` in its source (a slice)."""
    local = min_(max_(cb - first, 0), blocks - 1) if first else min_(cb, blocks - 1)
    return local + at // 4 if at else local


class InputParts:
    """A convolution's input read through its workload's ``in_read``: the parts' buffers (``X``, ``X1``, ...) and
    ``pixel`` / ``value``, the logical input's RGBA pixel of a channel block or one channel's value at a (clamped)
    row and column -- the source pixel, its nearest-upsampled one, or the max / mean of its pool window, from the
    part that holds the block."""

    def __init__(self, wl, buffers: list):
        self.parts, self.buffers = wl.in_read, buffers
        self.scope, self.shape = buffers[0].scope, tuple(wl.data)

    def _read(self, n, cb, h, w, lane):
        cases, first = [], 0
        for (c, _, _, kind, kh, kw, sh, sw, at, _), X in zip(self.parts, self.buffers):
            blocks = -(-c // 4)
            local = part_block(cb, first, blocks, at)
            ch = Ramp(local * 4, as_expr(1), 4) if lane is None else local * 4 + lane
            if kind in ("copy", "nearest"):
                v = X[n, ch, h // kh if kh > 1 else h, w // kw if kw > 1 else w]
            else:
                taps = [X[n, ch, h * sh + i, w * sw + j] for i in range(kh) for j in range(kw)]
                v = functools.reduce(max_ if kind == "max" else operator.add, taps)
                v = v * (1.0 / (kh * kw)) if kind == "avg" else v
            first += blocks
            cases.append((first, v))
        out = cases[-1][1]
        for bound, v in reversed(cases[:-1]):
            out = select(cb < bound, v, out)
        return out

    def pixel(self, n, cb, h, w):
        return self._read(n, cb, h, w, None)

    def value(self, n, c, h, w):
        return self._read(n, c // 4, h, w, c % 4)


def input_parts(wl, cfg, X):
    """``X`` (``declare_operands``'), or with ``in_read`` the ``InputParts`` of X and its other parts X1, X2, ...,
    each its source tensor in the input's scope and layout."""
    if not getattr(wl, "in_read", ()):
        return X
    scope, layout = scope_layout(cfg.input_scope, cfg.act_layout, "nchw4c_buffer")
    bufs = [buffer("X" if i == 0 else f"X{i}", (wl.data[0], p[9], p[1], p[2]), wl.dtype, scope, layout)
            for i, p in enumerate(wl.in_read)]
    return InputParts(wl, bufs)


def params_of(X) -> list:
    """The kernel parameters an input stands for: the buffer, or an ``InputParts``' buffers."""
    return list(X.buffers) if isinstance(X, InputParts) else [X]


def value(X, n, c, h, w):
    """Channel ``c``'s value at (``h``, ``w``) of the input (a buffer, or ``InputParts``)."""
    return X.value(n, c, h, w) if isinstance(X, InputParts) else X[n, c, h, w]


def read_parts_numpy(wl, inputs: dict):
    """The logical input (float64) from ``inputs``' parts (``X``, ``X1``, ...) by ``in_read``; ``X`` without it."""
    if not getattr(wl, "in_read", ()):
        return inputs["X"]
    out = []
    for i, (c, hs, ws, kind, kh, kw, sh, sw, at, _) in enumerate(wl.in_read):
        x = np.asarray(inputs["X" if i == 0 else f"X{i}"], np.float64)[:, at:at + c]
        if kind == "nearest":
            x = x.repeat(kh, axis=2).repeat(kw, axis=3)
        elif kind in ("max", "avg"):
            H, W = (hs - kh) // sh + 1, (ws - kw) // sw + 1
            win = np.stack([x[:, :, a:a + sh * (H - 1) + 1:sh, b:b + sw * (W - 1) + 1:sw]
                            for a in range(kh) for b in range(kw)])
            x = win.max(0) if kind == "max" else win.mean(0)
        out.append(x)
    return np.concatenate(out, axis=1)


def input_pixel(X, n, cb, ih, iw, H, W, arith, pad_mode: str = "zeros", norm=None):
    """The RGBA pixel of channel block ``cb`` at input row ``ih``, column ``iw`` (zero in the padding, or what
    ``pad_mode`` reads there); ``norm``: a function applied to the pixel read (a norm), before the padding's
    zeros."""
    inside, ih, iw = padded_tap(ih, iw, H, W, pad_mode)
    v = pixel(X, n, cb, ih, iw)
    return padded(inside, arith.load(v if norm is None else norm(v)))


class LocalTile:
    """The input a work-group reads in one reduction step -- ``blocks`` channel blocks by the rows and columns
    its outputs' windows cover (the halo included) -- staged in ``__local`` memory: every work-item loads a
    strided share of the pixels, then a barrier, then all read their taps from the tile. ``tile``:
    (channel blocks, tile_oh, tile_ow) of one work-item."""

    def __init__(self, b, cfg, tile, stride, dilation, window, arith):
        (blocks, t_oh, t_ow), (sh, sw), (dh, dw), (R, S) = tile, stride, dilation, window
        self.b, self.stride, self.dilation = b, stride, dilation
        self.blocks, self.t_oh, self.t_ow = blocks, t_oh, t_ow
        self.rows = (cfg.wg_h * t_oh - 1) * sh + (R - 1) * dh + 1
        self.cols = (cfg.wg_w * t_ow - 1) * sw + (S - 1) * dw + 1
        self.pixels = blocks * self.rows * self.cols
        self.items = cfg.wg_w * cfg.wg_h
        self.buf = b.allocate("tile", (self.pixels,), arith.value, "local")

    @staticmethod
    def bytes(cfg, tile, stride, dilation, window, compute="float32") -> int:
        (blocks, t_oh, t_ow), (sh, sw), (dh, dw), (R, S) = tile, stride, dilation, window
        rows, cols = (cfg.wg_h * t_oh - 1) * sh + (R - 1) * dh + 1, (cfg.wg_w * t_ow - 1) * sw + (S - 1) * dw + 1
        return blocks * rows * cols * (16 if compute == "float32" else 8)

    def load(self, pixel, origin, lid):
        """``pixel(k, ih, iw)``: the value of block ``k`` (of this step) at input row/column; ``origin``: the
        input row/column of the tile's corner; ``lid``: the work-item's linear id in the work-group."""
        b, plane = self.b, self.rows * self.cols
        with b.loop("ld", -(-self.pixels // self.items)) as j:
            idx = b.let("li", j * self.items + lid)
            with b.if_(idx < self.pixels) if self.pixels % self.items else nullcontext():
                k, rem = idx // plane, idx % plane
                b.store(self.buf, idx, pixel(k, origin[0] + rem // self.cols, origin[1] + rem % self.cols))
        b.barrier()

    def read(self, k, th, tw, y, x, r, s, extra_col=0):
        """Block ``k``'s pixel for output (y, x) of work-item (th, tw)'s tile at window tap (r, s), ``extra_col``
        columns to the right."""
        (sh, sw), (dh, dw) = self.stride, self.dilation
        row = (th * self.t_oh + y) * sh + r * dh
        col = (tw * self.t_ow + x) * sw + s * dw + extra_col
        return self.buf[(k * self.rows + row) * self.cols + col]


def bias_length(wl, channels: int) -> int:
    """Elements of a convolution's ``B``: its ``channels`` biases, or with a per-channel PReLU (activation
    ``prelu``) the biases padded to whole blocks of 4 (``O4``) then the ``O4`` slopes: B[c] and B[O4 + c]; with
    ``in_norm`` the weights' sums over the input channels after those (``norm_sums_at``)."""
    tails = (getattr(wl, "activation", "none") == "prelu") + bool(getattr(wl, "in_norm", 0))
    return channels if not tails else (1 + tails) * (-(-channels // 4) * 4)


def norm_sums_at(wl, channels: int) -> int:
    """Where ``in_norm``'s weight sums start in ``B``: after the padded biases, and the slopes of a PReLU."""
    return (2 if getattr(wl, "activation", "none") == "prelu" else 1) * (-(-channels // 4) * 4)


def packed_after_biases(bias, *tails) -> np.ndarray:
    """A convolution's ``B`` with more per-channel vectors, as ``bias_length`` lays it out: the biases (zeros
    where the layer has none) padded to whole blocks of 4 (``O4``), then each of ``tails`` so padded (a PReLU's
    slopes, then ``in_norm``'s weight sums)."""
    tails = [np.asarray(t, np.float32).reshape(-1) for t in tails]
    o4 = -(-tails[0].size // 4) * 4
    packed = np.zeros((1 + len(tails)) * o4, np.float32)
    if bias is not None:
        packed[:tails[0].size] = np.asarray(bias, np.float32).reshape(-1)
    for i, t in enumerate(tails, 1):
        packed[i * o4:i * o4 + t.size] = t
    return packed


def split_prelu(wl, bias):
    """``(bias, slope)`` of a ``B`` array (``bias_length``): the slopes None unless the activation is prelu."""
    if getattr(wl, "activation", "none") != "prelu" or bias is None:
        return bias, None
    bias = np.asarray(bias).reshape(-1)
    o4 = bias.size // (3 if getattr(wl, "in_norm", 0) else 2)
    return bias[:o4], bias[o4:2 * o4]


def declare_operands(wl, cfg, channels: int) -> tuple:
    """``(X, Wt, B, Res, Y)`` of a convolution in the config's scopes and layouts: activations (``Res`` in the
    output's scope) by ``act_layout``, weights by ``weight_layout``, ``B`` (``channels`` outputs) and ``Res``
    None unless the workload fuses them; in kernel argument order."""
    in_scope, in_layout = scope_layout(cfg.input_scope, cfg.act_layout, "nchw4c_buffer")
    w_scope, w_layout = scope_layout(cfg.weight_scope, cfg.weight_layout, "oihw4o_buffer", weight=True)
    out_scope, out_layout = scope_layout(cfg.output_scope, cfg.act_layout, "nchw4c_buffer")
    if getattr(wl, "plain_input", False):  # the model input's row-major buffer (the space: input_scope buffer)
        in_scope, in_layout = "global", None
    y_scope, y_layout = ("global", None) if getattr(wl, "plain_output", False) else (out_scope, out_layout)
    return (buffer("X", wl.data, wl.dtype, in_scope, in_layout),
            buffer("Wt", wl.kernel, wl.dtype, w_scope, w_layout),
            bias_buffer(bias_length(wl, channels), wl.dtype, cfg.weight_scope) if wl.bias else None,
            buffer("Res", wl.out_shape, wl.dtype, out_scope, out_layout) if wl.residual else None,
            buffer("Y", getattr(wl, "stored_shape", wl.out_shape), wl.dtype, y_scope, y_layout))


def scale_operand(wl, cfg):
    """``S``, the per-(n, channel) gate an ``in_scale`` workload multiplies its input by (N, C, 1, 1; with
    ``scale_rows`` (N, C, H, 1), per input row too), in the input's scope and layout; None without ``in_scale``."""
    if not getattr(wl, "in_scale", False):
        return None
    return buffer("S", scale_shape(wl), wl.dtype,
                  *scope_layout(cfg.input_scope, cfg.act_layout, "nchw4c_buffer"))


def scale_shape(wl) -> tuple:
    """The gate S's shape: (N, C, 1, 1), or (N, C, H, 1) with ``scale_rows`` (a gate a row) or ``in_gate`` (the
    maps' row sums the gate is computed from)."""
    rows = getattr(wl, "scale_rows", False) or getattr(wl, "in_gate", 0)
    return (wl.data[0], wl.data[1], wl.data[2] if rows else 1, 1)


def bias_buffer(O: int, dtype: str, weight_scope: str):
    """Bias beside the weights: a 1-D texture (MACE argument image) or a packed float4 buffer."""
    return buffer("B", (O,), dtype, *(("texture:weight", "mace_argument") if weight_scope == "texture"
                                       else ("global", "bias4_buffer")))


def split_sums(b, acc, n: int, sk: int, tk, items: int, lid, dtype: str):
    """The ``sk`` work-items of a split (``tk``: which one) each hold partial sums of the same ``n`` outputs:
    they write them to ``__local`` memory and output ``i`` is summed and stored by work-item ``i % sk``.
    ``items``/``lid``: the work-items of one split and this one's id among them. Returns (sums, owner)
    for ``store_tile``: ``sums[i]`` reads the total, ``owner(i)`` says whether this work-item stores it."""
    part = b.allocate("part", (sk * items * n,), dtype, "local")
    for i in range(n):
        b.store(part, (tk * items + lid) * n + i, acc[i])
    b.barrier()
    sums = []
    for i in range(n):
        v = part[lid * n + i]
        for j in range(1, sk):
            v = v + part[(j * items + lid) * n + i]
        sums.append(v)
    return sums, lambda i: tk.equal(i % sk)


def store_tile(b, acc, Y, n, obb, oh0, ow0, tile, bounds, wl, B=None, Res=None, owner=None, norm=None, rows=None,
               out_norm=None, Rs=None, keep=None):
    """The fused epilogue (bias, residual add, then ReLU/ReLU6: ResNet's ``relu(conv + bn + identity)``) and a
    guarded store of every tile pixel; ``owner(i)``, if given, is the condition under which this work-item
    stores tile entry ``i`` (a split reduction's sums, see ``split_sums``). A workload's ``out_view`` shifts the
    stores by its channel offset; its ``shuffle_view`` moves each pixel to its place in the interleave
    (``shuffle_store``). ``rows`` (a private float4 array, t_oc x t_oh): each stored pixel is added to its
    row's entry too (``row_sums``). ``out_norm``: per tile block, the ``(mean, scale, shift)`` float4s of the norm
    applied after the bias (``conv2d_nchw4c.out_norm_factors``). ``Rs``: the residual's per-channel scale
    (``residual_scale``), float32 (OB, 4). ``keep`` (a private float4 array, a tile entry each): each stored pixel
    is kept there too (``out_stats``)."""
    (t_oc, t_oh, t_ow), (OB, OH, OW) = tile, bounds
    shift = wl.out_view[0] if getattr(wl, "out_view", ()) else 0
    shuffle, patches = getattr(wl, "shuffle_view", ()), getattr(wl, "patch_view", ())
    for k in range(t_oc):
        ob = obb * t_oc + k
        for y in range(t_oh):
            for x in range(t_ow):
                oh, ow = oh0 + y, ow0 + x
                i = (k * t_oh + y) * t_ow + x
                inside = (ob < OB) & (oh < OH) & (ow < OW)
                with b.if_(inside & owner(i) if owner is not None else inside):
                    lanes = Ramp(ob * 4, as_expr(1), 4)
                    v = acc[i]
                    if v.dtype.base == "float16":  # half accumulators: the epilogue runs in float
                        v = Cast(DType("float32", v.lanes), v)
                    if norm is not None:  # in_norm: rstd * (acc - mean * U), U after the padded biases (acc and
                        # mean both of the inputs less the pixel's shift K: see conv2d_nchw4c.norm_stats)
                        mean, rstd = norm[y * t_ow + x]
                        u = B[Ramp(ob * 4 + norm_sums_at(wl, OB * 4), as_expr(1), 4)]
                        v = (v - Broadcast(mean, 4) * u) * Broadcast(rstd, 4)
                    if B is not None:
                        v = v + B[lanes]
                    if out_norm is not None:
                        mean, scale, shift_ = out_norm[k]
                        v = (v - mean) * scale + shift_
                    if Res is not None and Rs is not None:
                        r = Res[n, lanes, oh, ow]
                        r = Cast(DType("float32", 4), r) if r.dtype.base == "float16" else r
                        v = v + r * Rs[ob, Ramp(as_expr(0), as_expr(1), 4)]
                    elif Res is not None:
                        v = v + Res[n, lanes, oh, ow]
                    if wl.activation == "prelu":  # the slopes after the padded biases (bias_length)
                        if B is None:
                            raise ValueError("activation prelu reads its slopes from B: the workload needs bias")
                        v = apply_prelu_ir(v, B[Ramp(ob * 4 + OB * 4, as_expr(1), 4)])
                    else:
                        v = apply_ir(wl.activation, v)
                    if rows is not None or keep is not None:
                        v = b.let(f"ev{i}", v)
                    if rows is not None:
                        b.store(rows, k * t_oh + y, rows[k * t_oh + y] + v)
                    if keep is not None:
                        b.store(keep, i, v)
                    if shuffle:
                        shuffle_store(b, Y, v, n, ob, oh, ow, (OH, OW), wl, shift, f"sv{i}")
                    elif patches:  # MobileViT's unfold or fold: the pixel where the view puts it
                        b.store(Y, (n, lanes, *patch_position(patches, oh, ow)), v)
                    elif is_plain(Y):
                        store_pixel(b, Y, n, ob, oh, ow, v, f"pv{i}")
                    else:
                        b.store(Y, (n, Ramp(ob * 4 + shift, as_expr(1), 4) if shift else lanes, oh, ow), v)


def shuffle_store(b, Y, v, n, ob, oh, ow, bounds, wl, shift: int, name: str):
    """Pixel ``v`` of output block ``ob`` at (``oh``, ``ow``) of the convolution's (``bounds``: OH, OW), stored where
    ``shuffle_view``'s DCR interleave puts it: channel ``k`` is phase ``k // c`` (``c`` channels a phase), row
    ``oh * bh + phase // bw - top``, column ``ow * bw + phase % bw - left``, if inside the window. With ``c`` a
    multiple of 4 the block is one phase's (whole pixel); with 1 or 2, the block holds ``4 // c`` phases, each the
    first lanes of its own output pixel (the rest zero). Guards only what can fall outside."""
    (bh, bw, top, left, out_h, out_w), (OH, OW) = wl.shuffle_view, bounds
    blocks, c = bh * bw, wl.written_channels
    if c % 4 == 0:
        phase, cb = (ob // (c // 4), ob % (c // 4)) if c > 4 else (ob, 0)
        stores = [(phase, Ramp(as_expr(cb * 4 + shift), as_expr(1), 4), v, None)]
    else:
        per, pix = 4 // c, b.let(name, v)
        stores = [(ob * per + q, Ramp(as_expr(shift), as_expr(1), 4),
                   call("make_vector", [ExtractLane(pix, q * c + j) if j < c else const(0.0) for j in range(4)],
                        "float32x4"), ob * per + q < blocks if blocks % per else None) for q in range(per)]
    for phase, lanes, value, valid in stores:
        py, px = (phase // bw, phase % bw) if bw > 1 else (phase, 0)
        y, x = oh * bh + py - top, ow * bw + px - left
        conds = [valid, y >= 0 if top else None, y < out_h if OH * bh - top > out_h else None,
                 x >= 0 if left else None, x < out_w if OW * bw - left > out_w else None]
        conds = [cond for cond in conds if cond is not None]
        with b.if_(functools.reduce(operator.and_, conds)) if conds else nullcontext():
            b.store(Y, (n, lanes, y, x), value)


def clamp(i, n):
    return max_(min_(i, n - 1), 0)


def padded_windows(wl, x):
    """``(r, s, patch)`` per filter tap: the float64 padded input pixels (zeros, or ``pad_mode``'s) that tap
    reads for every output pixel (shared by the conv2d and depthwise references)."""
    _, _, R, S = wl.kernel
    _, _, OH, OW = wl.out_shape
    (sh, sw), (dh, dw), (pt, pl, pb, pr) = wl.stride, wl.dilation, wl.padding
    mode = getattr(wl, "pad_mode", "zeros")  # a depthwise workload pads with zeros only
    mode = "constant" if mode == "zeros" else mode
    xp = np.pad(np.asarray(x, np.float64), ((0, 0), (0, 0), (pt, pb), (pl, pr)), mode=mode)
    for r in range(R):
        for s in range(S):
            yield r, s, xp[:, :, r * dh: r * dh + sh * (OH - 1) + 1: sh, s * dw: s * dw + sw * (OW - 1) + 1: sw]


def reference_epilogue(wl, out: np.ndarray, bias=None, residual=None) -> np.ndarray:
    """The fused epilogue in the kernels' order: bias (per channel, axis 1), residual add, activation (a
    per-channel PReLU's slopes after the biases in ``bias``: ``bias_length``)."""
    bias, slope = split_prelu(wl, bias)
    if bias is not None:
        bias = bias[:out.shape[1]]
        out = out + bias.astype(np.float64).reshape((1, -1) + (1,) * (out.ndim - 2))
    if residual is not None:
        out = out + residual
    if slope is not None:
        return apply_prelu_numpy(out, slope[:out.shape[1]])
    return apply_numpy(wl.activation, out)


def response_gate_numpy(g, affine, epsilon: float) -> np.ndarray:
    """``in_response``'s gate in float64 from G (N, C, 1, 1), each channel's L2 norm: ``c + gamma * G / (mean_c(G) +
    eps)``, gamma and c from ``affine`` ((2, C), or ``Rg``'s (2 * C4, 4) rows)."""
    g = np.asarray(g, np.float64)
    C = g.shape[1]
    gamma, shift = np.asarray(affine, np.float64).reshape(2, -1)[:, :C]
    return shift.reshape(1, -1, 1, 1) + gamma.reshape(1, -1, 1, 1) * g / (g.mean(axis=1, keepdims=True) + epsilon)


def pixel_normed(x, affine, epsilon: float) -> np.ndarray:
    """``in_layer_norm``'s input in float64: each pixel normalized over its channels, times gamma plus beta
    (``affine``: (2, C), or ``A``'s (2 * C4, 4) rows)."""
    x = np.asarray(x, np.float64)
    C = x.shape[1]
    gamma, beta = np.asarray(affine, np.float64).reshape(2, -1)[:, :C]
    y = (x - x.mean(axis=1, keepdims=True)) / np.sqrt(x.var(axis=1, keepdims=True) + epsilon)
    return y * gamma.reshape(1, -1, 1, 1) + beta.reshape(1, -1, 1, 1)


def group_normed(x, affine, groups: int, epsilon: float, activation: str) -> np.ndarray:
    """``in_group_norm``'s input in float64: each (image, group of channels) normalized over its channels and pixels,
    times gamma plus beta (``affine``: (2, C), or ``A``'s (2 * C4, 4) rows), then ``activation``."""
    x = np.asarray(x, np.float64)
    N, C = x.shape[:2]
    gamma, beta = np.asarray(affine, np.float64).reshape(2, -1)[:, :C]
    xg = x.reshape(N, groups, -1)
    y = ((xg - xg.mean(axis=2, keepdims=True)) / np.sqrt(xg.var(axis=2, keepdims=True) + epsilon)).reshape(x.shape)
    return apply_numpy(activation, y * gamma.reshape(1, -1, 1, 1) + beta.reshape(1, -1, 1, 1))


def reference(wl: Conv2dWorkload, x, w, bias=None, residual=None, scale=None, affine=None,
              norm_affine=None, residual_scale=None) -> np.ndarray:
    """NumPy conv2d in float64 (the check for every tuned config); ``scale`` (N, C, 1, 1): the input's gate;
    ``affine``: ``in_group_norm``'s gamma and beta; ``norm_affine``: ``out_norm``'s; ``residual_scale``: ``Rs``, the
    residual's per-channel scale; a ``shuffle_view`` gives the interleave it writes (``out_view`` is not applied:
    the layer's own channels)."""
    if getattr(wl, "residual_scale", False):
        o = wl.kernel[0]
        residual = np.asarray(residual, np.float64) * np.asarray(residual_scale, np.float64).reshape(-1)[:o].reshape(
            1, o, 1, 1)
        wl = dataclasses.replace(wl, residual_scale=False)
    if getattr(wl, "in_layer_norm", 0):  # each pixel normalized over its channels, then gamma and beta (A's rows)
        return reference(dataclasses.replace(wl, in_layer_norm=0.0), pixel_normed(x, affine, wl.in_layer_norm), w,
                         bias, residual, scale, norm_affine=norm_affine)
    if getattr(wl, "in_group_norm", ()):
        groups, _, epsilon, act = wl.in_group_norm
        return reference(dataclasses.replace(wl, in_group_norm=()), group_normed(x, affine, groups, epsilon, act), w,
                         bias, residual, scale, norm_affine=norm_affine)
    if getattr(wl, "out_norm", ()):  # the convolution with its bias, normalized, then the rest of the epilogue
        plain = dataclasses.replace(wl, out_norm=(), residual=False, activation="none", shuffle_view=(), patch_view=())
        bias = None if bias is None else bias[:wl.kernel[0]]
        y = group_normed(reference(plain, x, w, bias, None, scale), norm_affine, wl.out_norm[0], wl.out_norm[1], "none")
        return shuffled(wl, reference_epilogue(dataclasses.replace(wl, bias=False), y, None, residual))
    if scale is not None:
        x = x.astype(np.float64) * scale
    if getattr(wl, "in_norm", 0):  # the input normalized over its channels; B's weight sums (U) are the kernel's
        x = x.astype(np.float64)
        axes = (1, 2, 3) if getattr(wl, "norm_partials", 0) else 1  # GroupNorm(1): the image; LayerNorm: a pixel
        x = (x - x.mean(axis=axes, keepdims=True)) / np.sqrt(x.var(axis=axes, keepdims=True) + wl.in_norm)
        return reference(dataclasses.replace(wl, in_norm=0.0, norm_partials=0), x, w,
                         bias[:norm_sums_at(wl, wl.kernel[0])], residual, scale)
    out = np.zeros(wl.out_shape)
    G, (N, O, OH, OW) = wl.groups, wl.out_shape
    for r, s, patch in padded_windows(wl, x):  # grouped: (N, G, C/G, ...) . (G, O/G, C/G)
        out += np.einsum("ngchw,goc->ngohw", patch.reshape(N, G, -1, OH, OW),
                         w[:, :, r, s].astype(np.float64).reshape(G, O // G, -1)).reshape(out.shape)
    return shuffled(wl, reference_epilogue(wl, out, bias, residual))


def shuffled(wl, out: np.ndarray) -> np.ndarray:
    """``out`` (the convolution's output) as its ``shuffle_view`` stores it: the DCR depth_to_space, cropped; or
    as its ``patch_view`` does."""
    if getattr(wl, "patch_view", ()):
        return apply_patch_view(wl.patch_view, out)
    if not getattr(wl, "shuffle_view", ()):
        return out
    (bh, bw, top, left, oh, ow), (N, K, H, W) = wl.shuffle_view, out.shape
    z = out.reshape(N, bh, bw, K // (bh * bw), H, W).transpose(0, 3, 4, 1, 5, 2).reshape(N, -1, H * bh, W * bw)
    return z[:, :, top:top + oh, left:left + ow]


def random_inputs(wl, rng) -> dict:
    """Random normal operands (never zeros) keyed by kernel parameter name; conv2d's and depthwise's."""
    draw = lambda shape: rng.standard_normal(shape).astype(wl.dtype)  # noqa: E731
    inputs = {"X": draw((wl.data[0], wl.in_view[1], *wl.data[2:]) if getattr(wl, "in_view", ()) else wl.data),
              "Wt": draw(wl.kernel)}
    if wl.bias:
        inputs["B"] = draw((bias_length(wl, wl.kernel[0]),))
        if getattr(wl, "activation", "none") == "prelu":  # slopes as trained PReLUs have them (0.25 at init)
            o4 = -(-wl.kernel[0] // 4) * 4  # after the padded biases (``bias_length``)
            inputs["B"][o4:2 * o4] = rng.uniform(0.05, 0.5, o4).astype(wl.dtype)
        if getattr(wl, "in_norm", 0):  # the weights' sums over the input channels, as the lowering packs them
            at = norm_sums_at(wl, wl.kernel[0])
            inputs["B"][at:at + wl.kernel[0]] = inputs["Wt"].astype(np.float64).sum(axis=(1, 2, 3))
    if getattr(wl, "norm_partials", 0):  # the image statistics, as group_norm's stats kernel writes them
        from tuner.templates.reduction import chunk_statistics
        inputs["P"] = chunk_statistics(inputs["X"], wl.norm_partials).astype(np.float32)
    if getattr(wl, "in_layer_norm", 0):  # gamma (about 1) and beta, in A's (2 * C4, 4) rows
        c4 = -(-wl.data[1] // 4)
        inputs["A"] = np.concatenate([1.0 + 0.5 * rng.standard_normal((c4, 4)),
                                      rng.standard_normal((c4, 4))]).astype(np.float32)
    if getattr(wl, "in_group_norm", ()):  # gamma, beta; the statistics as group_norm's stats kernel writes them
        from tuner.templates.reduction import chunk_statistics
        c4 = -(-wl.data[1] // 4)
        inputs["A"] = draw((2 * c4, 4)).astype(np.float32)
        groups, chunks = wl.in_group_norm[:2]
        inputs["Q"] = chunk_statistics(inputs["X"], chunks, groups).astype(np.float32)
    if getattr(wl, "out_norm", ()):  # gamma (about 1) and beta of the norm in the epilogue
        ob = -(-wl.kernel[0] // 4)
        inputs["Na"] = np.concatenate([1.0 + 0.5 * rng.standard_normal((ob, 4)), rng.standard_normal((ob, 4))]
                                      ).astype(np.float32)
    if wl.residual:
        inputs["Res"] = draw(wl.out_shape)
    if getattr(wl, "residual_scale", False):  # about 1, as a trained res_scale
        inputs["Rs"] = (1.0 + 0.5 * rng.standard_normal((-(-wl.kernel[0] // 4), 4))).astype(np.float32)
    if getattr(wl, "in_add", ()):  # the depthwise input's addend, of its own channel count
        inputs["A"] = draw((wl.data[0], wl.in_add[0], *wl.data[2:]))
    if getattr(wl, "in_scale", False):
        inputs["S"] = draw(scale_shape(wl))
    if getattr(wl, "in_response", 0):  # G, L2 norms (>= 0); gamma and the constant added, in Rg's (2 * C4, 4) rows
        inputs["S"] = np.abs(inputs["S"]) + 0.1
        c4 = -(-wl.data[1] // 4)
        inputs["Rg"] = np.concatenate([rng.standard_normal((c4, 4)), 1.0 + 0.1 * rng.standard_normal((c4, 4))]
                                      ).astype(np.float32)
    for i, p in enumerate(getattr(wl, "in_read", ())):  # the parts' sources, not the logical input
        inputs["X" if i == 0 else f"X{i}"] = draw((wl.data[0], p[9], p[1], p[2]))
    return inputs


def texture_scopes(wl, info, operands) -> str:
    """``texture`` when the device has images (and half images for float16 storage), every ``(layout,
    shape)`` operand fits its image2d limits, and it is a GPU (PoCL emulates image reads in software);
    otherwise ``buffer``."""
    from tuner.search_space import image_fits
    ok = (info.image_support and info.type == "GPU" and (wl.dtype == "float32" or info.half_images)
          and all(image_fits(layout, shape, info) for layout, shape in operands))
    return "texture" if ok else "buffer"


GPU_ITEMS_PER_UNIT = 1024  # work-items a GPU's compute unit keeps in flight: what a fallback config aims to fill


def gpu_fill_target(info) -> int:
    """Work-items a fallback config aims for on ``info``: ``GPU_ITEMS_PER_UNIT`` per compute unit on a GPU, 0
    elsewhere (a CPU device's fallback does not shrink its tiles to fill it)."""
    return info.compute_units * GPU_ITEMS_PER_UNIT if info.type == "GPU" else 0


def fit_work_group(n_w: int, n_h: int, info, want_w: int = 16, want_h: int = 4) -> tuple:
    """A power-of-two work-group no wider than the work (rounded up) and within the device's maximum."""
    pow2 = lambda n, cap: min(cap, 1 << max(0, (n - 1).bit_length()))  # noqa: E731
    wg_w = pow2(n_w, min(want_w, info.max_work_item_sizes[0], info.max_work_group_size))
    wg_h = pow2(n_h, min(want_h, info.max_work_item_sizes[1], info.max_work_group_size // wg_w))
    return wg_w, wg_h


def _log2(x) -> float:
    return math.log2(max(float(x), 1.0))


def window_features(v: dict, k: dict, oc: int, blocks: int, lanes: int) -> dict:
    """Cost-model features of a window template's config: a work-item computes ``oc`` channel blocks (of
    ``blocks``) by tile_oh x tile_ow outputs, ``lanes`` multiply-adds per channel block and tap (16 for a
    full conv: 4 input lanes x 4 output channels; 4 for depthwise)."""
    tile = oc * k["tile_oh"] * k["tile_ow"]
    n_ow, n_oh = math.ceil(v["OW"] / k["tile_ow"]), math.ceil(v["OH"] / k["tile_oh"])  # tiles along a row, a column
    items = v["N"] * math.ceil(blocks / oc) * n_oh * n_ow
    wg = k["wg_w"] * k["wg_h"]
    reads = k["tile_oh"] * k["tile_ow"] + oc * lanes // 4  # input pixels per tap against the weights they meet
    # work-items launched per useful one: the grid rounds each axis up to whole work-groups (a 32-wide group
    # over 5 tiles of a row launches 32)
    launch = math.ceil(n_ow / k["wg_w"]) * k["wg_w"] * math.ceil(n_oh / k["wg_h"]) * k["wg_h"] / (n_ow * n_oh)
    return {"work_per_item": _log2(tile), "wg_size": _log2(wg), "items": _log2(items), "groups": _log2(items / wg),
            "launch_waste": launch,
            "bytes_per_mac": 16 * reads / (tile * lanes), "registers": 4 * tile + 4 * reads,
            "padding_waste": n_ow * k["tile_ow"] / v["OW"],
            "local_input": float(k.get("local_input", False)), "half": float(k.get("compute", "float32") != "float32")}


def is_depthwise(data: tuple, kernel: tuple, groups: int) -> bool:
    """One filter per channel (groups == C == O, one input channel per group): depthwise_conv2d's node."""
    return groups == data[1] == kernel[0] and kernel[1] == 1


def window_fields(node) -> dict:
    """A conv2d graph node's window: stride, padding, dilation."""
    a = node.attrs
    return dict(stride=tuple(a["stride"]), padding=tuple(a["padding"]), dilation=tuple(a["dilation"]))


# a model's kernels exchange NCHW4c activations: the layout is pinned, not tuned
MODEL_KNOBS = {"act_layout": "nchw4c"}
