"""Mixed precision: the compile-time precision guard of a float16 plan, and the casts of a mixed plan.

**The guard** (``check_precision``): the optimized graph runs twice on calibration inputs with the project's
NumPy reference (``tuner.graph.reference``): once in float64 (the float32 truth), once as a float16 plan stores
it -- every node's weights and output rounded to float16 (NumPy's rounding, values under float16's smallest
normal 2**-14 flushed to zero as a device without half denormals flushes them; beyond 65504 inf), arithmetic in
float, which is what ``--dtype float16`` compiles (half storage, float arithmetic). Walking the nodes in order,
each node's half output is compared with float32's:

- **overflow**: inf or NaN in half where float32 is finite;
- **flush**: more than 1% of the values float32 holds (at least 1e-3 of the tensor's largest) are below half's
  smallest normal and stored as zero, and the tensor's RMS error (``||half - float32|| / ||float32||``) is above
  the tolerance (2e-2);
- **drift**: a model output's max error ``max |half - float32| / max |float32|`` above the tolerance, or a node
  that alone (on float32's own inputs, its weights and output in half) has an RMS error above it. Drift that
  accumulates along the chain is judged at the outputs, which average it: on the zoo's MobileNetV2 one element
  mid-network is 8e-2 off while the logits are 1.1e-2 off.

The first faulty node is kept in float32 (its weights and output stored in float32, its inputs read in float32);
when that does not clear it -- the fault is in what it reads -- the nodes (or model inputs) that produce its
inputs are kept too ("the fault starts there"). The walk resumes from the earliest node changed, until no node
is faulty. Then a node that reads only float32 tensors and that only kept nodes read is kept too (half storage
between float32 nodes would cost two casts). The result is ``{name: why}``, a mixed plan's float32 set.

**The casts** (``insert_casts``): a step reads each activation in its own storage dtype; where a tensor's dtype
is not its reader's, a ``cast`` step (the relayout kernel with another output dtype) converts it once, before
its first reader, and every reader of that dtype reads the copy.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tuner.errors import TunerError
from tuner.plan.types import Plan, Step, Tensor

PRECISIONS = ("mixed", "strict", "off")
TOLERANCE = 2e-2  # per node: max |half - float32| / max |float32|
FLUSH_FRACTION = 0.01  # of the values float32 holds (|x| >= 1e-3 of the largest) that half makes zero
HALF_MAX = 65504.0
HALF_TINY = 2.0 ** -14  # float16's smallest normal: below it, a device without half denormals stores 0
MAX_CALIBRATION_FILES = 16


class PrecisionError(TunerError):
    """``--precision strict``: the float16 plan would need nodes in float32."""


# -- the guard ------------------------------------------------------------------------------------------------

def to_half(a: np.ndarray) -> np.ndarray:
    """``a`` as float16 storage holds it, back in float64: rounded to nearest, inf beyond 65504, under the
    smallest normal flushed to zero."""
    with np.errstate(over="ignore", invalid="ignore"):
        h = np.asarray(a, np.float64).astype(np.float16).astype(np.float64)
    h[np.abs(h) < HALF_TINY] = 0.0
    return h


@dataclass
class Guard:
    """What the guard found: ``kept`` ``{node or input name: why}``, the inputs it ran on (``source``), and the
    model outputs' error against float32 (max over outputs and samples) of the all-half plan and of the mixed
    plan, both as the reference emulates them."""
    kept: dict
    source: str
    nodes: int
    half_error: float
    mixed_error: float
    notes: list = field(default_factory=list)

    def summary(self) -> str:
        head = (f"precision guard ({self.source}): ")
        if not self.kept:
            return head + f"every node holds in float16 (emulated output error {self.half_error:.2g})"
        return (head + f"{len(self.kept)} of {self.nodes} nodes kept in float32, emulated output error "
                f"{self.mixed_error:.2g} (all float16: {self.half_error:.2g})")


def _error(h: np.ndarray, f: np.ndarray) -> float:
    scale = float(np.max(np.abs(f))) if f.size else 0.0
    if not np.all(np.isfinite(h)):
        return float("inf")
    diff = float(np.max(np.abs(h - f))) if f.size else 0.0
    return diff / scale if scale > 0 else (0.0 if diff == 0 else float("inf"))


def _rms_error(h: np.ndarray, f: np.ndarray) -> float:
    norm = float(np.sqrt(np.mean(np.square(f)))) if f.size else 0.0
    diff = float(np.sqrt(np.mean(np.square(h - f)))) if f.size else 0.0
    return diff / norm if norm > 0 else (0.0 if diff == 0 else float("inf"))


def _catastrophe(h: np.ndarray, f: np.ndarray, tol: float) -> str | None:
    """Overflow or flush of half value ``h`` of a tensor against float32's ``f``, or None."""
    scale = float(np.max(np.abs(f))) if f.size else 0.0
    bad = ~np.isfinite(h) & np.isfinite(f)
    if bad.any():
        return (f"overflows float16: {int(bad.sum())} of {h.size} values inf or NaN (float32's largest |x| is "
                f"{scale:.3g}; float16's largest is 65504)")
    held = np.abs(f) >= max(scale * 1e-3, np.finfo(np.float64).tiny)  # the values that matter
    lost = held & (np.abs(f) < HALF_TINY) & (h == 0)  # below half's normal range: stored as 0
    if held.any() and lost.sum() > FLUSH_FRACTION * held.sum() and _rms_error(h, f) > tol:
        return (f"flushes to zero in float16: {100.0 * lost.sum() / held.sum():.0f}% of the values float32 holds "
                f"are 0 (float32's largest |x| is {scale:.2g}; float16's smallest normal is 6.1e-05)")
    return None


