"""Damaged artifacts every runtime must refuse (docs/artifact.md, "The checks every runtime makes").

``damaged_artifacts(good_dir, tmp_path)`` copies a good artifact (without its ``binaries/``) once per case,
damages the copy and returns ``[(case, dir, file)]``: the runtime must refuse ``dir`` with a message that
names ``file``. Used by tests/test_native_runtime.py (tuner-run: exit status 2) and by the Python executor's
tests. Cases that edit graph.json rewrite the manifest to match, so the damage gets past check 1 and must be
caught by the check it is aimed at.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
from pathlib import Path


def _copy(good: Path, dst: Path) -> Path:
    shutil.copytree(good, dst, ignore=shutil.ignore_patterns("binaries", "profile.json"))
    return dst


def _reseal(d: Path) -> None:
    """Rewrite manifest.json's size and SHA-256 of every file it lists (after an edit on purpose)."""
    m = json.loads((d / "manifest.json").read_text())
    for f in m["files"]:
        data = (d / f["path"]).read_bytes()
        f["size"], f["sha256"] = len(data), hashlib.sha256(data).hexdigest()
    (d / "manifest.json").write_text(json.dumps(m, indent=1))


def _edit_graph(d: Path, edit) -> None:
    g = json.loads((d / "graph.json").read_text())
    edit(g)
    (d / "graph.json").write_text(json.dumps(g, indent=1))
    _reseal(d)


def _kernel_files(d: Path) -> list:
    return sorted(p.name for p in (d / "kernels").glob("k*.cl"))


def _largest_operand(g: dict) -> int:
    shapes = [e["physical_shape"] for e in g["entries"].values()]
    shapes += [b["physical_shape"] for b in g["params"] + g["workspaces"]]
    return max(math.prod(s) for s in shapes)


def _plant_launch(g: dict) -> None:
    """The first call's global size far past 16 work-items per element of any operand (still a multiple of its
    local size)."""
    call = g["nodes"][0]["calls"][0]
    local = call["local_size"]
    groups = 16 * _largest_operand(g) // local[0] + 1
    call["global_size"] = [local[0] * groups, call["global_size"][1], call["global_size"][2]]


def _swap_params(d: Path) -> None:
    """A params.bin of the same size with other bytes (another model's weights, as a copy mix-up would give)."""
    data = bytearray((d / "params.bin").read_bytes())
    half = len(data) // 2
    data[:half], data[half:2 * half] = data[half:2 * half], data[:half]
    if len(data) >= 2 and data[:half] == data[half:2 * half]:
        data[0] ^= 0xFF
    (d / "params.bin").write_bytes(bytes(data))


def _retarget_pool(g: dict) -> None:
    name = next(iter(g["entries"]))
    g["entries"][name]["storage_id"] = max(p["storage_id"] for p in g["pools"]) + 1000


