"""Lowering passes: each a pure function ``Kernel -> Kernel``, listed in order in ``pipeline.py``."""
from .pipeline import PASSES, lower  # noqa: F401
