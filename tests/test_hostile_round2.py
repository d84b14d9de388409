"""The second hostile sweep of issue #23 (bench/hostile_sweep.py, bench/notes/hostile-sweep.md): each case a
traceback, hang, silent wrong result or loss found there, now a clean ``error:`` (exit 2) or handled."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from tuner.errors import TunerError
from tuner.frontend.onnx import from_onnx


def _tokens_model(nodes, inits=(), opset=17, shape=(1, 8, 2, 3)):
    """input (N,C,H,W) -> tokens 'tok' (N,T,C) -> nodes."""
    n, c, hh, ww = shape
    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, list(shape))
    out = helper.make_tensor_value_info(nodes[-1].output[0], TensorProto.FLOAT, None)
    pre = [helper.make_node("Reshape", ["input", "s_tok"], ["flat"], name="flat"),
           helper.make_node("Transpose", ["flat"], ["tok"], perm=[0, 2, 1], name="tok")]
    inits = [("s_tok", np.array([n, c, hh * ww], np.int64)), *inits]
    g = helper.make_graph(pre + list(nodes), "g", [x], [out],
                          [numpy_helper.from_array(np.asarray(v), k) for k, v in inits])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize("axis", [3, 4, 7, -4])
def test_softmax_axis_past_the_rank_is_refused(axis):
    """Softmax axis=4 on a 3-D or 4-D tensor (onnxruntime refuses it) compiled, over some other axis."""
    m = _tokens_model([helper.make_node("Softmax", ["tok"], ["y"], axis=axis, name="sm")])
    with pytest.raises(TunerError, match=r"axis=-?\d on a 3-D input.*an axis in \[-3, 2\]"):
        from_onnx(m)


def test_matmul_alpha_past_float32_is_refused(capsys):
    """--alpha 1e39 is finite in Python but infinite as the kernel's float: every output was inf and the
    check failed with exit 1 and no error line."""
    from tuner.cli import main
    assert main(["op", "matmul", "--a", "2,8,12", "--b", "2,12,16", "--alpha", "1e39", "--check"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "alpha must be a float32" in err


@pytest.mark.parametrize("argv", [
    ["op", "matmul", "--a", "1,1000000,1000000", "--b", "1,1000000,1000000", "--check"],
    ["op", "conv2d", "--data", "1,100000,1000,1000", "--kernel", "4,100000,3,3", "--scope", "buffer", "--time"],
])
def test_op_past_the_device_allocation_is_refused_before_the_host_inputs(capsys, argv):
    """A workload whose buffers no device can hold: the random inputs were made on the host first, a NumPy
    MemoryError traceback (7 TiB)."""
    from tuner.cli import main
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "allocates at most" in err and "give smaller shapes" in err


def test_a_sibling_log_found_in_logs_is_applied(tmp_path, monkeypatch, device, conv3x3_onnx, capsys):
    """`compile --transfer-from FP` with FP's records only in logs/FP.jsonl (no --log): the log was found and
    read, but its records were never applied (for_device took the records before the sibling's were added):
    every layer fell back, with no word about the sibling."""
    import dataclasses
    import warnings

    from tuner.cli import main
    from tuner.compile.compiler import model_tasks
    from tuner.logs.record import Record
    model = conv3x3_onnx(16)
    sib = dataclasses.replace(device.info, name=device.info.name + " sibling")
    task = next(t for t in model_tasks(model, device.info, scope="buffer") if t.template == "conv2d")
    cfg = task.tmpl.fallback_with(task.workload, device.info, **task.knobs)
    (tmp_path / "logs").mkdir()
    rec = Record.new(task.template, task.workload, cfg, sib, costs=[1e-4])
    (tmp_path / "logs" / f"{sib.fingerprint}.jsonl").write_text(rec.to_json() + "\n")
    monkeypatch.chdir(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["compile", model, "-o", str(tmp_path / "out"), "--scope", "buffer", "--no-progress",
                     "--transfer-from", sib.fingerprint, "--device", device.fingerprint]) == 0
    assert f"1 from the records of sibling {sib.fingerprint}" in capsys.readouterr().out


@pytest.fixture
def conv_artifact(tmp_path, conv3x3_onnx, device):
    import warnings

    import tuner
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tuner.compile_model(conv3x3_onnx(8), device=device, scope="buffer").save(tmp_path / "art")
    return tmp_path / "art"


def test_run_input_npz_and_trailing_bytes_are_refused(tmp_path, conv_artifact, device, capsys):
    """An .npz given as --input gave an AttributeError traceback; a .npy with bytes after its array (two arrays
    saved into one file) ran on the first one, silently."""
    from tuner.cli import main
    x = np.ones((1, 8, 8, 8), np.float32)
    np.savez(tmp_path / "x.npz", x=x)
    with open(tmp_path / "two.npy", "wb") as f:
        np.save(f, x)
        np.save(f, 2 * x)
    for name, message in (("x.npz", "is a .npz archive (arrays: x)"), ("two.npy", "bytes after its array")):
        assert main(["run", str(conv_artifact), "--input", str(tmp_path / name), "--repeat", "1",
                     "--device", device.fingerprint]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and message in err and "Traceback" not in err


@pytest.mark.parametrize("encode", [lambda t: ("\ufeff" + t).encode("utf-8"), lambda t: t.encode("utf-16")])
def test_graph_json_in_utf16_or_with_a_bom_is_refused_as_by_tuner_run(conv_artifact, encode):
    """json.loads(bytes) takes UTF-16 and a byte order mark; tuner-run (and RFC 8259) do not: the Python
    executor ran an artifact the native runtime refuses."""
    import hashlib
    import json

    from tuner.artifact import read_artifact
    from tuner.artifact.store import ArtifactError
    g = conv_artifact / "graph.json"
    g.write_bytes(encode(g.read_text()))
    m = json.loads((conv_artifact / "manifest.json").read_text())
    for f in m["files"]:
        data = (conv_artifact / f["path"]).read_bytes()
        f["size"], f["sha256"] = len(data), hashlib.sha256(data).hexdigest()
    (conv_artifact / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ArtifactError, match="graph.json is not valid JSON"):
        read_artifact(conv_artifact)




def test_merge_refuses_a_source_that_is_no_log_and_says_when_the_source_is_the_log(tmp_path, monkeypatch, capsys):
    """`logs --merge m.onnx -o L.jsonl` merged 0 records, skipped its lines and said "the merged files can be
    deleted" (the model); `--merge L.jsonl -o L.jsonl` said L.jsonl "matches no log"."""
    from tuner.cli import main
    monkeypatch.chdir(tmp_path)
    rec = ('{"version":1,"template":"conv2d","workload":{"op":"conv2d","data":[1,8,8,8],"kernel":[8,8,3,3],'
           '"stride":[1,1],"padding":[1,1,1,1],"dilation":[1,1],"groups":1,"dtype":"float32","bias":false,'
           '"activation":"none","residual":false},"scopes":{"input":"buffer","weight":"buffer","output":"buffer"},'
           '"config":{"tile_oc":1,"tile_oh":1,"tile_ow":1,"wg_w":4,"wg_h":4,"split_c":1,"unroll_rs":false,'
           '"vec_load":1,"input_scope":"buffer","weight_scope":"buffer","output_scope":"buffer",'
           '"act_layout":"nchw4c","weight_layout":"oihw4o","cache_input":false},"device":"pocl-cpu-e66d8a71",'
           '"device_name":"x","platform":"y","driver":"z","costs":[0.001]}')
    (tmp_path / "L.jsonl").write_text(rec + "\n")
    (tmp_path / "m.onnx").write_bytes(bytes(range(256)) * 8)
    before = (tmp_path / "L.jsonl").read_bytes()
    assert main(["logs", "--merge", "m.onnx", "-o", "L.jsonl"]) == 2
    err = capsys.readouterr().err
    assert "m.onnx holds no tuning record" in err and "can be deleted" not in err
    assert (tmp_path / "L.jsonl").read_bytes() == before
    assert main(["logs", "--merge", "L.jsonl", "-o", "L.jsonl"]) == 0
    assert "is the log -o L.jsonl itself" in capsys.readouterr().err
    assert (tmp_path / "L.jsonl").read_bytes() == before


@pytest.mark.parametrize("spec", ["tcp://[::1", "tcp://[::1:7390", "tcp://[x]]:1"])
def test_tcp_spec_with_a_broken_ipv6_bracket_is_a_clean_error(capsys, spec):
    """urlsplit raised ValueError ("Invalid IPv6 URL") outside the try: a traceback."""
    from tuner.cli import main
    assert main(["devices", "--json", f"--device={spec}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "write tcp://HOST:PORT" in err


@pytest.mark.parametrize("weight", ["NaN", "Infinity", "-1", "0", '"heavy"', "true"])
def test_worker_tasks_weight_must_be_positive_and_finite(tmp_path, monkeypatch, capsys, weight):
    """A --tasks file's weight NaN was taken (the budget shared out by NaN) and tuned; a string gave a
    ValueError traceback."""
    from tuner.cli import main
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.json").write_text('[{"template":"conv2d","workload":{"op":"conv2d","data":[1,4,6,6],'
                                     '"kernel":[4,4,3,3]},"trials":1,"weight":' + weight + "}]")
    assert main(["worker", "--storage", f"sqlite:///{tmp_path / 'w.db'}", "--tasks", "t.json", "--max-trials", "1",
                 "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "weight must be a positive finite number" in err


def test_native_subcommand_errors_are_the_cli_error_line(capsys):
    """`tuner native env --bogus` said argparse's `tuner native: error: ...`; now the CLI's `error:` line."""
    from tuner.cli import main
    assert main(["native", "env", "--bogus"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unrecognized arguments: --bogus") and "Traceback" not in err
