"""The compiled model as it runs: OpenCL sources, launch shapes, an argument list per kernel, planned storage
pools per scope and packed parameters. It needs no IR, templates or ONNX file: ``Module.save(dir)`` writes the
artifact of docs/artifact.md (``manifest.json``, ``graph.json``, ``params.bin``, ``kernels/kNNN.cl``;
``tuner.artifact``); ``load_module(dir)`` verifies it and runs it in a fresh process.

Arguments of a kernel call name what they bind: ``t:<tensor>`` (an activation in its pool), ``p:<key>`` (a
packed parameter), ``w:<key>`` (a scratch workspace of one kernel, e.g. cache_input's texture).

``graph.json``'s ``device`` records the device the artifact was compiled for, with its whole profile
(``DeviceInfo.to_dict()``). A module compiled for a target that is not attached is built on its first load
there; ``load_module`` keeps the built program binaries in ``binaries/<fingerprint>/`` beside the artifact, so
later starts on that device skip the OpenCL compiler."""
from __future__ import annotations

import statistics
import time
import warnings
from pathlib import Path

import numpy as np

from tuner.artifact import (BINARIES, VERSION, ArtifactError, Blob, Call, Entry, ModuleSpec, Node, Param,  # noqa: F401
                            Pool, check_spec, read_artifact, write_artifact)
from tuner.artifact.store import layout_params
from tuner.errors import TunerError

FORMAT_VERSION = VERSION


class TargetMismatchWarning(UserWarning):
    """An artifact runs on a device with another fingerprint than the one it was compiled for."""


_MISMATCH_WARNED: set = set()  # (compiled-for fingerprint, running-on fingerprint): warned once per process


def storage_label(scopes) -> str:
    """``texture`` when every operand is a texture, ``buffer`` when every one is a buffer, else ``mixed``."""
    kinds = {"texture" if str(s).startswith("texture") else "buffer" for s in scopes}
    return kinds.pop() if len(kinds) == 1 else "mixed" if kinds else ""


def _open_for(compiled_for: dict, device):
    """The Runtime to run on: ``device`` itself when it is a Runtime (any implementation), else a local
    OpenCL one of ``device`` (a Device or spec), else of the attached device with the artifact's
    fingerprint, else of the default device."""
    from tuner.runtime.base import Runtime
    if isinstance(device, Runtime):
        return device
    from tuner.runtime.opencl.device import list_devices
    from tuner.runtime.opencl.runtime import OpenCLRuntime
    if device is None and compiled_for.get("fingerprint"):
        match = next((d for d in list_devices() if d.fingerprint == compiled_for["fingerprint"]), None)
        if match is not None:
            return OpenCLRuntime(match)
    return OpenCLRuntime(device)


