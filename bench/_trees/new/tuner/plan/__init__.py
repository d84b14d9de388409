"""From the optimized graph to the kernels that will run: the plan's types (``types``: Tensor, Step, Plan), the
per-operator lowering rules (``rules``, ``rules_movement``), graph -> steps, storage scopes, template choice and
tasks (``lower``), and the memory plan (``allocation``: which tensors share a device allocation). Needs no device: a target profile is enough."""
