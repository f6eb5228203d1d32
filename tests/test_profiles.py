"""What the profiles promise, read from the cells alone (no world is started)."""

from __future__ import annotations

import pytest

from conformance.matrix.profiles import cells
from fixtures.compositions import COMPOSITIONS
from fixtures.inits import INITS
from fixtures.offloads import POLICIES


@pytest.mark.parametrize("policy", [p for p in POLICIES if p != "none"])
def test_ci_runs_every_offload_policy_with_both_compositions_real_and_meta_init_and_a_tie(policy: str) -> None:
    # cells of a composition that carries a probe may be unsupported by the Thunder under test
    runnable = [c for c in cells("ci", 2) if c.offload == policy and COMPOSITIONS[c.composition].probe is None]
    assert {c.composition for c in runnable} == {n for n, c in COMPOSITIONS.items() if c.probe is None}
    assert {INITS[c.init].on_meta for c in runnable} == {True, False}
    assert "tied" in {c.tie for c in runnable}
