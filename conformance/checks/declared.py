"""What an xfails entry may declare of the Thunder under test beside the failures it expects:
a behaviour that the derivations of other areas then take as given in the cells and on the
versions the entry covers (its ``declares`` field, conformance/frontend/xfails.py).

A bound is built from the model, eager PyTorch and the world size, never from what the
Thunder under test produced. Where a known non-conformance changes what a rank legitimately
holds (no buckets: no bucket buffers, and one parameter, not one bucket, gathered at a time),
the file that excuses it says so, and the bound follows the declaration. Were the declaration
wrong, the entry's own templates would match nothing (a stale entry fails the run) and the
bounds it shaped would fail where the Thunder does otherwise.
"""

from __future__ import annotations

# FSDP's gathers and reduce-scatters and DDP's all-reduces go one parameter (one gradient)
# at a time where the cell asks for buckets
UNBUCKETED = "unbucketed"

DECLARATIONS: dict[str, str] = {
    UNBUCKETED: "bucketing is not applied: one collective per parameter, as without buckets",
}
