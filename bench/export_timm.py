"""Export timm architectures (random weights) to ONNX for the model-coverage benchmark (bench/models.py), issue 27:
hybrid convolution-attention mobile models and plain-convolution ones.

    /tmp/torchvenv/bin/python bench/export_timm.py [--out /tmp/timm_models] [--set hybrid|plain|all]
                                                  [--models REGEX] [--opset 17] [--seed 0] [--force]

Runs with a separate virtualenv that has torch and timm; they are never a dependency of the project:

    python3 -m venv /tmp/torchvenv
    /tmp/torchvenv/bin/pip install torch==2.14.1 torchvision==0.29.1 timm onnx

Every model is ``timm.create_model(name, pretrained=False)`` (random weights, seeded with ``--seed`` before each
model: a re-export gives the same file; nothing is downloaded), in eval mode, batch 1, at its native input size
(``pretrained_cfg['input_size']``: 224 or 256; attention biases and position embeddings are sized for it),
exported with the TorchScript exporter (``dynamo=False``) at opset 17 with constant folding, input ``input``
and output ``output``. A model that fails to build or export is reported and skipped; the exit status is 1
when any failed. Then:

    python bench/models.py --models-dir /tmp/timm_models --variants texture,buffer
"""
from __future__ import annotations

import argparse
import re
import sys
import time
import traceback
import warnings
from pathlib import Path

# the attention models the frontend was developed against (issue 27's "own choice"), and plain-convolution ones
HYBRID = ("mobilevit_xxs", "mobilevitv2_050", "efficientvit_b0", "efficientvit_m0", "efficientformer_l1",
          "efficientformerv2_s0", "levit_128s", "pvt_v2_b0", "tiny_vit_5m_224", "mobilenetv4_hybrid_medium",
          "edgenext_xx_small", "coat_lite_tiny", "deit_tiny_patch16_224")
PLAIN = ("convnextv2_atto", "repvit_m0_9", "poolformerv2_s12", "inception_next_atto", "fastvit_t8")
SETS = {"hybrid": HYBRID, "plain": PLAIN, "all": HYBRID + PLAIN}


def export(name: str, path: Path, opset: int, seed: int) -> str:
    import timm
    import torch

    torch.manual_seed(seed)
    model = timm.create_model(name, pretrained=False).eval()
    size = tuple(model.pretrained_cfg.get("input_size", (3, 224, 224)))
    x = torch.randn((1, *size), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        y = model(x)
        torch.onnx.export(model, (x,), str(path), dynamo=False, input_names=["input"], output_names=["output"],
                          opset_version=opset, do_constant_folding=True)
    import onnx
    m = onnx.load(str(path))
    onnx.checker.check_model(m)
    return f"input {list(x.shape)}, out {list(y.shape)}, {len(m.graph.node)} nodes"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="/tmp/timm_models")
    p.add_argument("--set", choices=sorted(SETS), default="all")
    p.add_argument("--models", metavar="REGEX", help="only models whose name matches")
    p.add_argument("--opset", type=int, default=17)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--force", action="store_true", help="re-export files that exist")
    args = p.parse_args(argv)
    try:
        import timm  # noqa: F401
        import torch  # noqa: F401
    except ImportError as e:
        print(f"error: {e.name} is not installed in this Python; run with a virtualenv that has torch and timm "
              f"(see this script's docstring)", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    names = [n for n in SETS[args.set] if not args.models or re.search(args.models, n)]
    failed = 0
    warnings.filterwarnings("ignore")
    for k, name in enumerate(names, 1):
        path = out / f"{name}.onnx"
        if path.exists() and not args.force:
            print(f"[{k}/{len(names)}] {name}: exists", flush=True)
            continue
        t = time.time()
        try:
            what = export(name, path, args.opset, args.seed)
            print(f"[{k}/{len(names)}] {name}: {what} ({time.time() - t:.1f} s)", flush=True)
        except Exception as e:  # noqa: BLE001 - one model's failure is one line, never the run
            failed += 1
            path.unlink(missing_ok=True)
            print(f"[{k}/{len(names)}] {name}: FAILED {type(e).__name__}: {str(e).splitlines()[0][:300]}", flush=True)
            traceback.print_exc(limit=2, file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
