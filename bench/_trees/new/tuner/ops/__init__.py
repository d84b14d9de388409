"""The glue operators' kernels, which are not tuned (elementwise, pooling, concat, relayout, the data-movement
and layout operators), written over the IR like the templates, and the token tensors' storage views. They
import nothing of the graph or the planner: both build on them."""
