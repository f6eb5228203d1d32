"""The world: a task-agnostic runner of torchrun worlds (controller, spawning, rank loop,
and what they say to each other). It knows nothing of cells or checks: a task names a
function by its import path, and the ranks return JSON. Nothing here imports the rest of
the kit."""
