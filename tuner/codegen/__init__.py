"""Code generation: lowered kernel IR -> OpenCL C."""
