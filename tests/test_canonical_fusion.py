"""A residual Add fuses into the same convolution whatever the order of its operands and of the two branches
in the file (torchvision's ResNet export lists them the other way round from the zoo's): the same tasks, so
the same log applies."""
import itertools

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tuner.compile.compiler import model_tasks


def _block(tmp_path, add_order: tuple, downsample_first: bool):
    rng = np.random.default_rng(0)
    w = lambda name, *shape: helper.make_tensor(name, TensorProto.FLOAT, shape,  # noqa: E731
                                                rng.standard_normal(int(np.prod(shape))).astype(np.float32))
    main = [helper.make_node("Conv", ["x", "w1"], ["a1"], name="conv1", kernel_shape=[3, 3], pads=[1] * 4,
                             strides=[2, 2]),
            helper.make_node("Relu", ["a1"], ["r1"], name="relu1"),
            helper.make_node("Conv", ["r1", "w2"], ["a2"], name="conv2", kernel_shape=[3, 3], pads=[1] * 4)]
    down = [helper.make_node("Conv", ["x", "wd"], ["d"], name="down", kernel_shape=[1, 1], strides=[2, 2])]
    operands = {"main": "a2", "down": "d"}
    add = helper.make_node("Add", [operands[add_order[0]], operands[add_order[1]]], ["s"], name="add")
    nodes = (down + main if downsample_first else main + down) + [add, helper.make_node("Relu", ["s"], ["y"])]
    g = helper.make_graph(nodes, "block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 8, 8])],
                          [w("w1", 16, 8, 3, 3), w("w2", 16, 16, 3, 3), w("wd", 16, 8, 1, 1)])
    path = tmp_path / f"block_{'_'.join(add_order)}_{downsample_first}.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return str(path)


@pytest.mark.parametrize("scope", ["buffer", "texture"])
def test_either_operand_order_gives_the_same_tasks(tmp_path, device, scope):
    keys = {}
    for order, first in itertools.product([("main", "down"), ("down", "main")], [True, False]):
        tasks = model_tasks(_block(tmp_path, order, first), device.info, scope=scope)
        keys[(order, first)] = sorted(t.key() for t in tasks)
    assert len(set(map(tuple, keys.values()))) == 1, keys
    fused = [t for t in model_tasks(_block(tmp_path, ("down", "main"), False), device.info, scope=scope)
             if getattr(t.workload, "residual", False)]
    assert fused and {t.workload.kernel for t in fused} == {(16, 16, 3, 3)}  # the 3x3 of the main branch


def test_the_fused_block_still_matches_onnxruntime(tmp_path, device):
    import onnxruntime as ort

    import tuner
    path = _block(tmp_path, ("down", "main"), False)
    x = np.random.default_rng(1).standard_normal((1, 8, 16, 16)).astype(np.float32)
    y, = tuner.compile_model(path, device=device, scope="buffer").run([x])
    want = ort.InferenceSession(path).run(None, {"x": x})[0]
    assert np.abs(y - want).max() <= 1e-4 * max(1.0, np.abs(want).max())