class _Walk:
    """One calibration sample: float32's values of every tensor, and the half plan's for a float32 set."""

    def __init__(self, graph, inputs: dict):
        from tuner.graph.reference import OPS, _evaluate, side_outputs
        import tuner.graph.reference_movement as RM
        self.graph, self._evaluate, self._sides = graph, _evaluate, side_outputs
        self.fns = [OPS.get(n.op) or RM.PASS_OPS.get(n.op) for n in graph.nodes]
        missing = sorted({n.op for n, fn in zip(graph.nodes, self.fns) if fn is None})
        if missing:
            raise TunerError(f"the precision guard cannot evaluate operators {', '.join(missing)} (no NumPy "
                             f"reference); compile with --precision off (float16 everywhere, unchecked) or "
                             f"--dtype float32")
        self.index = {n.name: i for i, n in enumerate(graph.nodes)}
        self.outputs = set(graph.outputs)
        self.producer = {n.outputs[0]: n.name for n in graph.nodes}
        self.inputs = {x: np.asarray(inputs[x], np.float64).reshape(graph.shapes[x]) for x in graph.inputs}
        self.ref = {k: np.asarray(v, np.float64) for k, v in graph.params.items()}
        self.ref.update(self.inputs)
        for n, fn in zip(graph.nodes, self.fns):
            self.ref[n.outputs[0]] = self._evaluate(graph, n, fn, self.ref)
            self.ref.update(side_outputs(n, self.ref[n.outputs[0]], self.ref))
        self.half_params: dict = {}

    def _param(self, name: str, half: bool) -> np.ndarray:
        if not half:
            return self.ref[name]
        if name not in self.half_params:
            self.half_params[name] = to_half(self.ref[name])
        return self.half_params[name]

    def node(self, i: int, env: dict, kept: dict, exact_inputs: bool = False) -> np.ndarray:
        """Node ``i``'s stored output: its inputs as stored (float32 ones rounded when it is a half node, its cast),
        or float32's with ``exact_inputs``."""
        n = self.graph.nodes[i]
        half = n.name not in kept
        local = {}
        for t in n.inputs:
            if t in self.graph.params:
                local[t] = self._param(t, half)
            elif exact_inputs:
                local[t] = self.ref[t]
            else:
                local[t] = to_half(env[t]) if half and self._stored_float32(t, kept) else env[t]
        with np.errstate(all="ignore"):
            out = self._evaluate(self.graph, n, self.fns[i], local)
        return to_half(out) if half else out

    def _stored_float32(self, t: str, kept: dict) -> bool:
        p = self.producer.get(t)
        return (p if p is not None else t) in kept

    def _check(self, i: int, env: dict, kept: dict, tol: float, value: np.ndarray) -> str | None:
        """Why node ``i``'s stored output ``value`` is faulty, or None: it overflows or flushes; a model output
        drifts (max error); or the node alone, on float32's own inputs, drifts (RMS error)."""
        n = self.graph.nodes[i]
        y = n.outputs[0]
        f = self.ref[y]
        why = _catastrophe(value, f, tol)
        if why is not None:
            return why
        if y in self.outputs and (err := _error(value, f)) > tol:
            return f"drifts {err:.2g} from float32 in float16 (a model output's max error, tolerance {tol:g})"
        if n.name not in kept and (err := _rms_error(self.node(i, env, kept, exact_inputs=True), f)) > tol:
            return (f"drifts {err:.2g} from float32 in float16 on float32's own inputs (RMS error, tolerance "
                    f"{tol:g})")
        return None

    def run(self, kept: dict, tol: float) -> None:
        """Grow ``kept`` until no node's half output is faulty."""
        g = self.graph
        env = {x: (v if x in kept else to_half(v)) for x, v in self.inputs.items()}
        i, rounds = 0, 0
        while i < len(g.nodes):
            n = g.nodes[i]
            y = n.outputs[0]
            env[y] = self.node(i, env, kept)
            env.update(self._sides(n, env[y], self.ref))
            why = self._check(i, env, kept, tol, env[y])
            if why is None:
                i += 1
                continue
            rounds += 1
            if rounds > 4 * len(g.nodes) + 8:
                raise TunerError("the precision guard did not settle; compile with --dtype float32")
            changed = []
            if n.name not in kept:
                trial = {**kept, n.name: why}
                if self._check(i, env, trial, tol, self.node(i, env, trial)) is None:
                    kept[n.name] = why
                    changed.append(n.name)
            if not changed:  # in float32 too: what it reads carries the fault -- keep its producers in float32
                kept.setdefault(n.name, why)
                for t in n.inputs:
                    if t in g.params:
                        continue
                    p = self.producer.get(t, t)
                    if p not in kept:
                        kept[p] = f"its output feeds {n.name}, which {why}"
                        changed.append(p)
            if not changed:  # everything it reads is float32 already: accept it (the guard cannot do more)
                i += 1
                continue
            starts = [self.index.get(c, -1) for c in changed]
            if min(starts) < 0:  # a model input: stored again, the walk restarts
                env.update({x: v for x, v in self.inputs.items() if x in kept})
                i = 0
            else:
                i = min(starts)

    def output_error(self, kept: dict) -> float:
        env = {x: (v if x in kept else to_half(v)) for x, v in self.inputs.items()}
        for i, n in enumerate(self.graph.nodes):
            env[n.outputs[0]] = self.node(i, env, kept)
            env.update(self._sides(n, env[n.outputs[0]], self.ref))
        return max((_error(env[y], self.ref[y]) for y in self.graph.outputs), default=0.0)


