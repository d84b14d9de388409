"""Small ONNX test graphs of the data-movement and layout operators, merged into ``zoo.test_models()``:
``TEST_MODELS`` (name -> build(b) like zoo's), ``OPSETS`` and ``INPUT_SHAPES`` (name -> input_shapes)."""
from __future__ import annotations

TEST_MODELS: dict = {}
OPSETS: dict = {}
INPUT_SHAPES: dict = {}
