"""Models built in code with ``onnx.helper``, with deterministic random weights (``models``: MobileNets, ResNet-18
and the test models; ``movement``: small graphs of the data-movement and layout operators; ``tasks``: a
segmenter, detectors, super-resolution, pose, U-Net and style-transfer nets, full size in the zoo, small in the
test models)."""