class Module:
    """A model ready to run on one device: ``module.run([x]) -> [y]``. It runs on any ``Runtime``
    (``tuner.runtime.base``): ``device`` may be one, or a local OpenCL Device or spec.

    ``defer=True`` (a module compiled for a target profile): nothing is opened or built until ``load()`` or
    the first run. ``cache_dir``: where program binaries are kept and reused (``load_module``: the artifact's
    ``binaries/``). ``load_stats`` says how the last load went: seconds, programs built from ``source``, from
    a cached ``binary``, or found in this process's ``memory``."""

    def __init__(self, spec: ModuleSpec, sources: dict, params: dict, device=None, cache_dir=None,
                 defer: bool = False, progress: bool = False):
        self.spec, self.sources, self.params = spec, sources, params
        if any(b.offset is None for b in spec.params):  # fresh from the compiler: lay params.bin out
            layout_params(spec)
        self._params_size = max((b.offset + b.nbytes for b in spec.params), default=0)
        check_spec(spec, sources, self._params_size)  # the compiler's output obeys the artifact's checks too
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self.runtime = None
        self.load_stats: dict = {}
        if not defer:
            self.load(device, progress)

    @property
    def target(self):
        """The DeviceInfo the artifact was compiled for (None for artifacts that predate profiles)."""
        from tuner.target import DeviceInfo
        profile = self.spec.device.get("profile")
        return DeviceInfo.from_dict(profile) if profile else None

    @property
    def device(self):
        """The local OpenCL Device the module runs on (an OpenCLRuntime's), or its Runtime; None before load."""
        return getattr(self.runtime, "device", self.runtime)

    def load(self, device=None, progress: bool = False) -> "Module":
        """Open the device (``device``: a Runtime, Device or spec; by default the attached device the artifact
        was compiled for, else the default one), allocate the pools, upload the parameters and build every
        program. Once per module."""
        if self.runtime is not None:
            return self
        t0 = time.perf_counter()
        spec, sources = self.spec, self.sources
        rt = _open_for(spec.device, device)
        info = rt.info
        want = spec.device.get("fingerprint")
        if want not in (None, info.fingerprint) and (want, info.fingerprint) not in _MISMATCH_WARNED:
            _MISMATCH_WARNED.add((want, info.fingerprint))
            warnings.warn(f"artifact compiled for {spec.device.get('name')} ({want}), running on {info.name} "
                          f"({info.fingerprint}): its configs and storage plan were chosen for {want}; recompile "
                          f"with --device {info.fingerprint} to tune them for this one", TargetMismatchWarning,
                          stacklevel=3)
        check_spec(spec, sources, self._params_size, info.to_dict())  # launches and images fit this device
        self.runtime = rt
        try:
            self._load(progress)
        except BaseException:
            self.runtime = None  # nothing half-loaded stays behind: a later call starts over
            raise
        self.load_stats["seconds"] = time.perf_counter() - t0
        return self

    def _load(self, progress: bool) -> None:
        spec, sources, params, rt = self.spec, self.sources, self.params, self.runtime
        pools = {p.storage_id: rt.alloc(p.scope, p.shape, p.dtype) for p in spec.pools}
        self.arrays = {}
        for name, e in spec.entries.items():
            self.arrays[f"t:{name}"] = rt.view(pools[e.storage_id], e.storage_scope, e.physical_shape, e.dtype)
        for b in spec.params:
            self.arrays[f"p:{b.key}"] = rt.alloc(b.scope, b.physical_shape, b.dtype)
            rt.upload(self.arrays[f"p:{b.key}"], params[b.key])
        for b in spec.workspaces:
            self.arrays[f"w:{b.key}"] = rt.alloc(b.scope, b.physical_shape, b.dtype)
        stats: dict = {}
        names = list(dict.fromkeys(n.source for n in spec.nodes))
        bar = None
        if progress:
            from tqdm.auto import tqdm
            bar = tqdm(total=len(names), desc="build", unit="program", dynamic_ncols=True)
        programs = {}
        for name in names:
            programs[name] = rt.build(sources[name], cache_dir=self.cache_dir, stats=stats)
            if bar is not None:
                bar.update(1)
        if bar is not None:
            bar.close()
        self._nodes_of_launch = []  # node index of each launch
        self._launches = []  # runtime launch handles, arguments set once: a run only enqueues
        for i, n in enumerate(spec.nodes):
            for c in n.calls:
                try:
                    launch = rt.prepare(programs[n.source], c.kernel, [self.arrays[a] for a in c.args],
                                        c.global_size, c.local_size)
                except TunerError:
                    raise
                except Exception as e:  # noqa: BLE001 - a driver's refusal (no such kernel, bad arguments)
                    raise ArtifactError(f"kernels/{n.source}: kernel {c.kernel!r} of node {n.name!r} cannot be "
                                        f"set up on {rt.info.name} ({type(e).__name__}: {e}); recompile the "
                                        f"model") from None
                self._launches.append(launch)
                self._nodes_of_launch.append(i)
        rt.finish()  # the parameters are on the device
        self.load_stats = {"programs": len(names), **{k: stats.get(k, 0) for k in ("source", "binary", "memory")}}

    # -- running -----------------------------------------------------------------------------------------
    def _enqueue(self, profiling: bool = False) -> list:
        """(OpenCL runtimes) enqueue every kernel on the run queue, or on the profiling queue to read events:
        ``[(node index, event)]``."""
        self.load()
        return list(zip(self._nodes_of_launch, self.runtime.enqueue(self._launches, profiling=profiling)))

    def set_inputs(self, inputs) -> None:
        self.load()
        if isinstance(inputs, np.ndarray):
            inputs = [inputs]
        if isinstance(inputs, dict):
            unknown = set(inputs) - set(self.spec.inputs)
            if unknown:
                raise TunerError(f"unknown inputs {sorted(unknown)}; the model takes {self.spec.inputs}")
            inputs = [inputs.get(n) for n in self.spec.inputs]
        if len(inputs) != len(self.spec.inputs) or any(x is None for x in inputs):
            raise TunerError(f"the model takes {len(self.spec.inputs)} inputs {self.spec.inputs}, got {len(inputs)}")
        for name, x in zip(self.spec.inputs, inputs):
            e = self.spec.entries[name]
            x = np.asarray(x)
            if x.dtype.kind not in "fiub":
                raise TunerError(f"input {name!r} holds {x.dtype} values; the model takes numbers (float32)")
            if tuple(x.shape) != tuple(e.shape):
                raise TunerError(f"input {name!r} has shape {list(x.shape)}; the model was compiled for "
                                 f"{list(e.shape)} (recompile with --input-shape to change it)")
            self.runtime.upload(self.arrays[f"t:{name}"], x.reshape(e.physical_shape), staged=True)

    def get_outputs(self) -> list:
        self.load()
        return [self.runtime.download(self.arrays[f"t:{n}"], staged=True).reshape(self.spec.entries[n].shape)
                .astype(np.float32) for n in self.spec.outputs]

    def run(self, inputs) -> list:
        """Upload ``inputs`` (a list in the model's input order, a dict by name, or one array), run every
        kernel on one queue, and return the outputs as float32 NumPy arrays."""
        self.set_inputs(inputs)
        self.runtime.submit(self._launches)
        return self.get_outputs()

    def time(self, repeats: int = 20, warmup: int = 2) -> list:
        """Seconds per run (wall clock of enqueuing every kernel on the run queue and waiting; inputs already
        uploaded)."""
        self.load()
        rt = self.runtime
        for _ in range(warmup):
            rt.submit(self._launches)
        rt.finish()
        costs = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            rt.submit(self._launches)
            rt.finish()
            costs.append(time.perf_counter() - t0)
        return costs

    def profile(self, repeats: int = 10) -> dict:
        """Per-node kernel time (median over runs, from events of the profiling queue) and the whole-run latency
        (on the run queue, as ``time``)."""
        per_node = [[] for _ in self.spec.nodes]
        self.load()
        self.runtime.profile(self._launches)  # warm-up
        for _ in range(repeats):
            sums: dict = {}
            for i, t in zip(self._nodes_of_launch, self.runtime.profile(self._launches)):
                sums[i] = sums.get(i, 0.0) + t
            for i, s in sums.items():
                per_node[i].append(s)
        rows = []
        for n, costs in zip(self.spec.nodes, per_node):
            med = statistics.median(costs) if costs else 0.0
            rows.append({"node": n.name, "op": n.op, "template": n.template,
                         "scopes": ",".join(f"{k[0]}={v}" for k, v in (n.scopes or {}).items()),
                         "storage": self.node_storage(n),
                         "tuned": n.tuned, "median_s": med,
                         "gflops": n.flops / med / 1e9 if med and n.flops else None})
        latency = statistics.median(self.time(repeats))
        info = self.runtime.info
        return {"device": info.name, "fingerprint": info.fingerprint, "rows": rows,
                "kernel_total_s": sum(r["median_s"] for r in rows), "total_s": latency}

    # -- describing and saving -----------------------------------------------------------------------------
    def node_storage(self, node: Node) -> str:
        """``texture`` / ``buffer`` / ``mixed`` over a node's operands: a tuned layer's input, weight and
        output scopes; a glue kernel's tensors, parameters and workspaces."""
        if node.scopes:
            return storage_label(node.scopes.values())
        blobs = {f"p:{b.key}": b.scope for b in self.spec.params}
        blobs.update({f"w:{b.key}": b.scope for b in self.spec.workspaces})
        scopes = [self.spec.entries[a[2:]].storage_scope if a.startswith("t:") else blobs[a]
                  for c in node.calls for a in c.args]
        return storage_label(scopes)

    def memory_summary(self) -> str:
        lines = [f"{'scope':<8} {'pools':>5} {'planned':>12} {'one per tensor':>15} {'saving':>7}"]
        for scope, m in self.spec.memory.items():
            saving = 1 - m["planned"] / m["naive"] if m["naive"] else 0.0
            lines.append(f"{scope:<8} {m['pools']:>5} {_mb(m['planned']):>12} {_mb(m['naive']):>15} {saving:>6.0%}")
        return "\n".join(lines)

    def plan_summary(self) -> str:
        """One line per node: op, scopes, and where its config came from (tuned, transferred, fallback)."""
        lines = []
        for n in self.spec.nodes:
            if n.template:
                sc = "/".join(n.scopes[k] for k in ("input", "weight", "output"))
                src = n.config_source or ("tuned" if n.tuned else "fallback")
                lines.append(f"{n.name:<28} {n.template:<17} {sc:<24} {src}")
        return "\n".join(lines)

    def save(self, path) -> str:
        """Write the artifact (docs/artifact.md) to ``path``, atomically: an artifact already there is replaced
        whole, a failed write leaves nothing."""
        return write_artifact(path, self.spec, self.sources, self.params)


def _mb(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


def load_module(path, device=None, cache: bool = True) -> Module:
    """A saved artifact, verified (its manifest's hashes and the plan's checks, docs/artifact.md) and ready to
    run (no ONNX file, no templates needed). ``device``: a Device or spec; by default the attached device the
    artifact was compiled for, else the default device (another fingerprint warns once). ``cache``: build
    from, and keep, program binaries in ``<path>/binaries/``."""
    d = Path(path)
    spec, sources, params = read_artifact(d)
    return Module(spec, sources, params, device, cache_dir=d / BINARIES if cache else None)
