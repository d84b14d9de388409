"""The model graph (``graph``): nodes over named tensors with known shapes; its NumPy reference interpreter
(``reference``, ``reference_movement``); and the graph passes (``passes``, ``passes_movement``,
``passes_tokens``), each a pure ``Graph -> Graph`` function, run in the order of ``passes.optimize``."""
