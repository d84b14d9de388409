"""Lowering and glue-kernel rules of the data-movement and layout operators (registered on import through
``lowering.RULE_MODULES``)."""
from __future__ import annotations