def _fill(graph, kept: dict) -> None:
    """Keep in float32 too every node that reads only float32 tensors and whose every reader is kept: between
    float32 nodes, half storage would cost two casts and save little."""
    if not kept:
        return
    producer = {n.outputs[0]: n.name for n in graph.nodes}
    readers: dict = {}
    for n in graph.nodes:
        for t in n.inputs:
            readers.setdefault(t, []).append(n.name)
    changed = True
    while changed:
        changed = False
        for n in graph.nodes:
            if n.name in kept:
                continue
            acts = [t for t in n.inputs if t not in graph.params]
            outs = readers.get(n.outputs[0], [])
            if acts and outs and n.outputs[0] not in graph.outputs \
                    and all(producer.get(t, t) in kept for t in acts) and all(r in kept for r in outs):
                kept[n.name] = "between float32 nodes: reads only float32 tensors and only float32 nodes read it"
                changed = True


def check_precision(graph, samples: list, source: str, tol: float = TOLERANCE) -> Guard:
    """The guard over ``samples`` (dicts of input name -> array): the nodes a float16 plan keeps in float32."""
    kept: dict = {}
    walks = []
    for x in samples:
        w = _Walk(graph, x)
        w.run(kept, tol)
        walks.append(w)
    for w in walks[:-1]:  # an earlier sample, re-walked with what later ones added
        w.run(kept, tol)
    _fill(graph, kept)
    half = max(w.output_error({}) for w in walks)
    mixed = max(w.output_error(kept) for w in walks) if kept else half
    return Guard(kept, source, len(graph.nodes), half, mixed)


