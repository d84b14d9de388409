"""A model in, an artifact out: ``compiler.compile_model`` (ONNX -> graph passes -> plan -> configs from the log
-> kernels -> memory plan -> ``tuner.runtime.module.Module``, whose ``save`` writes docs/artifact.md's artifact),
``tuning.tune_model`` (every task of a model's plan through the tuning engine) and the model commands (``cli``)."""
