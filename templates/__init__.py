"""Operator templates: conv2d, depthwise conv2d, dense (issue 3)."""
