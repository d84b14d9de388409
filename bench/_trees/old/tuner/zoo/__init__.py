"""Models built in code with ``onnx.helper``, with deterministic random weights (``models``: MobileNets, ResNet-18
and the test models; ``movement``: small graphs of the data-movement and layout operators)."""
