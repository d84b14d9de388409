"""Code generation, with no device: lowered kernel IR -> OpenCL C (``opencl``), a kernel lowered and emitted
(``generate``), and host arrays packed into their layouts (``packing``)."""
