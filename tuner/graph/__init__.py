"""The model pipeline: ONNX frontend, graph passes, storage and memory planning, task extraction, the
executor and its artifact, and a model zoo built in code."""
