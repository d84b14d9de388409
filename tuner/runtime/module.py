"""The compiled model as it runs: OpenCL sources, launch shapes, an argument list per kernel, planned storage
pools per scope and packed parameters. It needs no IR, templates or ONNX file: ``Module.save(dir)`` writes the
artifact of docs/artifact.md (``manifest.json``, ``graph.json``, ``params.bin``, ``kernels/kNNN.cl``;
``tuner.artifact``); ``load_module(dir)`` verifies it and runs it in a fresh process.

Arguments of a kernel call name what they bind: ``t:<tensor>`` (an activation in its pool), ``p:<key>`` (a
packed parameter), ``w:<key>`` (a scratch workspace of one kernel, e.g. cache_input's texture).

``graph.json``'s ``device`` records the device the artifact was compiled for, with its whole profile
(``DeviceInfo.to_dict()``). A module compiled for a target that is not attached is built on its first load
there; ``load_module`` keeps the built program binaries in the user's cache (``tuner.artifact.cache``: never in the
artifact, which running leaves untouched), so later starts on that device skip the OpenCL compiler.

A device's failure while a module loads or runs (an allocation, a copy, a build, a launch refused or failed, a
wait) is a ``TunerError`` that names the node, its kernel file and the launch (kernel, global and local sizes), as
``tuner-run`` names them: ``tuner run`` prints it as one ``error:`` line and exits 2."""
from __future__ import annotations

import statistics
import time
import warnings
from pathlib import Path

import numpy as np

from tuner.artifact import (BINARIES, VERSION, ArtifactError, Blob, Call, Entry, ModuleSpec, Node, Param,  # noqa: F401
                            Pool, check_spec, read_artifact, write_artifact)
