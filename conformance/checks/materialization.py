"""Materialization: after setup every tensor is real, on the rank's device, with the values
the init mode promises.

State-dict and real inits must reproduce the seeded reference bit for bit. Module init draws
fresh values, so those are held to the module's own initializer: finite, and distributed like
a fresh draw of ``reset_parameters`` (two-sample Kolmogorov-Smirnov test per parameter).
"""

from __future__ import annotations

import math

import torch

from conformance.checks.area import Area
from conformance.checks.findings import Findings
from conformance.checks.record import CellRecord
from conformance.matrix.cells import Cell
from fixtures.models import fixture_for

KS_ALPHA_C = 1.949  # c(alpha) of the two-sample KS test at alpha = 0.001
FRESH_SEED = 7919


def check(run: CellRecord) -> Findings:
    found = Findings()
    setup = run.setup
    with found.expect("no tensor left on meta"):
        left = sorted(n for n, d in setup.placement.items() if d == "meta")
        assert not left, f"still on meta after setup: {left}"
    with found.expect("placement"):
        wrong = {n: d for n, d in setup.placement.items() if d not in ("meta", str(run.device))}
        assert not wrong, f"expected every tensor on {run.device}, found {wrong}"
    if run.init.values_from_reference:
        found.close("initial parameters", setup.initial, setup.reference_initial, rtol=0.0, atol=0.0)
    else:
        _like_module_init(run, found)
    found.close("buffers", setup.buffers, setup.reference_buffers, rtol=0.0, atol=0.0)
    return found


def _like_module_init(run: CellRecord, found: Findings) -> None:
    torch.manual_seed(FRESH_SEED)
    fresh = dict(fixture_for(run.cell.model, run.cell.spec).build(run.cell.tie == "tied").named_parameters())
    worst = 0.0
    for name, value in run.setup.initial.items():
        with found.expect(f"initial parameters [{name}]"):
            assert torch.isfinite(value).all(), "not finite"
            d, critical = ks(value.float().flatten(), fresh[name].detach().float().flatten())
            worst = max(worst, d / critical if critical else 0.0)
            assert d <= critical, (
                f"not distributed like {type(run.reference.get_submodule(name.rpartition('.')[0])).__name__}"
                f".reset_parameters: KS statistic {d:.3f} > {critical:.3f}"
            )
    found.metrics["initial parameters KS / critical (worst)"] = worst


def ks(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    """Two-sample Kolmogorov-Smirnov statistic and its critical value at alpha = 0.001."""
    n, m = a.numel(), b.numel()
    values = torch.cat([a, b]).sort().values
    cdf_a = torch.searchsorted(a.sort().values, values, right=True) / n
    cdf_b = torch.searchsorted(b.sort().values, values, right=True) / m
    return (cdf_a - cdf_b).abs().max().item(), KS_ALPHA_C * math.sqrt((n + m) / (n * m))


def reset_error(cell: Cell, exc: BaseException | None) -> Findings:
    """A negative cell: module init of a model lacking reset_parameters must raise Thunder's
    TypeError naming the module."""
    found = Findings()
    lacking = fixture_for(cell.model, cell.spec).lacks_reset
    with found.expect("materialization of a module without reset_parameters"):
        assert exc is not None, f"setup succeeded although {lacking} has no reset_parameters"
        assert f"{lacking}.reset_parameters" in str(exc), f"the TypeError does not name {lacking}: {exc}"
    found.metrics["setup error"] = None if exc is None else f"{type(exc).__name__}: {exc}"
    return found


AREA = Area("materialization", check, refusal=reset_error)
