"""What imports what: `import tuner` loads no OpenCL, a compile for a target profile runs where pyopencl cannot
be imported, pyopencl is imported only by the modules that run kernels, and the import cycles between modules
are the known ones (a list that may only shrink).

The graph is read from the source with ``ast`` (every import statement, those inside functions included), so
it does not depend on which code paths a test happens to run."""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Folders of the package `tuner` (pyproject's package-dir maps templates/ and search_space/ into it).
SOURCES = ((ROOT / "tuner", "tuner"), (ROOT / "templates", "tuner.templates"),
           (ROOT / "search_space", "tuner.search_space"))

# A phone GPU that is not attached anywhere here: compiling for it must need no OpenCL at all.
PROFILE = {"index": 0, "platform": "ARM Platform", "name": "Mali-G78", "type": "GPU",
           "driver_version": "v1.r32p1", "opencl_version": "OpenCL 3.0 v1.r32p1", "image_support": True,
           "image2d_max_width": 65536, "image2d_max_height": 65536, "max_work_group_size": 512,
           "max_work_item_sizes": [512, 512, 512], "local_mem_bytes": 32768, "global_mem_bytes": 7 << 30,
           "max_mem_alloc_bytes": 1 << 30, "compute_units": 20, "fp16": True, "half_images": True}


# -- running imports in a clean process ----------------------------------------------------------------------
# pyopencl made unimportable: a finder ahead of every other that refuses it (and its submodules), and says
# which line of ours asked, so that a failure names the import to defer.
NO_PYOPENCL = textwrap.dedent("""
    import sys, traceback

    class NoPyopencl:
        def find_spec(self, name, path=None, target=None):
            if name == "pyopencl" or name.startswith("pyopencl."):
                ours = [f"{f.filename}:{f.lineno}: {f.line}" for f in traceback.extract_stack()
                        if "/tuner/" in f.filename or "/templates/" in f.filename]
                raise ImportError("pyopencl is unimportable here; imported from " + " <- ".join(ours[::-1][:3]))
            return None

    sys.meta_path.insert(0, NoPyopencl())
""")


def _python(code: str, tmp_path, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "OCL_ICD_VENDORS"}
    env.update({"PYTHONPATH": str(ROOT), "XDG_CACHE_HOME": str(tmp_path / "cache"), **(env_extra or {})})
    return subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)


def test_import_tuner_loads_no_opencl(tmp_path):
    """`import tuner` (and the profile module, and the runtime package alone) imports no pyopencl, writes no ICD
    folder and leaves OCL_ICD_VENDORS as it was: only opening a device does that."""
    code = textwrap.dedent("""
        import os, sys
        before = os.environ.get("OCL_ICD_VENDORS")
        import tuner, tuner.target, tuner.runtime
        from tuner.runtime import DeviceInfo
        assert DeviceInfo is tuner.target.DeviceInfo is tuner.DeviceInfo
        loaded = sorted(m for m in sys.modules if m == "pyopencl" or m.startswith(("pyopencl.", "tuner.runtime.")))
        assert not loaded, loaded
        assert os.environ.get("OCL_ICD_VENDORS") == before, (before, os.environ.get("OCL_ICD_VENDORS"))
        assert not os.path.exists(os.path.join(os.environ["XDG_CACHE_HOME"], "tuner", "icd"))
        print("ok")
    """)
    for vendors in (None, str(tmp_path / "vendors")):  # unset, and set to a folder of the user's
        r = _python(code, tmp_path, {"OCL_ICD_VENDORS": vendors} if vendors else None)
        assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]


def test_lazy_names_still_resolve(tmp_path):
    """The names `tuner`, `tuner.runtime` and `tuner.runtime.opencl` load on first use are all there (and the
    OpenCL ones do load it)."""
    code = textwrap.dedent("""
        import sys, tuner, tuner.runtime, tuner.runtime.opencl
        for mod in (tuner, tuner.runtime, tuner.runtime.opencl):
            missing = [n for n in mod.__all__ if not callable(getattr(mod, n, None)) and n != "__version__"]
            assert not missing, (mod.__name__, missing)
        assert "pyopencl" in sys.modules
        print("ok")
    """)
    r = _python(code, tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]