def damaged_artifacts(good_dir, tmp_path) -> list:
    """[(case name, damaged artifact dir, file name its refusal must name)] from the good artifact ``good_dir``."""
    good, root = Path(good_dir), Path(tmp_path) / "damaged"
    root.mkdir(parents=True, exist_ok=True)
    kernels = _kernel_files(good)
    k_trunc, k_missing = kernels[min(1, len(kernels) - 1)], kernels[-1]
    cases = []

    d = _copy(good, root / "truncated_kernel")
    src = (d / "kernels" / k_trunc).read_bytes()
    (d / "kernels" / k_trunc).write_bytes(src[: len(src) // 2])
    cases.append(("truncated_kernel", d, k_trunc))

    d = _copy(good, root / "swapped_params")
    _swap_params(d)
    cases.append(("swapped_params", d, "params.bin"))

    d = _copy(good, root / "edited_graph")
    _edit_graph(d, _retarget_pool)
    cases.append(("edited_graph", d, "graph.json"))

    d = _copy(good, root / "missing_kernel")
    (d / "kernels" / k_missing).unlink()
    cases.append(("missing_kernel", d, k_missing))

    d = _copy(good, root / "planted_global_size")
    _edit_graph(d, _plant_launch)
    cases.append(("planted_global_size", d, "graph.json"))

    d = _copy(good, root / "empty_outputs")
    _edit_graph(d, lambda g: g.__setitem__("outputs", []))
    cases.append(("empty_outputs", d, "graph.json"))

    d = _copy(good, root / "missing_manifest")
    (d / "manifest.json").unlink()
    cases.append(("missing_manifest", d, "manifest.json"))

    d = _copy(good, root / "unknown_argument")
    _edit_graph(d, lambda g: g["nodes"][0]["calls"][0]["args"].__setitem__(0, "t:no such tensor"))
    cases.append(("unknown_argument", d, "graph.json"))

    d = _copy(good, root / "format_version_1")
    _edit_graph(d, lambda g: g.__setitem__("version", 1))
    cases.append(("format_version_1", d, "graph.json"))

    d = _copy(good, root / "undefined_kernel")
    _edit_graph(d, lambda g: g["nodes"][0]["calls"][0].__setitem__("kernel", "not_in_the_source"))
    cases.append(("undefined_kernel", d, "graph.json"))

    def edit(case: str, how) -> None:
        d = _copy(good, root / case)
        _edit_graph(d, how)
        cases.append((case, d, "graph.json"))

    def text(case: str, how) -> None:  # graph.json edited as text (what json.loads would accept, or not)
        d = _copy(good, root / case)
        old = (d / "graph.json").read_text()
        new = how(old)
        assert new != old, case
        (d / "graph.json").write_text(new)
        _reseal(d)
        cases.append((case, d, "graph.json"))

    d = _copy(good, root / "kernel_from_another_node")  # a kernel file replaced by another of the same name
    (d / "kernels" / kernels[0]).write_bytes((good / "kernels" / kernels[-1]).read_bytes())
    cases.append(("kernel_from_another_node", d, kernels[0]))
    d = _copy(good, root / "params_a_fifo")
    (d / "params.bin").unlink()
    os.mkfifo(d / "params.bin")
    cases.append(("params_a_fifo", d, "params.bin"))
    d = _copy(good, root / "manifest_nested")
    (d / "manifest.json").write_text("[" * 100000)
    cases.append(("manifest_nested", d, "manifest.json"))
    edit("int32_weights", lambda g: g["params"][0].__setitem__("dtype", "int32"))
    edit("output_edited_to_float16", lambda g: g["entries"][g["outputs"][0]].__setitem__("dtype", "float16"))
    edit("nodes_reversed", lambda g: g["nodes"].reverse())
    edit("launch_1x1x1", lambda g: _first_tuned_call(g).__setitem__("global_size", [1, 1, 1]))
    edit("launch_2d", lambda g: _first_tuned_call(g).__setitem__("global_size", [3, 5]))
    edit("pool_shrunk", lambda g: g["pools"][0].__setitem__("shape", [16]))
    edit("kernel_path_escapes", lambda g: g["nodes"][0].__setitem__("source", "../../etc/passwd"))
    edit("shape_a_string", lambda g: g["pools"][0].__setitem__("shape", "16"))
    text("duplicate_key", lambda t: t.replace('{\n "format"', '{\n "dtype": "float32",\n "format"', 1))
    text("nan_literal", lambda t: __import__("re").sub(r'"flops": [0-9.eE+-]+', '"flops": NaN', t, count=1))
    text("trailing_comma", lambda t: t.rstrip().rstrip("}") + ",}")
    text("float_in_a_shape", lambda t: t.replace('"shape": [\n    1,', '"shape": [\n    1.0,', 1))

    d = _copy(good, root / "kernel_with_nul")
    (d / "kernels" / kernels[0]).write_bytes(b"\0" + (d / "kernels" / kernels[0]).read_bytes())
    _reseal(d)
    cases.append(("kernel_with_nul", d, kernels[0]))
    d = _copy(good, root / "kernel_a_symlink")
    outside = root / f"outside_{kernels[0]}"
    shutil.move(d / "kernels" / kernels[0], outside)
    (d / "kernels" / kernels[0]).symlink_to(outside)
    cases.append(("kernel_a_symlink", d, kernels[0]))
    edit("written_argument_passed_twice", _alias_a_written_argument)
    # a terminal escape in a string tuner-run --profile prints (config_source: known kinds, printable, bounded)
    edit("config_source_escape", lambda g: next(n for n in g["nodes"] if n.get("template")).__setitem__(
        "config_source", "tuned\x1b]0;owned\x07"))
    d = _copy(good, root / "param_shrunk")  # issue 36: a weight blob shrunk, params.bin cut to match, resealed
    _shrink_last_param(d)
    cases.append(("param_shrunk", d, "graph.json"))
    if _input_pool_reused(json.loads((good / "graph.json").read_text())):  # a buffer plan: pools are shared
        edit("output_overwritten", lambda g: g.__setitem__("outputs", [g["inputs"][0]]))
    return cases


def _shrink_last_param(d: Path) -> None:
    """The weight blob stored last, halved in graph.json and params.bin alike, the manifest resealed: every size
    agrees with every other, only the kernel that reads it was generated for more (a read past its end)."""
    g = json.loads((d / "graph.json").read_text())
    b = max(g["params"], key=lambda p: p["offset"])
    phys = b["physical_shape"]
    if len(phys) == 1:
        b["physical_shape"] = [max(1, phys[0] // 2)]
    elif phys[0] > 1:
        b["physical_shape"] = [phys[0] // 2, *phys[1:]]
    else:
        b["physical_shape"] = [phys[0], max(1, phys[1] // 2), *phys[2:]]
    b["nbytes"] = b["nbytes"] * math.prod(b["physical_shape"]) // math.prod(phys)
    (d / "graph.json").write_text(json.dumps(g, indent=1))
    with open(d / "params.bin", "r+b") as f:
        f.truncate(b["offset"] + b["nbytes"])
    _reseal(d)


def _input_pool_reused(g: dict) -> bool:
    """Whether a kernel writes another tensor into the input's pool. Then naming the input as the output
    (issue 36) made both runtimes return data that is not that tensor."""
    x = g["inputs"][0]
    pool = g["entries"][x]["storage_id"]
    return any(a.startswith("t:") and a[2:] != x and g["entries"][a[2:]]["storage_id"] == pool
               for n in g["nodes"] for c in n["calls"] for a in c["args"])


def _alias_a_written_argument(g: dict) -> None:
    """A call that reads the tensor it writes: the written argument also fills a read parameter."""
    for call in (c for n in g["nodes"] for c in n["calls"]):
        sig = call["signature"]
        for w, pw in enumerate(sig):
            for r, pr in enumerate(sig):
                if (pw["access"] == "write" and pr["access"] == "read" and call["args"][r].startswith("t:")
                        and (pr["kind"], pr["type"]) == (pw["kind"], pw["type"])):
                    call["args"][r] = call["args"][w]  # of the same kind: only the aliasing is wrong
                    return
    raise AssertionError("no call with a read and a written tensor of one kind")


def _first_tuned_call(g: dict) -> dict:
    return next(n for n in g["nodes"] if n.get("template"))["calls"][0]
