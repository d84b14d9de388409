"""Export torchvision architectures (random weights) to ONNX for the model-coverage benchmark (bench/models.py).

    /tmp/torchvenv/bin/python bench/export_torchvision.py [--out /tmp/tv_models] [--input-size 64]
                                                         [--models REGEX] [--opset 17] [--seed 0] [--force]

Runs with a separate virtualenv that has torch and torchvision; they are never a dependency of the project
(the project's .venv must not get torch):

    python3 -m venv /tmp/torchvenv
    /tmp/torchvenv/bin/pip install torch==2.14.1 torchvision==0.29.1 onnx

Every model is built with ``weights=None`` (random weights, seeded with ``--seed`` before each model, so a
re-export gives the same file), in eval mode, batch 1, exported with the TorchScript exporter
(``dynamo=False``) at opset 17 with constant folding, input ``input`` (1, 3, S, S) and output ``output``.
Segmentation models (``lraspp_*``, ``deeplabv3_*``, ``fcn_*``) return a dict; they are wrapped so that only
its ``'out'`` tensor is exported. Nothing is downloaded.

``--input-size`` (default 64): the spatial size of every model's input, the segmentation ones included. 224 is
the models' native size; 64 keeps ``bench/models.py`` (17 models x 4 compiles on PoCL, 2 cores) well within
its budget while still giving every architecture's stages at least 2x2 pixels (the smallest stride-32 map of
these models is 64/32 = 2). A model that fails to build or export is reported and skipped, never a crash;
the exit status is 1 when any failed.
"""
from __future__ import annotations

import argparse
import re
import sys
import time
import traceback
import warnings
from pathlib import Path

# name -> (torchvision.models attribute path, constructor kwargs, segmentation?)
MODELS = {
    "mobilenet_v3_small": ("mobilenet_v3_small", {}, False),
    "mobilenet_v3_large": ("mobilenet_v3_large", {}, False),
    "lraspp_mobilenet_v3_large": ("segmentation.lraspp_mobilenet_v3_large", {"weights_backbone": None}, True),
    "deeplabv3_mobilenet_v3_large": ("segmentation.deeplabv3_mobilenet_v3_large",
                                     {"weights_backbone": None, "aux_loss": False}, True),
    "efficientnet_b0": ("efficientnet_b0", {}, False),
    "shufflenet_v2_x0_5": ("shufflenet_v2_x0_5", {}, False),
    "convnext_tiny": ("convnext_tiny", {}, False),
    "squeezenet1_1": ("squeezenet1_1", {}, False),
    "googlenet": ("googlenet", {"aux_logits": False, "init_weights": True}, False),
    "mnasnet0_5": ("mnasnet0_5", {}, False),
    "regnet_x_400mf": ("regnet_x_400mf", {}, False),
    "resnext50_32x4d": ("resnext50_32x4d", {}, False),
    "fcn_resnet50": ("segmentation.fcn_resnet50", {"weights_backbone": None, "aux_loss": False}, True),
    "mobilenet_v2": ("mobilenet_v2", {}, False),
    "resnet18": ("resnet18", {}, False),
    "resnet50": ("resnet50", {}, False),
    "densenet121": ("densenet121", {}, False),
}

DEFAULT_INPUT_SIZE = 64


def build(name: str, seed: int):
    import torch
    import torchvision

    attr, kwargs, seg = MODELS[name]
    obj = torchvision.models
    for part in attr.split("."):
        obj = getattr(obj, part)
    torch.manual_seed(seed)
    model = obj(weights=None, **kwargs).eval()
    if seg:
        class Out(torch.nn.Module):
            """Only the ``'out'`` entry of a segmentation model's dict."""

            def __init__(self, m):
                super().__init__()
                self.m = m

            def forward(self, x):
                return self.m(x)["out"]

        model = Out(model).eval()
    return model


def calibrate_batch_norm(model, size: int, batches: int, seed: int) -> None:
    """Set every BatchNorm's running statistics to those of random inputs (cumulative average over
    ``batches`` batches of 8), so that activations stay near unit scale through the network. With the
    constructors' statistics (mean 0, variance 1) random weights shrink outputs by orders of magnitude per
    stage, down to 1e-9..1e-14 at the logits, below float16's range."""
    import torch

    bns = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    for m in bns:
        m.reset_running_stats()
        m.momentum = None  # cumulative moving average
    g = torch.Generator().manual_seed(seed + 1)
    model.train()
    with torch.no_grad():
        for _ in range(batches):
            model(torch.randn(8, 3, size, size, generator=g))
    model.eval()


def export(name: str, path: Path, size: int, opset: int, seed: int, calibrate: int = 0) -> str:
    import torch

    model = build(name, seed)
    if calibrate:
        calibrate_batch_norm(model, size, calibrate, seed)
    x = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        y = model(x)
        kw = dict(input_names=["input"], output_names=["output"], opset_version=opset, do_constant_folding=True)
        try:
            torch.onnx.export(model, (x,), str(path), dynamo=False, **kw)
        except TypeError:  # a torch without the dynamo switch: the TorchScript exporter is the only one
            torch.onnx.export(model, (x,), str(path), **kw)
    import onnx
    m = onnx.load(str(path))
    onnx.checker.check_model(m)
    ops = sorted({n.op_type for n in m.graph.node})
    return (f"out {list(y.shape)} (max |y| {float(y.abs().max()):.2g}), {len(m.graph.node)} nodes, "
            f"ops {' '.join(ops)}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="/tmp/tv_models", help="folder for the .onnx files (default /tmp/tv_models)")
    p.add_argument("--input-size", type=int, default=DEFAULT_INPUT_SIZE,
                   help=f"input height and width (default {DEFAULT_INPUT_SIZE}; the models' native size is 224)")
    p.add_argument("--opset", type=int, default=17)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--models", metavar="REGEX", help="only models whose name matches")
    p.add_argument("--force", action="store_true", help="re-export files that exist")
    p.add_argument("--calibrate-bn", type=int, default=0, metavar="N",
                   help="set BatchNorm statistics from N random batches (default 0: the constructors' statistics; "
                   "with them random weights shrink outputs below float16's range)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    args = p.parse_args(argv)
    try:
        import torch
        import torchvision  # noqa: F401
    except ImportError as e:
        print(f"error: {e}; run this with a virtualenv that has torch and torchvision, e.g.\n"
              f"    python3 -m venv /tmp/torchvenv && /tmp/torchvenv/bin/pip install torch torchvision onnx\n"
              f"    /tmp/torchvenv/bin/python {sys.argv[0]}", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", category=DeprecationWarning)  # dynamo=False is the point: said once above
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    names = [n for n in MODELS if not args.models or re.search(args.models, n)]
    failed = []
    t_all = time.perf_counter()
    for name in names:
        path = out / f"{name}.onnx"
        if path.exists() and not args.force:
            print(f"{name}: {path} exists (--force to re-export)")
            continue
        t0 = time.perf_counter()
        try:
            what = export(name, path, args.input_size, args.opset, args.seed, args.calibrate_bn)
            print(f"{name}: {path} ({args.input_size}x{args.input_size}, {time.perf_counter() - t0:.1f} s): {what}",
                  flush=True)
        except Exception as e:  # noqa: BLE001 -- one model's failure never stops the others
            failed.append(name)
            path.unlink(missing_ok=True)
            last = traceback.format_exception_only(type(e), e)[-1].strip().splitlines()[0]
            print(f"{name}: FAILED: {last}", flush=True)
    print(f"exported {len(names) - len(failed)} of {len(names)} models to {out} in "
          f"{time.perf_counter() - t_all:.0f} s" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