def test_load_profile_without_pyopencl(tmp_path):
    (tmp_path / "phone.json").write_text(json.dumps(PROFILE))
    code = NO_PYOPENCL + textwrap.dedent("""
        from tuner.target import load_profile
        info = load_profile("phone.json")
        assert load_profile(info.to_dict()) == info and info.name == "Mali-G78"
        print(info.fingerprint)
    """)
    r = _python(code, tmp_path)
    assert r.returncode == 0 and r.stdout.startswith("arm-gpu-"), r.stderr[-3000:]


def test_compile_for_a_target_without_pyopencl(tmp_path):
    """compile_model(target=profile) plans, picks configs and generates kernels with no OpenCL installed: the
    laptop that compiles for a phone need not have a driver."""
    code = NO_PYOPENCL + textwrap.dedent(f"""
        import tuner
        from tuner.zoo import models as zoo
        mod = tuner.compile_model(zoo.test_models()["mixed"], target={PROFILE!r})
        assert mod.device is None and mod.target.name == "Mali-G78"
        mod.save("artifact")
        assert "pyopencl" not in sys.modules
        print("ok", len(mod.spec.nodes))
    """)
    r = _python(code, tmp_path)
    assert r.returncode == 0 and r.stdout.startswith("ok"), r.stderr[-3000:]
    assert (tmp_path / "artifact" / "graph.json").is_file() and (tmp_path / "artifact" / "manifest.json").is_file()


# -- the import graph, from the source ---------------------------------------------------------------------------
def _modules() -> dict[str, tuple[Path, bool]]:
    """Dotted name -> (file, is a package) for every module of the package."""
    out = {}
    for base, prefix in SOURCES:
        for path in sorted(base.rglob("*.py")):
            parts = list(path.relative_to(base).with_suffix("").parts)
            is_pkg = parts[-1] == "__init__"
            out[".".join([prefix, *(parts[:-1] if is_pkg else parts)])] = (path, is_pkg)
    return out


MODULES = _modules()


