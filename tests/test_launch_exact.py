"""Check 11's launch (issue 54, item 4: "launch sizes must equal what the kernel's shape and config imply, not
merely fit within a bound"): every call's global size, moved by one work-group in any dimension, is refused by
both runtimes before anything runs, with the same words; the compiler's own launches pass.

Found here before the check: of a conv + relu + global-pool model at 13 x 11 (buffer and texture plans), the
input relayout launched one work-group short (320 -> 256 work-items) passed both runtimes' checks -- the hull of
what its calls write still reached the tensor's last byte, its index wrapping with % -- and both ran it: 120 of
the 1,144 input elements never written, the output off by 1e20 (the pool's old bytes). A work-group row more
than a guarded kernel needs (its work-items all turned away), and work-groups in a dimension whose position the
kernel never asks for (each repeating the first's work), passed too; they ran correctly, but were not the
kernel's launch."""
from __future__ import annotations

import json
import shutil
import subprocess
import warnings
from pathlib import Path

import numpy as np
import pytest

from artifact_corpus import _copy, _reseal

pytestmark = [pytest.mark.skipif(shutil.which("make") is None or shutil.which("gcc") is None,
                                 reason="the native runtime is built with make and gcc"),
              pytest.mark.xdist_group("launch_exact")]


@pytest.fixture(scope="module", params=["buffer", "texture"])
def art(request, tmp_path_factory, device):
    """conv 3x3 + relu + global average pool on a 1x8x13x11 input, compiled with ``scope``."""
    import onnx
    from onnx import TensorProto, helper

    import tuner
    d = tmp_path_factory.mktemp(f"launch_{request.param}")
    w = helper.make_tensor("w", TensorProto.FLOAT, [8, 8, 3, 3],
                           np.random.default_rng(0).standard_normal(576).astype(np.float32))
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1] * 4),
                           helper.make_node("Relu", ["c"], ["y"], name="relu"),
                           helper.make_node("GlobalAveragePool", ["y"], ["z"], name="gap")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 13, 11])],
                          [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 8, 1, 1])], [w])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), d / "m.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mod = tuner.compile_model(str(d / "m.onnx"), device=device, scope=request.param)
    mod.save(d / "art")
    return d / "art"


def _graph(d: Path) -> dict:
    return json.loads((d / "graph.json").read_text())


def _moves(art: Path) -> list:
    """(node, call, dimension, +1 / -1 work-group) for every call and dimension (-1 where one is left)."""
    out = []
    for i, n in enumerate(_graph(art)["nodes"]):
        for j, c in enumerate(n["calls"]):
            for d in range(3):
                for step in (1, -1):
                    if c["global_size"][d] + step * c["local_size"][d] >= c["local_size"][d]:
                        out.append((i, j, d, step))
    return out


def _check_c(native, cl_env, d: Path):
    return subprocess.run([native["tuner_run"], "--check", str(d)], capture_output=True, text=True, env=cl_env,
                          timeout=120)


def test_the_compilers_launches_pass(art, native, cl_env):
    from tuner.artifact import read_artifact
    read_artifact(art)
    r = _check_c(native, cl_env, art)
    assert r.returncode == 0, r.stderr


def test_every_launch_moved_by_one_work_group_is_refused_by_both(art, native, cl_env, tmp_path):
    from tuner.artifact import ArtifactError, read_artifact
    moves = _moves(art)
    assert len(moves) >= 12
    seen = set()
    for i, j, d, step in moves:
        t = _copy(art, tmp_path / f"{i}_{j}_{d}_{step}")
        g = _graph(t)
        c = g["nodes"][i]["calls"][j]
        c["global_size"][d] += step * c["local_size"][d]
        (t / "graph.json").write_text(json.dumps(g, indent=1))
        _reseal(t)
        with pytest.raises(ArtifactError) as e:
            read_artifact(t)
        py = str(e.value)
        assert f"nodes[{i}]" in py and "graph.json" in py, py
        r = _check_c(native, cl_env, t)
        lines = [x for x in r.stderr.splitlines() if x.startswith("error: ")]
        assert r.returncode == 2 and len(lines) == 1, (i, j, d, step, r.returncode, r.stderr)
        # the same finding in the same words (the C runtime names the file by its path)
        assert py.split("graph.json: ", 1)[1] in lines[0], (py, lines[0])
        for words in ("a launch larger than its kernel", "a launch smaller than its kernel", "addresses",
                      "does not cover"):
            if words in py:
                seen.add(words)
        shutil.rmtree(t)
    # each of the launch rules was met, not only the bounds of what the code addresses
    assert {"a launch larger than its kernel", "a launch smaller than its kernel"} <= seen, seen


def test_the_relayout_one_work_group_short_is_refused_before_it_runs(art, native, cl_env, tmp_path):
    """The finding: the input's relayout launched one work-group short ran in both runtimes, a silent wrong
    result. Now `tuner run` and tuner-run refuse it with one error line and run nothing."""
    from tuner.cli import main
    t = _copy(art, tmp_path / "short")
    g = _graph(t)
    c = g["nodes"][0]["calls"][0]
    assert c["kernel"] == "relayout" and c["global_size"][0] > c["local_size"][0], c
    c["global_size"][0] -= c["local_size"][0]
    (t / "graph.json").write_text(json.dumps(g, indent=1))
    _reseal(t)
    assert main(["run", str(t), "--repeat", "1"]) == 2
    r = subprocess.run([native["tuner_run"], str(t), "--bench", "1"], capture_output=True, text=True, env=cl_env,
                       timeout=120)
    lines = [x for x in r.stderr.splitlines() if x.startswith("error: ")]
    assert r.returncode == 2 and len(lines) == 1 and "a launch smaller than its kernel" in lines[0], r.stderr