def calibration_inputs(graph, directory=None, seed: int = 0) -> tuple:
    """``(samples, source)``: the arrays of ``--calibration DIR`` (``.npy`` files, at most 16: for a model of one
    input each file is a sample, or a batch of samples along the first axis; else ``NAME.npy`` or
    ``NAME.<anything>.npy`` per input), or one standard-normal array per input of its own shape (``seed``)."""
    shapes = {x: tuple(graph.io_shapes.get(x, graph.shapes[x])) for x in graph.inputs}
    if directory is None:
        rng = np.random.default_rng(seed)
        return ([{x: rng.standard_normal(s) for x, s in shapes.items()}],
                f"no --calibration: random normal inputs of the model's own shape, seed {seed}")
    d = Path(directory)
    if not d.is_dir():
        raise TunerError(f"--calibration {directory}: not a folder; give a folder of .npy input arrays")
    files = sorted(p for p in d.iterdir() if p.name.endswith(".npy") and p.is_file() and not p.is_symlink())
    if not files:
        raise TunerError(f"--calibration {directory}: no .npy files in it; save inputs with numpy.save, one per "
                         f"file, of the model's input shape ({', '.join(f'{x} {list(s)}' for x, s in shapes.items())})")
    if len(files) > MAX_CALIBRATION_FILES:
        files = files[:MAX_CALIBRATION_FILES]
    per_input: dict = {x: [] for x in shapes}
    for p in files:
        if len(shapes) == 1:
            x = next(iter(shapes))
        else:
            x = p.name[:-4].split(".", 1)[0]
            if x not in shapes:
                raise TunerError(f"--calibration: {p.name} names no input of the model; name the files "
                                 f"NAME.npy or NAME.K.npy for inputs {', '.join(shapes)}")
        want = shapes[x]
        if p.stat().st_size > 8 * int(np.prod(want)) * 64 + (1 << 20):
            raise TunerError(f"--calibration: {p} is larger than 64 arrays of {x}'s shape {list(want)}")
        try:
            a = np.load(p, allow_pickle=False)
        except (ValueError, OSError) as e:
            raise TunerError(f"--calibration: {p} is not a .npy array ({e})") from None
        if a.dtype.kind not in "fiu":
            raise TunerError(f"--calibration: {p} holds {a.dtype}; give numbers (float32)")
        if a.shape == want:
            per_input[x].append(a)
        elif a.ndim == len(want) and a.shape[1:] == want[1:] and want[0] == 1:
            per_input[x].extend(a[k:k + 1] for k in range(min(a.shape[0], MAX_CALIBRATION_FILES)))
        else:
            raise TunerError(f"--calibration: {p} has shape {list(a.shape)}; input {x} takes {list(want)} (or a "
                             f"batch of them along the first axis)")
        if not np.all(np.isfinite(a)):
            raise TunerError(f"--calibration: {p} holds inf or NaN")
    short = [x for x, v in per_input.items() if not v]
    if short:
        raise TunerError(f"--calibration {directory}: no file for input(s) {', '.join(short)}")
    n = min(len(v) for v in per_input.values())
    samples = [{x: v[k] for x, v in per_input.items()} for k in range(min(n, MAX_CALIBRATION_FILES))]
    return samples, f"--calibration {os.fspath(directory)}: {len(samples)} sample(s) from {len(files)} file(s)"


