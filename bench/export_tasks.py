"""Export the "tasks" set of the model-coverage benchmark (issue 38): the models a phone runs beyond classifiers,
written here as PyTorch modules with random weights, exported to ONNX for ``bench/models.py``.

    /tmp/torchvenv/bin/python bench/export_tasks.py [--out /tmp/task_models] [--input-size 128] [--models REGEX]

Runs with the separate torch virtualenv of ``bench/export_torchvision.py`` (never a dependency of the project).
Every model is in eval mode, batch 1, seeded before it is built, exported with the TorchScript exporter
(``dynamo=False``) at opset 17, input ``input`` (1, 3, S, S) (one channel for the super-resolution nets), its
outputs as the module returns them (two 3-D tensors for the SSD head). Nothing is downloaded.

- ``ssdlite_head``: torchvision's SSDLite320-MobileNetV3-Large, its backbone and head without the post-processing
  (anchors, box decoding and NMS are the caller's): the boxes (1, A, 4) and class logits (1, A, 91);
- ``yolo_v8n``: a YOLOv8-n-style detector: Conv-BN-SiLU, C2f blocks (Split, Concat), SPPF (three 5x5 max pools),
  nearest 2x upsampling and an FPN/PAN neck, decoupled heads concatenated to a (1, 4 + 80, anchors) output;
- ``lraspp_mobilenet_v3``, ``deeplabv3_mobilenet_v3``: torchvision's segmenters (dilated convolutions, bilinear
  Resize), the ``out`` tensor;
- ``espcn_x3``: ESPCN super-resolution, PixelShuffle(3) (DepthToSpace, CRD);
- ``fsrcnn_x2``: FSRCNN, PReLU, a 9x9 stride-2 ConvTranspose;
- ``pose_resnet18``: SimpleBaseline pose estimation (ResNet-18 backbone, three 4x4 stride-2 deconvolutions with
  BatchNorm and ReLU, 17 heatmaps);
- ``unet``: a U-Net of 4 levels (2x2 stride-2 up-convolutions, skip concats);
- ``style_transfer``: Johnson et al.'s fast style transfer (reflection padding, InstanceNorm, residual blocks,
  nearest upsampling), as PyTorch's examples/fast_neural_style writes it.
"""
from __future__ import annotations

import argparse
import re
import sys
import time
import traceback
import warnings
from pathlib import Path


