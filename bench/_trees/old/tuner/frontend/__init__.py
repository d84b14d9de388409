"""Frontends: a model file to a :class:`tuner.graph.graph.Graph` (``onnx``: ONNX, with the handlers of the
data-movement and layout operators in ``onnx_movement``)."""
