"""What the zoo's model builders share (``models.py``, ``movement.py``, ``tasks.py``): ``_Builder``, which
accumulates ONNX nodes and initializers with deterministic random weights, torchvision's channel rounding and
MobileNetV2's stage table. No model lives here, so every builder module imports it and none imports another."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

IR_VERSION = 8  # onnx 1.10's; every onnxruntime since 1.10 loads it


class _Builder:
    """Accumulates nodes and initializers; every helper returns its output tensor name."""

    def __init__(self, seed: int = 0, opset: int = 13):
        self.rng = np.random.default_rng(seed)
        self.opset = opset
        self.nodes, self.inits, self.inputs = [], [], []
        self.counts: dict[str, int] = {}

    def name(self, prefix: str) -> str:
        k = self.counts.get(prefix, 0)
        self.counts[prefix] = k + 1
        return f"{prefix}{k}"

    def input(self, name: str, shape) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape)))
        return name

    def const(self, prefix: str, value) -> str:
        """An initializer; float64 values (NumPy's default) are stored as float32."""
        value = np.asarray(value)
        name = self.name(prefix)
        self.inits.append(numpy_helper.from_array(value.astype(np.float32) if value.dtype == np.float64 else value,
                                                  name))
        return name

    def node(self, op: str, inputs: list, prefix: str | None = None, output: str | None = None, **attrs) -> str:
        name = self.name(prefix or op.lower())
        self.nodes.append(helper.make_node(op, inputs, [output or name], name=name, **attrs))
        return output or name

    def model(self, outputs: dict, name: str) -> onnx.ModelProto:
        """``outputs``: tensor name -> declared shape (None: unknown; the frontend and onnxruntime compute it)."""
        graph = helper.make_graph(self.nodes, name, self.inputs,
                                  [helper.make_tensor_value_info(o, TensorProto.FLOAT, shape)
                                   for o, shape in outputs.items()], self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)],
                                  ir_version=IR_VERSION, producer_name="tuner.zoo.models")
        # the checker wants every output's shape: ONNX's own inference fills in those left unknown
        model = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
        del model.graph.value_info[:]  # keep only what an exporter must write; the frontend computes the rest
        onnx.checker.check_model(model)
        return model

    # -- layers with random weights ---------------------------------------------------------------------------

    def conv(self, x: str, cin: int, cout: int, k, stride: int = 1, groups: int = 1, bias: bool = False,
             **attrs) -> str:
        """Conv with He-normal weights (std sqrt(2 / fan-in)); ``k`` is an int or (kh, kw); pads (k-1)//2 unless
        attrs give pads or auto_pad."""
        kh, kw = (k, k) if isinstance(k, int) else k
        fan_in = cin // groups * kh * kw
        inputs = [x, self.const("w", self.rng.standard_normal((cout, cin // groups, kh, kw)) * np.sqrt(2 / fan_in))]
        if bias:
            inputs.append(self.const("b", self.rng.normal(0, 0.1, cout)))
        if "auto_pad" not in attrs:
            attrs.setdefault("pads", [(kh - 1) // 2, (kw - 1) // 2] * 2)
        attrs.setdefault("strides", [stride] * 2)
        return self.node("Conv", inputs, "conv", kernel_shape=[kh, kw], group=groups, **attrs)

    def bn(self, x: str, c: int, epsilon: float = 1e-5) -> str:
        """Inference BatchNorm with random positive var and random mean/scale/bias, so it is far from identity."""
        r = self.rng
        params = [self.const("bn_scale", r.uniform(0.5, 1.5, c)), self.const("bn_bias", r.normal(0, 0.1, c)),
                  self.const("bn_mean", r.normal(0, 0.1, c)), self.const("bn_var", r.uniform(0.5, 1.5, c))]
        return self.node("BatchNormalization", [x, *params], "bn", epsilon=epsilon)

    def relu6(self, x: str) -> str:
        return self.node("Clip", [x, self.const("zero", np.float32(0)), self.const("six", np.float32(6))], "relu6")

    def fc(self, x: str, k: int, m: int, output: str | None = None, **attrs) -> str:
        """Gemm as torchvision's Linear exports: B is (M, K) with transB=1, C is (M,)."""
        w = self.const("fc_w", self.rng.standard_normal((m, k)) / np.sqrt(k))
        b = self.const("fc_b", self.rng.normal(0, 0.1, m))
        return self.node("Gemm", [x, w, b], "fc", output=output, transB=1, **attrs)


def _make_divisible(v: float, divisor: int = 8, min_value: int | None = None) -> int:
    """torchvision's channel rounding: the nearest multiple of divisor, never below 90% of v."""
    min_value = divisor if min_value is None else min_value
    new_v = max(min_value, int(v + divisor / 2) // divisor * divisor)
    return new_v + divisor if new_v < 0.9 * v else new_v


MOBILENET_V2_SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                         (6, 160, 3, 2), (6, 320, 1, 1))  # t (expansion), c (channels), n (repeats), s (stride)