def _modules():
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    def cbs(cin, cout, k=3, s=1):
        return nn.Sequential(nn.Conv2d(cin, cout, k, s, k // 2, bias=False), nn.BatchNorm2d(cout), nn.SiLU())

    class C2f(nn.Module):
        def __init__(self, cin, cout, n=1, shortcut=True):
            super().__init__()
            self.c = cout // 2
            self.cv1, self.cv2 = cbs(cin, 2 * self.c, 1), cbs((2 + n) * self.c, cout, 1)
            self.m = nn.ModuleList(nn.Sequential(cbs(self.c, self.c), cbs(self.c, self.c)) for _ in range(n))
            self.shortcut = shortcut

        def forward(self, x):
            y = list(self.cv1(x).split((self.c, self.c), 1))
            for m in self.m:
                y.append(y[-1] + m(y[-1]) if self.shortcut else m(y[-1]))
            return self.cv2(torch.cat(y, 1))

    class SPPF(nn.Module):
        def __init__(self, cin, cout):
            super().__init__()
            self.cv1, self.cv2 = cbs(cin, cin // 2, 1), cbs(cin * 2, cout, 1)
            self.m = nn.MaxPool2d(5, 1, 2)

        def forward(self, x):
            x = self.cv1(x)
            y1 = self.m(x)
            y2 = self.m(y1)
            return self.cv2(torch.cat((x, y1, y2, self.m(y2)), 1))

    class YOLOv8n(nn.Module):
        def __init__(self, nc=80, w=(16, 32, 64, 128, 256)):
            super().__init__()
            self.stem = nn.Sequential(cbs(3, w[0], 3, 2), cbs(w[0], w[1], 3, 2), C2f(w[1], w[1]))
            self.p3 = nn.Sequential(cbs(w[1], w[2], 3, 2), C2f(w[2], w[2], 2))
            self.p4 = nn.Sequential(cbs(w[2], w[3], 3, 2), C2f(w[3], w[3], 2))
            self.p5 = nn.Sequential(cbs(w[3], w[4], 3, 2), C2f(w[4], w[4]), SPPF(w[4], w[4]))
            self.up = nn.Upsample(scale_factor=2, mode="nearest")
            self.n4, self.n3 = C2f(w[4] + w[3], w[3], shortcut=False), C2f(w[3] + w[2], w[2], shortcut=False)
            self.d3, self.m4 = cbs(w[2], w[2], 3, 2), C2f(w[2] + w[3], w[3], shortcut=False)
            self.d4, self.m5 = cbs(w[3], w[3], 3, 2), C2f(w[3] + w[4], w[4], shortcut=False)
            self.nc = nc
            c2, c3 = max(16, w[2] // 4, 64), max(w[2], min(nc, 100))
            self.box = nn.ModuleList(nn.Sequential(cbs(c, c2), cbs(c2, c2), nn.Conv2d(c2, 64, 1)) for c in w[2:])
            self.cls = nn.ModuleList(nn.Sequential(cbs(c, c3), cbs(c3, c3), nn.Conv2d(c3, nc, 1)) for c in w[2:])
            self.dfl = nn.Conv2d(16, 1, 1, bias=False)
            self.dfl.weight.data[:] = torch.arange(16, dtype=torch.float).view(1, 16, 1, 1)

        def forward(self, x):
            x = self.stem(x)
            p3 = self.p3(x)
            p4 = self.p4(p3)
            p5 = self.p5(p4)
            n4 = self.n4(torch.cat((self.up(p5), p4), 1))
            o3 = self.n3(torch.cat((self.up(n4), p3), 1))
            o4 = self.m4(torch.cat((self.d3(o3), n4), 1))
            o5 = self.m5(torch.cat((self.d4(o4), p5), 1))
            outs = [torch.cat((b(f), c(f)), 1) for f, b, c in zip((o3, o4, o5), self.box, self.cls)]
            y = torch.cat([o.flatten(2) for o in outs], 2)  # (1, 64 + nc, anchors)
            box, cls = y.split((64, self.nc), 1)
            a = box.shape[2]
            dist = self.dfl(box.view(1, 4, 16, a).transpose(2, 1).softmax(1)).view(1, 4, a)  # DFL expectation
            return torch.cat((dist, cls.sigmoid()), 1)

    class ESPCN(nn.Module):
        def __init__(self, r=3, c=1):
            super().__init__()
            self.body = nn.Sequential(nn.Conv2d(c, 64, 5, 1, 2), nn.Tanh(), nn.Conv2d(64, 32, 3, 1, 1), nn.Tanh(),
                                      nn.Conv2d(32, c * r * r, 3, 1, 1), nn.PixelShuffle(r))

        def forward(self, x):
            return self.body(x)

    class FSRCNN(nn.Module):
        def __init__(self, r=2, c=1, d=56, s=12, m=4):
            super().__init__()
            layers = [nn.Conv2d(c, d, 5, 1, 2), nn.PReLU(d), nn.Conv2d(d, s, 1), nn.PReLU(s)]
            for _ in range(m):
                layers += [nn.Conv2d(s, s, 3, 1, 1), nn.PReLU(s)]
            layers += [nn.Conv2d(s, d, 1), nn.PReLU(d), nn.ConvTranspose2d(d, c, 9, r, 4, output_padding=r - 1)]
            self.body = nn.Sequential(*layers)

        def forward(self, x):
            return self.body(x)

    class PoseResNet(nn.Module):
        def __init__(self, joints=17):
            super().__init__()
            import torchvision
            r = torchvision.models.resnet18(weights=None)
            self.backbone = nn.Sequential(r.conv1, r.bn1, r.relu, r.maxpool, r.layer1, r.layer2, r.layer3, r.layer4)
            layers, cin = [], 512
            for _ in range(3):
                layers += [nn.ConvTranspose2d(cin, 256, 4, 2, 1, bias=False), nn.BatchNorm2d(256), nn.ReLU(True)]
                cin = 256
            self.head = nn.Sequential(*layers, nn.Conv2d(256, joints, 1))

        def forward(self, x):
            return self.head(self.backbone(x))

    class UNet(nn.Module):
        def __init__(self, c=3, classes=2, w=16):
            super().__init__()

            def block(a, b):
                return nn.Sequential(nn.Conv2d(a, b, 3, 1, 1, bias=False), nn.BatchNorm2d(b), nn.ReLU(True),
                                     nn.Conv2d(b, b, 3, 1, 1, bias=False), nn.BatchNorm2d(b), nn.ReLU(True))
            ws = [w, 2 * w, 4 * w, 8 * w, 16 * w]
            self.down = nn.ModuleList([block(c, ws[0])] + [block(ws[i], ws[i + 1]) for i in range(4)])
            self.ups = nn.ModuleList(nn.ConvTranspose2d(ws[i + 1], ws[i], 2, 2) for i in reversed(range(4)))
            self.dec = nn.ModuleList(block(2 * ws[i], ws[i]) for i in reversed(range(4)))
            self.out = nn.Conv2d(ws[0], classes, 1)

        def forward(self, x):
            skips = []
            for i, d in enumerate(self.down):
                x = d(x if i == 0 else F.max_pool2d(x, 2))
                skips.append(x)
            for up, dec, skip in zip(self.ups, self.dec, reversed(skips[:-1])):
                x = dec(torch.cat((skip, up(x)), 1))
            return self.out(x)

    class TransformerNet(nn.Module):
        """PyTorch examples/fast_neural_style/neural_style/transformer_net.py."""

        def __init__(self):
            super().__init__()

            def conv(a, b, k, s):
                return nn.Sequential(nn.ReflectionPad2d(k // 2), nn.Conv2d(a, b, k, s))

            def res(c):
                return nn.Sequential(conv(c, c, 3, 1), nn.InstanceNorm2d(c, affine=True), nn.ReLU(),
                                     conv(c, c, 3, 1), nn.InstanceNorm2d(c, affine=True))
            self.down = nn.Sequential(conv(3, 32, 9, 1), nn.InstanceNorm2d(32, affine=True), nn.ReLU(),
                                      conv(32, 64, 3, 2), nn.InstanceNorm2d(64, affine=True), nn.ReLU(),
                                      conv(64, 128, 3, 2), nn.InstanceNorm2d(128, affine=True), nn.ReLU())
            self.res = nn.ModuleList(res(128) for _ in range(5))
            self.up1, self.up2 = conv(128, 64, 3, 1), conv(64, 32, 3, 1)
            self.n1, self.n2 = nn.InstanceNorm2d(64, affine=True), nn.InstanceNorm2d(32, affine=True)
            self.final = conv(32, 3, 9, 1)

        def forward(self, x):
            y = self.down(x)
            for r in self.res:
                y = y + r(y)
            y = F.relu(self.n1(self.up1(F.interpolate(y, scale_factor=2, mode="nearest"))))
            y = F.relu(self.n2(self.up2(F.interpolate(y, scale_factor=2, mode="nearest"))))
            return self.final(y)

    class SSDLiteHead(nn.Module):
        def __init__(self):
            super().__init__()
            import torchvision
            m = torchvision.models.detection.ssdlite320_mobilenet_v3_large(weights=None, weights_backbone=None)
            self.backbone, self.head = m.backbone, m.head

        def forward(self, x):
            out = self.head(list(self.backbone(x).values()))
            return out["bbox_regression"], out["cls_logits"]

    class Segmenter(nn.Module):
        def __init__(self, name):
            super().__init__()
            import torchvision
            kw = {"weights_backbone": None} | ({"aux_loss": False} if "deeplab" in name else {})
            self.m = getattr(torchvision.models.segmentation, name)(weights=None, **kw)

        def forward(self, x):
            return self.m(x)["out"]

    return {"ssdlite_head": (SSDLiteHead, 3), "yolo_v8n": (YOLOv8n, 3),
            "lraspp_mobilenet_v3": (lambda: Segmenter("lraspp_mobilenet_v3_large"), 3),
            "deeplabv3_mobilenet_v3": (lambda: Segmenter("deeplabv3_mobilenet_v3_large"), 3),
            "espcn_x3": (ESPCN, 1), "fsrcnn_x2": (FSRCNN, 1), "pose_resnet18": (PoseResNet, 3), "unet": (UNet, 3),
            "style_transfer": (TransformerNet, 3)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="/tmp/task_models")
    ap.add_argument("--input-size", type=int, default=128)
    ap.add_argument("--models", default=".")
    ap.add_argument("--opset", type=int, default=17)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--force", action="store_true")
    args = ap.parse_args(argv)
    import torch
    warnings.filterwarnings("ignore")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    failed = 0
    for name, (ctor, channels) in _modules().items():
        if not re.search(args.models, name):
            continue
        path = out / f"{name}.onnx"
        if path.exists() and not args.force:
            print(f"{name}: exists")
            continue
        t0 = time.time()
        try:
            torch.manual_seed(args.seed)
            model = ctor().eval()
            x = torch.randn(1, channels, args.input_size, args.input_size)
            with torch.no_grad():
                y = model(x)
            names = ["boxes", "scores"] if isinstance(y, tuple) else ["output"]
            torch.onnx.export(model, (x,), str(path), opset_version=args.opset, input_names=["input"],
                              output_names=names, do_constant_folding=True, dynamo=False)
            shapes = [tuple(t.shape) for t in (y if isinstance(y, tuple) else (y,))]
            print(f"{name}: exported {path} outputs {shapes} in {time.time() - t0:.1f} s", flush=True)
        except Exception:  # noqa: BLE001 - report and go on
            failed += 1
            print(f"{name}: FAILED\n{traceback.format_exc(limit=3)}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