class _Imports(ast.NodeVisitor):
    """Every import of one module as ``(imported module, where, line)``: where is "module" (runs on import),
    "function" (runs when called) or "typing" (under ``if TYPE_CHECKING:``, never runs)."""

    def __init__(self, name: str, is_pkg: bool):
        self.package = name if is_pkg else name.rpartition(".")[0]
        self.where, self.found = "module", []

    def _nested(self, node, where):
        outer, self.where = self.where, where if self.where == "module" else self.where
        self.generic_visit(node)
        self.where = outer

    def visit_FunctionDef(self, node):
        self._nested(node, "function")

    visit_AsyncFunctionDef = visit_Lambda = visit_FunctionDef

    def visit_If(self, node):
        test = node.test
        if (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
                isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"):
            outer, self.where = self.where, "typing"
            for n in node.body:
                self.visit(n)
            self.where = outer
            for n in node.orelse:
                self.visit(n)
        else:
            self.generic_visit(node)

    def visit_Import(self, node):
        self.found.extend((a.name, self.where, node.lineno) for a in node.names)

    def visit_ImportFrom(self, node):
        if node.level:  # relative: `from ..x import y` in package p.q resolves against p
            base = self.package.split(".")[:len(self.package.split(".")) - node.level + 1]
            module = ".".join(base + ([node.module] if node.module else []))
        else:
            module = node.module
        subs = [f"{module}.{a.name}" for a in node.names if f"{module}.{a.name}" in MODULES]
        self.found.extend((s, self.where, node.lineno) for s in subs)  # `from pkg import submodule`
        if len(subs) < len(node.names):
            self.found.append((module, self.where, node.lineno))


def _imports_of(name: str) -> list[tuple[str, str, int]]:
    path, is_pkg = MODULES[name]
    v = _Imports(name, is_pkg)
    v.visit(ast.parse(path.read_text(), str(path)))
    return v.found


IMPORTS = {m: _imports_of(m) for m in MODULES}


def _ours(target: str) -> str | None:
    """The module of ours that importing ``target`` runs (``tuner.x.y.Name`` -> ``tuner.x.y``), or None."""
    while target and target not in MODULES:
        target = target.rpartition(".")[0]
    return target or None


def _where(name: str, line: int) -> str:
    return f"{MODULES[name][0].relative_to(ROOT)}:{line}"


def test_the_graph_resolves_relative_and_function_level_imports():
    found = {(t, w) for t, w, _ in IMPORTS["tuner.compile.compiler"]}
    assert ("tuner.runtime.module", "module") in found  # `import tuner.runtime.module as M`
    assert ("tuner.plan.lower", "module") in found  # `from tuner.plan.lower import choose_templates, ...`
    assert ("tuner.runtime.opencl.device", "function") in found  # plan_model's `from tuner.runtime.opencl.device ...`
    agent = {(t, w) for t, w, _ in IMPORTS["tuner.agent.runtime"]}
    assert ("tuner.agent.protocol", "module") in agent  # `from .protocol import ...`
    launch = {(t, w) for t, w, _ in IMPORTS["tuner.runtime.opencl.launch"]}
    assert ("pyopencl", "function") in launch and ("pyopencl", "module") not in launch
    assert ("tuner.runtime.opencl.device", "typing") in launch  # `if TYPE_CHECKING: from .device import Device`


# pyopencl is for the code that runs kernels: the local OpenCL backend (tuner/runtime/opencl/) and the measuring
# workers (tuner/measure/). The executor of a compiled model runs on any Runtime (tuner.runtime.base); choosing a
# device, planning, templates, logs, search and compiling for a target import none.
PYOPENCL_FOLDERS = ("tuner/runtime/opencl/", "tuner/measure/")


def _pyopencl_imports(path: Path) -> list[int]:
    """The lines of ``path`` that import pyopencl or a submodule of it, at any depth (inside functions, classes,
    ``if`` and ``try`` blocks): ``import pyopencl``, ``from pyopencl... import``, and
    ``importlib.import_module("pyopencl")`` or ``__import__("pyopencl")`` with the name written out."""
    def ours(name) -> bool:
        return isinstance(name, str) and name.split(".")[0] == "pyopencl"
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found = any(ours(a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            found = not node.level and ours(node.module)
        elif isinstance(node, ast.Call):
            fn = node.func
            name = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else ""
            found = name in ("import_module", "__import__") and bool(node.args) and isinstance(
                node.args[0], ast.Constant) and ours(node.args[0].value)
        else:
            continue
        if found:
            lines.append(node.lineno)
    return sorted(lines)


def test_pyopencl_is_imported_only_in_the_opencl_backend_and_the_measuring_workers():
    """Every file of the package is read with ``ast``: one that imports pyopencl outside tuner/runtime/opencl/ and
    tuner/measure/ fails the test, named with its lines."""
    wrong, seen = [], 0
    for base, _ in SOURCES:
        for path in sorted(base.rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            lines = _pyopencl_imports(path)
            seen += bool(lines)
            if lines and not rel.startswith(PYOPENCL_FOLDERS):
                wrong.append(f"{rel}:{','.join(map(str, lines))}")
    assert not wrong, ("pyopencl imported outside " + " and ".join(PYOPENCL_FOLDERS) + " (move the code that needs "
                       "it into the OpenCL backend, or ask a Runtime): " + ", ".join(wrong))
    assert seen >= 2  # the scan finds the imports that are there (the backend's, the workers')


def test_the_pyopencl_scan_finds_imports_at_any_depth(tmp_path):
    f = tmp_path / "m.py"
    f.write_text(textwrap.dedent("""
        import os, pyopencl as cl
        def f():
            if True:
                from pyopencl.array import Array
        class C:
            def g(self):
                import importlib
                return importlib.import_module("pyopencl.tools"), __import__("pyopencl")
        from . import pyopencl_like
        import pyopencl_not
    """))
    assert _pyopencl_imports(f) == [2, 5, 9, 9]


def test_the_runtime_does_not_depend_on_its_opencl_backend():
    """tuner.runtime's interface, executor and device choice import nothing of tuner.runtime.opencl (the backend
    depends on them, not the other way), but for the executor's default: a local OpenCL device when it is given
    no Runtime (``module._open_for``, at call time)."""
    found = [(m, t, where) for m, imps in IMPORTS.items() for t, where, _ in imps
             if (m == "tuner.runtime" or m.startswith("tuner.runtime.")) and not m.startswith("tuner.runtime.opencl")
             and (t == "tuner.runtime.opencl" or t.startswith("tuner.runtime.opencl."))]
    assert {(m, where) for m, _, where in found} <= {("tuner.runtime.module", "function")}, found


def _loaded_on_import(start: str) -> set[str]:
    """Every module (ours and outside) that importing ``start`` imports: module-level imports, followed."""
    seen, todo, out = set(), [start], set()
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        parts = m.split(".")
        todo.extend(".".join(parts[:i]) for i in range(1, len(parts)) if ".".join(parts[:i]) in MODULES)  # parents
        for t, where, _ in IMPORTS[m]:
            if where != "module":
                continue
            ours = _ours(t)
            if ours is None:
                out.add(t.split(".")[0])
            else:
                todo.append(ours)
    return out | seen


@pytest.mark.parametrize("start", ["tuner", "tuner.target", "tuner.runtime", "tuner.runtime.choice",
                                   "tuner.runtime.opencl", "tuner.runtime.opencl.launch",
                                   "tuner.compile.compiler", "tuner.runtime.module", "tuner.templates"])
def test_modules_that_need_no_device_import_no_opencl(start):
    """Importing these runs no pyopencl import and no ICD registration (tuner.runtime.opencl.icd)."""
    loaded = _loaded_on_import(start)
    assert not {"pyopencl", "tuner.runtime.opencl.icd", "tuner.runtime.opencl.device"} & loaded, sorted(loaded)


def _strongly_connected(edges: dict[str, set[str]]) -> list[set[str]]:
    """The cycles of a directed graph: its strongly connected components of more than one node (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def _graph(node_of) -> tuple[dict, dict]:
    """Edges between ``node_of(module)`` nodes over every import that runs (module- and function-level), and
    the lines that make each edge. tuner.ir is left out: its expression and statement modules refer to each
    other by design, and nothing in it imports the layers above."""
    edges, why = {}, {}
    for m, imps in IMPORTS.items():
        for t, where, line in imps:
            ours = _ours(t)
            if where == "typing" or ours is None:
                continue
            a, b = node_of(m), node_of(ours)
            if a and b and a != b:
                edges.setdefault(a, set()).add(b)
                why.setdefault((a, b), []).append(_where(m, line))
    return edges, why


def _module_node(m: str) -> str | None:
    return None if m == "tuner.ir" or m.startswith("tuner.ir.") else m


def _package_node(m: str) -> str | None:
    """tuner.plan.lower -> tuner.graph; tuner itself (__init__: errors and the lazy table) is no layer."""
    node = ".".join(m.split(".")[:2])
    return None if node in ("tuner", "tuner.ir") else node


# The import cycles of today, found by the walk below (function-level imports included: they are what let
# these cycles import at all). THIS LIST MUST ONLY SHRINK: a new cycle fails the test; one that is broken
# fails it too, until its entry here is removed or narrowed.
ALLOWED_MODULE_CYCLES: list = []  # none outside ir/ (README, Architecture)
ALLOWED_PACKAGE_CYCLES: list = []  # the packages form a DAG (README, Architecture)


def _check_cycles(node_of, allowed: list[set[str]]) -> None:
    edges, why = _graph(node_of)
    found = _strongly_connected(edges)

    def show(cycle):
        lines = [f"    {a} -> {b}: {', '.join(why[a, b][:3])}" for a in sorted(cycle) for b in sorted(edges[a])
                 if b in cycle]
        return f"  {sorted(cycle)}\n" + "\n".join(lines)
    new = [c for c in found if not any(c <= a for a in allowed)]
    assert not new, "new import cycles (import inside the function that needs it, or move the shared code " \
                    "down a layer):\n" + "\n".join(show(c) for c in new)
    stale = [a for a in allowed if not any(c == a for c in found)]
    assert not stale, ("import cycles broken or narrowed, well done: update the allowed list to what is left "
                       f"({[sorted(c) for c in found]}):\n" + "\n".join(f"  {sorted(a)}" for a in stale))


def test_import_cycles_between_modules_are_only_the_known_ones():
    _check_cycles(_module_node, ALLOWED_MODULE_CYCLES)


def test_import_cycles_between_packages_are_only_the_known_ones():
    _check_cycles(_package_node, ALLOWED_PACKAGE_CYCLES)


def test_the_cycle_finder_finds_cycles():
    assert sorted(map(sorted, _strongly_connected({"a": {"b"}, "b": {"c", "a"}, "c": {"d"}, "d": {"c"},
                                                    "e": {"a"}}))) == [["a", "b"], ["c", "d"]]
