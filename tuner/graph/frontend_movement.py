"""ONNX handlers of the data-movement and layout operators (Transpose, Split, Slice, Pad, Resize, ConvTranspose,
LayerNormalization, MatMul on 3-D/4-D, ...): a mixin of ``frontend._Converter``, which inherits ``_op_<Type>``
methods from here. Handlers use the converter's helpers (``act``, ``const``, ``param``, ``emit``, ``fail``)."""
from __future__ import annotations


class MovementOps:
    """``_op_<ONNX type>(self, ctx)`` handlers; see frontend.py for the protocol."""
