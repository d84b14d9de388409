"""A template defined outside the package, for tests/test_user_template.py: a pointwise (1x1, stride 1, no
padding, groups 1) conv2d over NCHW4c buffers with knobs of its own. ``register_template(POINTWISE)`` makes
models run it for the 1x1 convolutions whose channels fill whole pixels; measuring processes import it as
``tests.user_templates:POINTWISE`` (the tests run from the repository root)."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from tuner.ir.activations import canonical
from tuner.ir.builder import Builder
from tuner.ir.expr import ExtractLane, Ramp, as_expr, const, min_
from tuner.templates import EPILOGUE_ARGS, Template, WorkloadArg, node_epilogue
from tuner.templates.common import (declare_operands, fit_work_group, random_inputs, reference_epilogue,
                                    store_tile)

NAME = "tests.user_templates:POINTWISE"


@dataclass(frozen=True)
class PointwiseWorkload:
    data: tuple  # N, C, H, W with C a multiple of 4
    kernel: tuple  # O, C, 1, 1
    dtype: str = "float32"
    bias: bool = False
    activation: str = "none"
    residual: bool = False

    def __post_init__(self):
        object.__setattr__(self, "data", tuple(int(x) for x in self.data))
        object.__setattr__(self, "kernel", tuple(int(x) for x in self.kernel))
        (_, c, _, _), (_, kc, r, s) = self.data, self.kernel
        if kc != c or (r, s) != (1, 1) or c % 4:
            raise ValueError(f"pointwise conv2d wants kernel O,{c},1,1 and channels in whole pixels; got data "
                             f"{list(self.data)}, kernel {list(self.kernel)}")
        object.__setattr__(self, "activation", canonical(self.activation))

    @property
    def out_shape(self) -> tuple:
        return self.data[0], self.kernel[0], self.data[2], self.data[3]

    @property
    def flops(self) -> int:
        return 2 * math.prod(self.out_shape) * self.data[1]

    def key(self) -> dict:
        return {"op": "pointwise_conv2d", **{k: list(v) if isinstance(v, tuple) else v
                                             for k, v in asdict(self).items()}}


@dataclass(frozen=True)
class PointwiseConfig:
    tile_oc: int = 1  # output-channel blocks of 4 per work-item
    tile_ow: int = 1  # output columns per work-item
    wg_w: int = 1  # work-group size along columns
    input_scope: str = "buffer"
    weight_scope: str = "buffer"
    output_scope: str = "buffer"


def build(wl: PointwiseWorkload, cfg: PointwiseConfig):
    (N, C, H, W), O = wl.data, wl.kernel[0]
    C4, OB = C // 4, -(-O // 4)
    layouts = SimpleNamespace(**asdict(cfg), act_layout="nchw4c", weight_layout="oihw4o")
    operands = X, Wt, B, Res, Y = declare_operands(wl, layouts, O)
    t_oc, t_ow = cfg.tile_oc, cfg.tile_ow
    n_ob, n_ow = -(-OB // t_oc), -(-W // t_ow)
    b = Builder()
    with b.loop("nb", N * n_ob, "group.2") as nb, b.loop("h", H, "group.1") as h, \
            b.loop("gw", -(-n_ow // cfg.wg_w), "group.0") as gw, b.loop("tw", cfg.wg_w, "local.0") as tw:
        n, obb, ow0 = nb // n_ob, nb % n_ob, (gw * cfg.wg_w + tw) * t_ow
        acc = b.allocate("acc", (t_oc * t_ow,), "float32x4", "private")
        for i in range(t_oc * t_ow):
            b.store(acc, i, const(0.0, "float32x4"))
        with b.loop("cb", C4) as cb:
            xs = [b.let(f"x{x}", X[n, Ramp(cb * 4, as_expr(1), 4), h, min_(ow0 + x, W - 1)]) for x in range(t_ow)]
            for ci in range(4):
                for k in range(t_oc):
                    w = b.let(f"w{k}_{ci}", Wt[Ramp(min_(obb * t_oc + k, OB - 1) * 4, as_expr(1), 4), cb * 4 + ci,
                                               0, 0])
                    for x in range(t_ow):
                        b.store(acc, k * t_ow + x, acc[k * t_ow + x] + ExtractLane(xs[x], ci) * w)
        store_tile(b, acc, Y, n, obb, h, ow0, (t_oc, 1, t_ow), (OB, H, W), wl, B, Res)
    return b.kernel("pointwise_conv2d", [p for p in operands if p is not None])


def reference(wl: PointwiseWorkload, inputs: dict) -> np.ndarray:
    out = np.einsum("nchw,oc->nohw", inputs["X"].astype(np.float64), inputs["Wt"][:, :, 0, 0].astype(np.float64))
    return reference_epilogue(wl, out, inputs.get("B"), inputs.get("Res"))


def space_vars(wl: PointwiseWorkload) -> dict:
    N, C, H, W = wl.data
    return dict(N=N, C=C, H=H, W=W, O=wl.kernel[0], OB=-(-wl.kernel[0] // 4))


VARIABLES = dict(N="batch", C="input channels", H="height", W="width", O="output channels",
                 OB="output-channel blocks of 4")


def fallback(wl: PointwiseWorkload, info) -> PointwiseConfig:
    tile_ow = 2 if wl.data[3] >= 2 else 1
    return PointwiseConfig(tile_oc=1, tile_ow=tile_ow, wg_w=fit_work_group(-(-wl.data[3] // tile_ow), 1, info)[0])


def features(v: dict, k: dict) -> dict:
    return {"work_per_item": math.log2(k["tile_oc"] * k["tile_ow"]),
            "padding_waste": math.ceil(v["W"] / k["tile_ow"]) * k["tile_ow"] / v["W"]}


def lower(ctx, node, ins):
    """Takes a conv2d node that is 1x1, stride 1, unpadded, ungrouped, with input channels in whole pixels."""
    a, data, w_shape = node.attrs, ctx.shape(node.inputs[0]), ctx.shape(node.inputs[1])
    if (w_shape[2:] != (1, 1) or tuple(a["stride"]) != (1, 1) or any(a["padding"]) or tuple(a["dilation"]) != (1, 1)
            or a.get("groups", 1) != 1 or data[1] % 4):
        return None
    fields, inputs = node_epilogue(ctx, node)
    wl = PointwiseWorkload(data, w_shape, residual="Res" in inputs, **fields)
    return wl, {"X": ins[0], "Wt": node.inputs[1], **inputs}, {}


POINTWISE = Template(
    NAME, PointwiseWorkload, PointwiseConfig, build, reference, random_inputs, fallback, space_vars, VARIABLES,
    space_file=str(Path(__file__).parent / "data" / "pointwise_conv2d.toml"), features=features,
    describe=lambda wl: f"{'x'.join(map(str, wl.data))} k{wl.kernel[0]}x1x1",
    workload_args=(WorkloadArg("data", "shape", "N,C,H,W", required=True),
                   WorkloadArg("kernel", "shape", "O,C,1,1", required=True), *EPILOGUE_ARGS),
    graph_ops=("conv2d",), lower=lower)