from tuner.artifact.store import layout_params
from tuner.errors import CompileError, DeviceError, TunerError

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
    the first run. ``cache_dir``: where program binaries are kept and reused (``load_module``: the user's cache,
    ``user_binary_cache``). ``load_stats`` says how the last load went: seconds, programs built from ``source``, from
    a cached ``binary``, or found in this process's ``memory``. ``together`` (without ``cache_dir``, whose binaries
    are each program's own): the programs are built several at once where the runtime can
    (``Runtime.build_together``)."""

    def __init__(self, spec: ModuleSpec, sources: dict, params: dict, device=None, cache_dir=None,
                 defer: bool = False, progress: bool = False, together: bool = True):
        self.spec, self.sources, self.params = spec, sources, params
        if any(b.offset is None for b in spec.params):  # fresh from the compiler: lay params.bin out
            layout_params(spec)
        self._params_size = max((b.offset + b.nbytes for b in spec.params), default=0)
        check_spec(spec, sources, self._params_size)  # the compiler's output obeys the artifact's checks too
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self.together = together and cache_dir is None
        self.runtime = None
        self.load_stats: dict = {}
        self._inputs: list = []  # the last inputs set: (tensor, array as uploaded), uploaded again before each timed run
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

    # -- naming what failed on the device ----------------------------------------------------------------------
    def _launch_text(self, node_index: int, call: Call) -> str:
        n = self.spec.nodes[node_index]
        return (f"node {n.name!r} (kernels/{n.source}), kernel {call.kernel!r} with global size "
                f"{list(call.global_size)} and local size {list(call.local_size)}")

    def _culprit(self, launch=None, arg: str | None = None, source: str | None = None) -> str:
        """What a failure concerns: the launch a runtime blamed (one of ``_launches``), else the first call that
        binds ``arg`` or runs a kernel of ``source``, else the whole run."""
        i = next((i for i, h in enumerate(getattr(self, "_launches", ())) if h is launch), None) \
            if launch is not None else None
        if i is None:
            i = next((j for j, (k, c) in enumerate(self._calls)
                      if (arg is not None and arg in c.args) or self.spec.nodes[k].source == source), None)
        if i is None:
            return f"a run of its {len(self._calls)} launches (the device did not say which failed)"
        return self._launch_text(*self._calls[i]) + (f", argument {arg!r}" if arg is not None else "")

    def _on_device(self, fn, *args, arg: str | None = None, **kwargs):
        """``fn(*args, **kwargs)``, a method of the runtime. A device's failure (a ``DeviceError``, or anything
        but a TunerError that a runtime lets through) becomes a DeviceError naming the node, its kernel file and
        the launch: the launch the runtime blamed, else the first that binds ``arg``."""
        try:
            return fn(*args, **kwargs)
        except DeviceError as e:
            raise DeviceError(f"{self._culprit(e.launch, arg)}: {e}", e.launch) from None
        except TunerError:
            raise
        except Exception as e:  # noqa: BLE001 - a runtime's own exception type: still the device's failure
            raise DeviceError(f"{self._culprit(None, arg)}: {type(e).__name__}: {e}") from None

    def _build(self, name: str, stats: dict):
        """The program of ``kernels/<name>``; a failed build names the file and a node that runs it."""
        rt = self.runtime
        try:
            return rt.build(self.sources[name], cache_dir=self.cache_dir, stats=stats)
        except CompileError as e:
            raise CompileError(f"{self._culprit(source=name)}: {e}", log=e.log, source=e.source,
                               options=e.options) from None
        except DeviceError as e:
            raise DeviceError(f"{self._culprit(source=name)}: {e}") from None
        except TunerError:
            raise
        except Exception as e:  # noqa: BLE001 - as _on_device
            raise DeviceError(f"{self._culprit(source=name)}: {type(e).__name__}: {e}") from None

    # -- loading -------------------------------------------------------------------------------------------
    def _load(self, progress: bool) -> None:
        spec, sources, params, rt = self.spec, self.sources, self.params, self.runtime
        self._calls = [(i, c) for i, n in enumerate(spec.nodes) for c in n.calls]  # (node index, call) per launch
        pools = {}
        for p in spec.pools:
            users = [f"t:{name}" for name, e in spec.entries.items() if e.storage_id == p.storage_id]
            arg = next((a for _, c in self._calls for a in c.args if a in users), None)
            pools[p.storage_id] = self._on_device(rt.alloc, p.scope, p.shape, p.dtype, arg=arg)
        self.arrays = {}
        for name, e in spec.entries.items():
            self.arrays[f"t:{name}"] = self._on_device(rt.view, pools[e.storage_id], e.storage_scope,
                                                       e.physical_shape, e.dtype, arg=f"t:{name}")
        for b in spec.params:
            key = f"p:{b.key}"
            self.arrays[key] = self._on_device(rt.alloc, b.scope, b.physical_shape, b.dtype, arg=key)
            self._on_device(rt.upload, self.arrays[key], params[b.key], arg=key)
        for b in spec.workspaces:
            key = f"w:{b.key}"
            self.arrays[key] = self._on_device(rt.alloc, b.scope, b.physical_shape, b.dtype, arg=key)
            if b.dtype == "int32":  # counters start at zero, and each launch leaves them so (docs/artifact.md)
                self._on_device(rt.upload, self.arrays[key], np.zeros(b.physical_shape, np.int32), arg=key)
        stats: dict = {}
        names = list(dict.fromkeys(n.source for n in spec.nodes))
        bar = None
        if progress:
            from tqdm.auto import tqdm
            bar = tqdm(total=len(names), desc="build", unit="program", dynamic_ncols=True)
        if self.together:  # a batch the runtime refuses is built one by one below, each error naming its file
            self._on_device(rt.build_together, [sources[name] for name in names])
        programs = {}
        for name in names:
            programs[name] = self._build(name, stats)
            if bar is not None:
                bar.update(1)
        if bar is not None:
            bar.close()
        self._nodes_of_launch = [i for i, _ in self._calls]  # node index of each launch
        self._launches = []  # runtime launch handles, arguments set once: a run only enqueues
        for i, c in self._calls:
            n = spec.nodes[i]
            try:
                launch = rt.prepare(programs[n.source], c.kernel, [self.arrays[a] for a in c.args],
                                    c.global_size, c.local_size)
            except TunerError as e:
                if not isinstance(e, DeviceError):
                    raise
                raise ArtifactError(f"{self._launch_text(i, c)}: cannot be set up ({e}); recompile the model") \
                    from None
            except Exception as e:  # noqa: BLE001 - a driver's refusal (no such kernel, bad arguments)
                raise ArtifactError(f"{self._launch_text(i, c)}: cannot be set up on {rt.info.name} "
                                    f"({type(e).__name__}: {e}); recompile the model") from None
            self._launches.append(launch)
        self._on_device(rt.finish)  # the parameters are on the device
        self.load_stats = {"programs": len(names), **{k: stats.get(k, 0) for k in ("source", "binary", "memory")}}

    # -- running -----------------------------------------------------------------------------------------
    def _enqueue(self, profiling: bool = False) -> list:
        """(OpenCL runtimes) enqueue every kernel on the run queue, or on the profiling queue to read events:
        ``[(node index, event)]``."""
        self.load()
        return list(zip(self._nodes_of_launch, self._on_device(self.runtime.enqueue, self._launches,
                                                               profiling=profiling)))

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
        staged = []
        for name, x in zip(self.spec.inputs, inputs):
            e = self.spec.entries[name]
            x = np.asarray(x)
            if x.dtype.kind not in "fiub":
                raise TunerError(f"input {name!r} holds {x.dtype} values; the model takes numbers (float32)")
            if tuple(x.shape) != tuple(e.shape):
                raise TunerError(f"input {name!r} has shape {list(x.shape)}; the model was compiled for "
                                 f"{list(e.shape)} (recompile with --input-shape to change it)")
            staged.append((name, x.reshape(e.physical_shape)))
        self._inputs = staged
        self._upload_inputs()

    def _upload_inputs(self) -> None:
        """Write the last inputs set into their tensors again. The memory plan gives a model input's storage to
        later tensors once the kernels reading it ran, so a run that follows another without this computes on
        what that run left there (values that grow run after run, which changes what some kernels cost):
        ``time`` and ``profile`` call it before every run, outside the timed span, as ``tuner-run --bench`` does."""
        for name, x in self._inputs:
            self._on_device(self.runtime.upload, self.arrays[f"t:{name}"], x, staged=True, arg=f"t:{name}")

    def get_outputs(self) -> list:
        self.load()
        return [self._on_device(self.runtime.download, self.arrays[f"t:{n}"], staged=True, arg=f"t:{n}")
                .reshape(self.spec.entries[n].shape).astype(np.float32) for n in self.spec.outputs]

    def run(self, inputs) -> list:
        """Upload ``inputs`` (a list in the model's input order, a dict by name, or one array), run every
        kernel on one queue, and return the outputs as float32 NumPy arrays."""
        self.set_inputs(inputs)
        self._on_device(self.runtime.submit, self._launches)
        return self.get_outputs()

    def time(self, repeats: int = 20, warmup: int = 2) -> list:
        """Seconds per run (wall clock of enqueuing every kernel on the run queue and waiting). Each run starts
        from the inputs last set (``set_inputs``), written again before it, outside the timed span."""
        self.load()
        rt, run = self.runtime, self._on_device
        for _ in range(warmup):
            self._upload_inputs()
            run(rt.submit, self._launches)
        run(rt.finish)
        costs = []
        for _ in range(repeats):
            self._upload_inputs()
            run(rt.finish)
            t0 = time.perf_counter()
            run(rt.submit, self._launches)
            run(rt.finish)
            costs.append(time.perf_counter() - t0)
        return costs

    def profile(self, repeats: int = 10) -> dict:
        """Per-node kernel time (median over runs, from events of the profiling queue) and the whole-run latency
        (on the run queue, as ``time``); each run from the inputs last set, written again before it."""
        per_node = [[] for _ in self.spec.nodes]
        self.load()
        self._upload_inputs()
        self._on_device(self.runtime.profile, self._launches)  # warm-up
        for _ in range(repeats):
            self._upload_inputs()
            sums: dict = {}
            for i, t in zip(self._nodes_of_launch, self._on_device(self.runtime.profile, self._launches)):
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
        """One line per node: op, scopes, and where its config came from (tuned, transferred, fallback); a
        template that launches more than one kernel (a split norm or pool: statistics, then apply) names them."""
        lines = []
        for n in self.spec.nodes:
            if n.template:
                sc = "/".join(n.scopes[k] for k in ("input", "weight", "output"))
                src = n.config_source or ("tuned" if n.tuned else "fallback")
                kernels = [c.kernel for c in n.calls]
                variant = f"  ({len(kernels)} launches: {', '.join(kernels)})" if len(kernels) > 1 else ""
                lines.append(f"{n.name:<28} {n.template:<17} {sc:<24} {src}{variant}")
        return "\n".join(lines)

    def save(self, path) -> str:
        """Write the artifact (docs/artifact.md) to ``path``, atomically: an artifact already there is replaced
        whole, a failed write leaves nothing. Loaded on a device, its programs are also kept in the user's binary
        cache for both runtimes (``keep_programs``; those built together with others are built alone for it), so
        the first run of the artifact builds nothing."""
        out = write_artifact(path, self.spec, self.sources, self.params)
        if self.runtime is not None:
            from tuner.artifact.cache import keep_programs
            keep_programs(self)
        return out


def _mb(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


def user_binary_cache() -> Path | None:
    """This user's own program-binary cache (``tuner.artifact.cache.binaries_dir``: ``$TUNER_CACHE_DIR/binaries``,
    else ``$XDG_CACHE_HOME/tuner/binaries``, else ``~/.cache/...``): where every run's binaries come from (its
    folders are made 0700 and read only while nobody else can write them; files are keyed by the source's hash).
    None where there is no home."""
    from tuner.artifact.cache import binaries_dir
    return binaries_dir()


def load_module(path, device=None, cache: bool = True, key: bytes | None = None) -> Module:
    """A saved artifact, verified (its manifest's hashes and the plan's checks, docs/artifact.md) and ready to
    run (no ONNX file, no templates needed). ``device``: a Device or spec; by default the attached device the
    artifact was compiled for, else the default device (another fingerprint warns once). ``cache``: build
    from, and keep, program binaries in this user's own cache (``user_binary_cache``), keyed by each program's
    source hash; nothing is written into ``path`` (a read-only or signed artifact runs unchanged) and a
    ``<path>/binaries/`` an older tuner left is never read. ``key``: the artifact must be signed with it
    (``tuner.artifact.signing``): the signature is checked on the manifest the artifact is then read by; the
    binaries, keyed by the verified sources' hashes, are built from them: what runs is what was verified."""
    d = Path(path)
    spec, sources, params = read_artifact(d, key)
    cache_dir = user_binary_cache() if cache else None
    return Module(spec, sources, params, device, cache_dir=cache_dir)
