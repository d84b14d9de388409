"""NumPy reference of the data-movement and layout operators: ``OPS`` (op -> fn(node, *inputs)) and ``ATTRS``
(op -> attribute names), merged into ``reference.OPS`` / ``reference.ATTRS``."""
from __future__ import annotations

OPS: dict = {}
ATTRS: dict = {}