def strict_error(guard: Guard) -> PrecisionError:
    names = ", ".join(guard.kept)
    lines = "\n".join(f"  {k}: {v}" for k, v in guard.kept.items())
    return PrecisionError(f"--precision strict: float16 is not safe for {len(guard.kept)} node(s) of this model "
                          f"({names}); {guard.source}:\n{lines}\nto compile anyway, keep them in float32 with "
                          f"--precision mixed (the default), or compile --dtype float32")


# -- the casts of a mixed plan --------------------------------------------------------------------------------

def insert_casts(plan: Plan) -> Plan:
    """A ``cast`` step before the first reader of each (tensor, reader dtype) pair that differ. A template step reads
    in its workload's storage dtype (a statistics kernel's output is float32, its input the norm's dtype); the
    float32 statistics tensors (``plain`` ones between steps: a norm's chunk partials, ``out_stats``) are read as
    they are by every template that takes them."""
    tensors = dict(plan.tensors)
    made: dict = {}  # (tensor, dtype) -> cast tensor name
    steps = []
    inputs_of_model = set(plan.inputs)
    for s in plan.steps:
        want = getattr(s.workload, "dtype", None) or tensors[s.output].dtype or plan.dtype
        if s.op == "relayout" and s.name.endswith(".unpack"):
            steps.append(s)  # a model output keeps its producer's dtype (the runtimes convert it)
            continue
        inputs = dict(s.inputs)
        for key, x in sorted(s.inputs.items(), key=lambda kv: kv[0] == "S"):  # a gate after what it gates
            if x not in tensors or (tensors[x].dtype or plan.dtype) == want \
                    or (tensors[x].kind == "plain" and x not in inputs_of_model):
                continue
            name = made.get((x, want))
            if name is None:
                src = tensors[x]
                name = f"{x}.{'fp32' if want == 'float32' else 'fp16'}"
                tensors[name] = Tensor(name, src.shape, src.kind, src.scope, want)
                steps.append(Step(f"{name}.cast", "cast", {"X": x}, name))
                made[(x, want)] = name
            inputs[key] = name
        steps.append(dataclasses.replace(s, inputs=inputs) if inputs != s.inputs else s)
    return dataclasses.replace(plan, steps=steps, tensors=tensors)


def build_cast(s: Step, plan: Plan, max_wg: int):
    """The cast kernel: the relayout kernel between one tensor's two storage dtypes (same shape and layout kind;
    each side in its own scope)."""
    import tuner.ops.kernels as K
    src, out = plan.tensors[s.inputs["X"]], plan.tensors[s.output]
    plain = src.kind == "plain"
    return K.relayout_kernel(src.shape, out.shape, plan.dtype_of(src.name), "buffer" if plain else src.scope,
                             src.layout, "buffer" if plain else out.scope, out.layout, max_wg,
                             out_dtype=plan.dtype_of(out.name))


def _register() -> None:
    from tuner.plan.rules import GLUE
    GLUE.setdefault("cast", build_cast)


_register()


def guard_graph(graph, precision: str = "mixed", calibration=None, tol: float = TOLERANCE) -> tuple:
    """``(graph, Guard)``: a float16 compile's graph with the nodes the guard keeps in float32 (``Graph.float32``);
    ``precision`` ``strict`` refuses them instead (PrecisionError: exit 2)."""
    if precision not in PRECISIONS:
        raise TunerError(f"--precision {precision!r}: one of {', '.join(PRECISIONS)}")
    from tuner.graph.passes_se import gates_apart, pool_maps_in_se_gates
    samples, source = calibration_inputs(graph, calibration)
    # walked with one output a node: the gates pool the depthwise convolutions' maps, not their row sums (the
    # same nodes, by name; a row sum rounds as the gate's pool of the map does)
    guard = check_precision(pool_maps_in_se_gates(gates_apart(graph)), samples, source, tol)
    if guard.kept and precision == "strict":
        raise strict_error(guard)
    return dataclasses.replace(graph, float32=dict(guard.kept)), guard
