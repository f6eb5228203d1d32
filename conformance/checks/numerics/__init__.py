"""Numerics: the Thunder module trains exactly like eager PyTorch on the same weights.

Compared on every rank at every step (three SGD steps, then three AdamW steps): this rank's
output, the full gradients, and the full parameters after the optimizer step. Each kind of
comparison reports the first step where it fails (a later step's failure is a finding too:
a gradient off only once the optimizer state exists, an update that is not applied).

``steps`` holds the step loop; ``tolerances`` how far each tensor may stray (float32 fixed,
below it from eager's own error against a float32 twin); ``propagation`` the updates' tolerance
(what the optimizer makes of gradients off that far); ``scale``, ``dropout`` and ``scenarios``
judge a gradient's scale, a dropout's masks and what a cell's scenario did after training;
``tensor_parallel`` a tensor-parallel cell's steps.
"""

from __future__ import annotations

from conformance.checks.area import Area
from conformance.checks.numerics import tensor_parallel
from conformance.checks.numerics.steps import check

# every composition records its steps: Thunder's transforms and PyTorch's parallelism alike
# gradients averaged over every rank whatever the mesh: hybrid sharding's cells too
AREA = Area(
    "numerics",
    check,
    parallelisms=frozenset({"thunder", "torch"}),
    hybrid=True,
    tensor_parallel=tensor_parallel.check,
)
