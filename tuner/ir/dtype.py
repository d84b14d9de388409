"""Data types with lanes (RFC 0012): ``float32``, ``float16``, ``float32x4``, ``int32``, ``bool``."""
from __future__ import annotations

import re
from dataclasses import dataclass

_BASES = {"float32": 4, "float16": 2, "int32": 4, "bool": 1}
_FLOATS = frozenset(b for b in _BASES if b.startswith("float"))  # a base is one of _BASES


@dataclass(frozen=True)
class DType:
    base: str
    lanes: int = 1

    def __post_init__(self):
        if self.base not in _BASES:
            raise ValueError(f"unknown dtype base {self.base!r}; known: {', '.join(_BASES)}")
        if self.lanes < 1:
            raise ValueError(f"dtype lanes must be >= 1, got {self.lanes}")

    @staticmethod
    def parse(text: "str | DType") -> "DType":
        if isinstance(text, DType):
            return text
        m = re.fullmatch(r"(float32|float16|int32|bool)(?:x(\d+))?", text)
        if not m:
            raise ValueError(f"cannot parse dtype {text!r}: expected e.g. float32, float16x4, int32")
        return DType(m.group(1), int(m.group(2) or 1))

    def with_lanes(self, lanes: int) -> "DType":
        return self if lanes == self.lanes else DType(self.base, lanes)  # frozen: itself where nothing changes

    def with_base(self, base: str) -> "DType":
        return DType(base, self.lanes)

    @property
    def element(self) -> "DType":
        return self if self.lanes == 1 else DType(self.base, 1)

    @property
    def is_float(self) -> bool:
        return self.base in _FLOATS

    @property
    def bytes(self) -> int:
        return _BASES[self.base] * self.lanes

    @property
    def compute(self) -> "DType":
        """Half storage is read as float (texture RFC T1: read_imagef on half images returns float). Half
        arithmetic is explicit: an expression of dtype ``float16`` (a ``Cast`` of a load, a ``float16``
        private/local array) is ``half`` in OpenCL and needs cl_khr_fp16."""
        return DType("float32", self.lanes) if self.base == "float16" else self

    @property
    def numpy(self):
        import numpy as np
        return {"float32": np.float32, "float16": np.float16, "int32": np.int32, "bool": np.bool_}[self.base]

    def __str__(self) -> str:
        return self.base if self.lanes == 1 else f"{self.base}x{self.lanes}"


float32, float16, int32, boolean = DType("float32"), DType("float16"), DType("int32"), DType("bool")
float32x4, float16x4 = DType("float32", 4), DType("float16", 4)
