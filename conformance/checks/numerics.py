"""Numerics: the Thunder module trains exactly like eager PyTorch on the same weights.

Compared on every rank at every step (three SGD steps, then three AdamW steps): this rank's
output, the full gradients, and the full parameters after the optimizer step. Each kind of
comparison reports the first step where it fails (a later step's failure is a finding too:
a gradient off only once the optimizer state exists, an update that is not applied).

Float32 is held to fixed tolerances. Below float32, eager PyTorch is itself only an
approximation, so every tolerance comes from eager's own error against a float32 twin that
trains in lockstep from the same weights, or from the dtype itself, never a fixed number:
- per element, Thunder may differ from eager by ``EAGER_ERROR_FACTOR`` x the larger of
  eager's worst distance from the twin and the dtype's worst rounding of the twin's values,
  plus one unit of the dtype's relative spacing (``torch.finfo(dtype).eps``: two results
  rounded from nearly equal values may differ in their last bit);
- as a whole (2-norm per tensor), Thunder's distance from the twin is at most
  ``EAGER_ERROR_FACTOR`` x eager's (or x the dtype's rounding of the twin): a gradient
  scaled by 1% moves it by 1% of its size, about four times bfloat16's rounding;
- each step's update (parameters after less before) as a whole against the twin's update,
  the same way, the rounding of both endpoints as its floor, plus what the optimizer makes of
  gradients that are each off by as much as eager's own (``EAGER_ERROR_FACTOR`` x eager's
  error per element, or the dtype's rounding of the twin's gradient): AdamW divides by the
  gradients' running root mean square, so where an element's gradients nearly cancel, an
  error well inside the gradient's tolerance moves its update by a large fraction (measured:
  15% of one element's update at the second AdamW step, from gradients that passed). The
  allowance is the optimizer's first-order sensitivity to each step's gradient
  (``propagated``), computed from the twin's gradients and the optimizer's hyperparameters. A
  skipped step or an update applied twice still moves the update by its whole size.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from conformance.checks.area import Area
from conformance.checks.findings import Findings, strict_unless_finite
from conformance.checks.record import CellRecord, ParametersAfter, RankGradients, ScenarioRecord, StepRecord
from conformance.checks.storages import tie_groups
from conformance.matrix.cells import Cell
from fixtures import patterns
from fixtures.compositions import COMPOSITIONS
from fixtures.models import MODELS
from fixtures.optimizers import OPTIMIZERS, Optimizer
from fixtures.options import MICRO_STEPS

Tensors = dict[str, torch.Tensor]

# assert_close tolerances for float32: sharded reductions sum in another order than eager,
# and the optimizer steps compound it, so they sit a little above assert_close's defaults.
FLOAT32 = {"rtol": 1e-5, "atol": 1e-5}
EAGER_ERROR_FACTOR = 2.0


def check(run: CellRecord) -> Findings:
    found = Findings()
    low = run.dtype != torch.float32
    before = run.before
    failed: set[str] = set()  # kinds already failing: only the first step is reported
    phase: list[StepRecord] = []  # the steps of the optimizer now stepping (each starts fresh)
    # per parameter: what the optimizer made of gradients off as far as eager's, this step and
    # summed over the steps so far (Thunder's parameters may drift from the twin's by the sum)
    moved: dict[str, torch.Tensor] = {}
    drift: dict[str, torch.Tensor] = {}
    constants = scale_constants(run.cell)
    # each rank's rows where they are its shard (FSDP's), not where every rank holds all
    shards = 1 if COMPOSITIONS[run.cell.composition].replicated else run.cell.world_size
    for k, step in enumerate(run.steps):
        phase = [*phase, step] if phase and phase[-1].optimizer == step.optimizer else [step]
        if low:
            moved = _moved(phase, step.after.golden or {}, run.dtype, run.cell.world_size)
            drift = {n: drift[n] + m if n in drift else m for n, m in moved.items()}
        kinds: dict[str, tuple[Tensors, Tensors, Tensors | None]] = {
            "output": ({"output": step.output}, {"output": step.reference_output}, _output(step.golden_output)),
            "gradients": (step.grads, step.reference_grads, step.golden_grads),
            "parameters": (step.after.thunder, step.after.reference, step.after.golden),
            # what the forward made of this rank's buffers (running statistics): from this
            # rank's micro-batches alone
            "buffers": (step.buffers, step.reference_buffers, step.golden_buffers),
        }
        # below float32, what the parameters' drift so far makes of this step's output and
        # gradients (the twin at Thunder's weights against the twin at its own): allowed on top
        allowed: dict[str, Tensors | None] = {"parameters": drift}
        if low:
            allowed["output"] = drift_effect(_output(step.twin_at_thunder_output), _output(step.golden_output))
            allowed["gradients"] = drift_effect(step.twin_at_thunder_grads, step.golden_grads)
        # below float32, gradients may also stray as far as eager's own when each rank's is
        # computed alone (rounded per rank, as a data-parallel rank rounds it before reducing)
        local = Local.of(step.local_at_thunder, step.twin_at_thunder_grads, run.cell.world_size - 1, run.dtype)
        for kind, (actual, expected, golden) in kinds.items():
            if kind in failed:
                continue
            what = f"{kind} at step {k} ({step.optimizer})"
            per_rank = local if kind == "gradients" else None
            # a buffer the forward updates (running statistics, r' = (1 - m) r + m x) may be
            # rounded three times at each of the k + 1 updates so far (the batch statistic x,
            # the decayed r, their sum) by a decomposition, where eager's fused kernel rounds
            # once (measured: a BatchNorm's running mean 2.06 and 2.2 x eager's distance at 3
            # and 4 ranks): its floor is that many roundings of the twin's value
            roundings = 3 * (k + 1) if kind == "buffers" else 1
            if not _compare(found, what, actual, expected, golden, run.dtype, allowed.get(kind), per_rank, roundings):
                failed.add(kind)
        if low and "update" not in failed and not _update(found, k, phase, before, run.dtype, moved):
            failed.add("update")
        if low and "gradient scale" not in failed and step.local_at_thunder is not None:
            what = f"gradient scale at step {k} ({step.optimizer})"
            if not judge_gradient_scale(
                found, what, step.grads, step.local_at_thunder.mean, run.dtype, constants, shards
            ):
                failed.add("gradient scale")
        before = step.after

    fixture = MODELS.get(run.cell.model)
    if fixture is not None and fixture.output_dropout is not None:
        judge_dropout(found, [s.output for s in run.steps], fixture.output_dropout)
    if run.scenario is not None:
        judge_scenario(found, run.scenario, run.dtype, run.cell.world_size)

    # Tied names must resolve to one parameter: one shard, one gradient, one update.
    for group in tie_groups(run.reference):
        with found.expect(f"tied parameters {group}"):
            distinct = {id(run.thunder_module.get_parameter(n)) for n in group}
            assert len(distinct) == 1, f"the Thunder module holds {len(distinct)} distinct tensors for one tied weight"
    return found


# How a scenario's findings name what it compared (conformance/rank/scenarios/).
PHRASES = {
    "infer": "under no_grad",
    "accumulate": f"accumulated over {MICRO_STEPS} micro-steps",
    "reshape": "at the second input shape",
    "resume": "after resuming from a checkpoint",  # judged by the state_dict area: it records no output here
}


# how many binomial standard deviations the fraction a dropout dropped may stray from p: a
# false alarm below one in 10^8 cells, and a dropout at half its p (0.125 for 0.25 over this
# rank's 1080 outputs: 9.5 deviations) still fails
DROPOUT_DEVIATIONS = 6.0


def judge_dropout(found: Findings, outputs: list[torch.Tensor], p: float) -> None:
    """The masks of a dropout that is the model's last op, read from this rank's outputs
    (zero where dropped; the eager models replayed them, so outputs and gradients were
    compared exactly): over the training steps they drop p of the elements, within
    ``DROPOUT_DEVIATIONS`` binomial standard deviations, and no step draws the mask the step
    before it drew (Thunder must draw anew every step, not replay one draw)."""
    masks = [o == 0 for o in outputs]
    n = sum(m.numel() for m in masks)
    if not n:
        return
    dropped = sum(int(m.sum()) for m in masks) / n
    bound = DROPOUT_DEVIATIONS * math.sqrt(p * (1 - p) / n)
    found.metrics["dropout fraction dropped"] = {"measured": dropped, "p": p, "bound": bound}
    with found.expect("dropout fraction dropped"):
        assert abs(dropped - p) <= bound, (
            f"{dropped:.4f} of {n} outputs dropped over {len(masks)} steps, expected p = {p} within {bound:.4f} "
            f"({DROPOUT_DEVIATIONS:g} binomial standard deviations)"
        )
    for k in range(1, len(masks)):
        with found.expect(f"dropout mask at step {k}"):
            same = masks[k].shape == masks[k - 1].shape and torch.equal(masks[k], masks[k - 1])
            assert not same, f"the mask of step {k - 1} again: the dropout did not draw anew"


# how many standard deviations of the roundings' own scatter a gradient's scale may stray
# from eager's at the same weights: the worst measured on the pin is 4.1 of them (0.69 of the
# bound, a litgpt_neox matrix; median 0.43 of it) over ci's 19 and nightly's first 108
# bfloat16 cells, every group and step
SCALE_DEVIATIONS = 6.0
SCALE_MIN_ELEMENTS = 64  # a tensor judged alone needs this many elements to estimate its scatter


def scale_constants(cell: Cell) -> list[float]:
    """The constants that scale every gradient of ``cell`` on its way, which an implementation
    may round in the cell's dtype or not: 1/world_size (averaging over the ranks) and the
    model's dropout scale 1/(1 - p)."""
    constants = [1.0 / cell.world_size]
    fixture = MODELS.get(cell.model)
    if fixture is not None and fixture.output_dropout is not None:
        constants.append(1.0 / (1.0 - fixture.output_dropout))
    return constants


def judge_gradient_scale(
    found: Findings,
    what: str,
    actual: Tensors,
    local: Tensors,
    dtype: torch.dtype,
    constants: list[float],
    world: int = 1,
) -> bool:
    """Below float32, a gradient off by a scale that eager's rounding hides elementwise (1%
    is about one bfloat16 rounding), on any step. ``local``: eager's gradients of each rank's
    own loss at the weights the Thunder module held as the step began, in the cell's dtype,
    averaged exactly: what the ranks hand their reduction. Thunder's reduced gradient T
    differs from that S by the reduction's roundings and its local computation's, which round
    to nearest and so do not point along the gradient: the scale a = <T - S, S> / <S, S> is
    zero but for their scatter, which the residuals r = T - S - a S estimate:
    sd(a)^2 = sum over units of (sum over the unit of r * S)^2 / <S, S>^2, the units being a
    tensor's elements, plus (for a matrix) its rows and its columns, because a rounded
    upstream gradient spreads along a row of a Linear's weight gradient and a rounded
    activation along a column. Allowed on top: what rounding each of ``constants``
    (``scale_constants``) in the dtype changes it by. Judged over all gradients together,
    per matrix of at least SCALE_MIN_ELEMENTS elements and over each of the ``world`` ranks'
    rows of the matrices (unless all are off; ``world`` 1 where no rank holds a shard)."""
    systematic = sum(abs(torch.tensor(c, dtype=dtype).double().item() / c - 1.0) for c in constants)
    pairs: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for n, s in local.items():
        t = actual.get(n)
        if t is None or t.shape != s.shape or not t.is_floating_point() or not bool(t.isfinite().all()):
            continue  # reported by the elementwise comparison
        if not s.numel():
            continue
        pairs[n] = (_rows(t), _rows(s))
    failures = len(found.failures)
    worst = 0.0
    # a tensor alone: a matrix, whose rows and columns bound how its roundings are shared (a
    # vector's, a bias summed over the batch, are shared in ways its elements cannot show:
    # measured, 6.1 element deviations on a litgpt_neox bias): vectors count in "all" only
    groups = {"all": list(pairs.values())} | {
        n: [pair] for n, pair in pairs.items() if pair[1].shape[1] > 1 and pair[1].numel() >= SCALE_MIN_ELEMENTS
    }
    # each rank's rows of every gradient (dim 0 split as FSDP shards it, padded): a bug in
    # one rank's share of the reduction (a scale on its shard alone) shows there at full size
    for r in range(world if world > 1 else 0):
        share = []
        for t, s in pairs.values():
            c = patterns.chunk_rows(len(s), world)  # the rows of a shard
            rows = slice(r * c, (r + 1) * c)
            if s.shape[1] > 1 and len(s[rows]):  # matrices only, as above
                share.append((t[rows], s[rows]))
        groups[f"rank {r}'s rows"] = share
    for label, members in groups.items():
        size = sum(float((s * s).sum()) for _, s in members)
        if size == 0.0 or sum(s.numel() for _, s in members) < SCALE_MIN_ELEMENTS:
            continue
        scale = sum(float(((t - s) * s).sum()) for t, s in members) / size
        scatter = 0.0
        for t, s in members:
            x = (t - s - scale * s) * s
            scatter += float((x * x).sum())
            if x.shape[1] > 1:  # a matrix: its rows and its columns too
                scatter += float((x.sum(1) ** 2).sum()) + float((x.sum(0) ** 2).sum())
        sd = math.sqrt(scatter) / size
        bound = systematic + SCALE_DEVIATIONS * sd
        worst = max(worst, abs(scale) / bound if bound else (0.0 if scale == 0 else float("inf")))
        if label == "all":
            found.metrics[f"{what} (all gradients)"] = {"scale": 1 + scale, "bound": bound}
        elif len(found.failures) > failures and not label.startswith("rank "):
            continue  # off already: each tensor's scale would say it again (a rank's names the rank)
        with found.expect(f"{what} [{label}]"):
            assert abs(scale) <= bound, (
                f"Thunder's gradients are {1 + scale:.5f} x eager's at the same weights (each rank's own in "
                f"{str(dtype).removeprefix('torch.')}, averaged); the roundings scatter that by {sd:.2e}: "
                f"at most 1 +- {bound:.2e} ({SCALE_DEVIATIONS:g} of those"
                + (f", plus {systematic:.2e} from scale constants rounded in that dtype)" if systematic else ")")
            )
    found.metrics[f"{what} |scale| / bound (worst)"] = worst
    return len(found.failures) == failures


def _rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` in float64 as a matrix of its rows (dim 0 by the rest; a vector: one column)."""
    return t.double().reshape(t.shape[0] if t.dim() else 1, -1)


def judge_scenario(found: Findings, record: ScenarioRecord, dtype: torch.dtype, world: int) -> None:
    """What the cell's scenario did after training, against eager PyTorch holding the Thunder
    module's own weights: its output and gradients with the same tolerances as a training
    step's (below float32, from that eager model's float32 twin); under no_grad, a result
    that needs no gradient. Gradients that equal one of the record's recognisable mistakes
    fail once, naming it."""
    phrase = PHRASES[record.scenario]
    first = "output" if record.scenario != "accumulate" else "gradients"
    if record.error is not None:
        # the first line names the kind of refusal (what an xfails entry pins), the next what Thunder said
        kind = record.error.split(":", 1)[0]
        found.failures.append(f"{first} {phrase}: Thunder raised {kind}\n{record.error}")
        return
    if record.requires_grad is not None:
        with found.expect(f"output {phrase} needs no gradient"):
            assert not record.requires_grad, "it requires grad: Thunder recorded the computation for a backward"
    if record.output is not None and record.reference_output is not None:
        actual, expected = {"output": record.output}, {"output": record.reference_output}
        _compare(found, f"output {phrase}", actual, expected, _output(record.golden_output), dtype)
    if record.grads is None or record.reference_grads is None:
        return
    what = f"gradients {phrase}"
    scratch = Findings()
    # the twin holds the same weights; each micro-step accumulated adds one more addition
    additions = world - 1 + (MICRO_STEPS - 1 if record.scenario == "accumulate" else 0)
    local = Local.of(record.local, record.golden_grads, additions, dtype)
    ok = _compare(scratch, what, record.grads, record.reference_grads, record.golden_grads, dtype, local=local)
    found.metrics.update(scratch.metrics)
    if ok:
        return
    for name, (reference, golden) in record.alternatives.items():
        local = Local.of(record.alternatives_local.get(name), golden, additions, dtype)
        if _compare(Findings(), what, record.grads, reference, golden, dtype, local=local):
            found.failures.append(f"{what}: equal {name}")
            return
    found.failures += scratch.failures


def _compare(
    found: Findings,
    what: str,
    actual: Tensors,
    expected: Tensors,
    golden: Tensors | None,
    dtype: torch.dtype,
    drift: Tensors | None = None,
    local: Local | None = None,
    roundings: int = 1,
) -> bool:
    """Tensors of one kind against eager's: in float32 at FLOAT32; below it per element from
    eager's own error against the float32 twin ``golden`` (plus the worst element of
    ``drift``, per name), and each tensor as a whole (plus the norm of ``drift``). ``local``:
    gradients eager computed per rank beside their twin, whose error counts as eager's too."""
    if dtype == torch.float32:
        return found.close(what, actual, expected, **FLOAT32)
    per_name = eager_error(expected, golden, dtype, local, roundings)
    for n, d in (drift or {}).items():
        if n in per_name:
            per_name[n]["atol"] += d.max().item()
    ok = found.close(what, actual, expected, per_name, rtol=torch.finfo(dtype).eps, atol=0.0)
    return _as_whole(found, what, actual, expected, golden or {}, dtype, drift, local, roundings) and ok


@dataclasses.dataclass(frozen=True)
class Local:
    """Gradients as data-parallel ranks compute them before reducing: eager's gradient of each
    rank's own loss in the cell's dtype (``ranks``: their mean and mean magnitude) and the
    float32 twin's at the same weights (``golden``). A reduction rounds each rank's gradient to
    the dtype and then every partial sum, where eager's gradient of the averaged loss rounds
    once. So Thunder may stray EAGER_ERROR_FACTOR x the larger of eager's error and the
    per-rank mean's (which holds the ranks' roundings), plus what the reduction's own
    roundings can add: ``reduction`` (found in bfloat16 where a sum's terms nearly cancel, a
    bias or a BatchNorm's: 1.01 to 3 x eager's single rounding, more at 3 ranks than at 2)."""

    ranks: RankGradients
    golden: Tensors
    additions: int  # the reduction's: world - 1 (and an accumulation's, one per micro-step more)
    dtype: torch.dtype

    @classmethod
    def of(
        cls, ranks: RankGradients | None, golden: Tensors | None, additions: int, dtype: torch.dtype
    ) -> Local | None:
        return None if ranks is None or golden is None else cls(ranks, golden, additions, dtype)

    def error(self, n: str) -> torch.Tensor | None:
        """Per element, the per-rank mean's distance from the twin (None where either lacks
        ``n`` or their shapes differ)."""
        e, g = self.ranks.mean.get(n), self.golden.get(n)
        if e is None or g is None or e.shape != g.shape or not e.numel():
            return None
        return (e.double() - g.double()).abs()

    def reduction(self, n: str) -> torch.Tensor | None:
        """Per element, the most the reduction's roundings move the mean: its additions (world
        - 1, and one per micro-step accumulated), each rounding a partial sum of at most the
        ranks' magnitudes (mean units), and the division by the world size, u = eps / 2 each:
        u (additions A + |mean|)."""
        a, m = self.ranks.magnitude.get(n), self.ranks.mean.get(n)
        if a is None or m is None or a.shape != m.shape:
            return None
        u = torch.finfo(self.dtype).eps / 2
        return u * (self.additions * a + m.abs())


def _output(golden: torch.Tensor | None) -> Tensors | None:
    return None if golden is None else {"output": golden}


def rounding(golden: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """How far the twin's float32 values move when stored in ``dtype``: the error even an
    exact computation in ``dtype`` has."""
    g = golden.double()
    return (g.to(dtype).double() - g).abs()


def eager_error(
    expected: Tensors, golden: Tensors | None, dtype: torch.dtype, local: Local | None = None, roundings: int = 1
) -> dict[str, dict[str, float]]:
    """Per-name atol: EAGER_ERROR_FACTOR x the largest of eager's own distance from the float32
    twin, per-rank eager's (``local``) and the dtype's rounding of the twin (each per element,
    the worst element; the rounding taken ``roundings`` times), plus the reduction's worst
    rounding (``Local.reduction``)."""
    if golden is None:
        return {}
    out = {}
    for n, e in expected.items():
        g = golden.get(n)
        if g is None or g.shape != e.shape or not e.is_floating_point() or not e.numel():
            continue
        eager = (e.double() - g.double()).abs().max().item()
        per_rank = local.error(n) if local is not None else None
        reduction = local.reduction(n) if local is not None else None
        floor = roundings * rounding(g, dtype).max().item()
        worst = max(eager, per_rank.max().item() if per_rank is not None else 0.0, floor)
        reduced = reduction.max().item() if reduction is not None and reduction.numel() else 0.0
        out[n] = {"atol": EAGER_ERROR_FACTOR * worst + reduced}
    return out


def _as_whole(
    found: Findings,
    what: str,
    actual: Tensors,
    expected: Tensors,
    golden: Tensors,
    dtype: torch.dtype,
    extra: Tensors | None = None,
    local: Local | None = None,
    roundings: int = 1,
) -> bool:
    """Each tensor as a whole: its distance (2-norm) from the float32 twin at most
    EAGER_ERROR_FACTOR x eager's (or per-rank eager's, ``local``), or x the dtype's rounding
    of the twin (``roundings`` times) where that is larger, plus the norm of the reduction's
    roundings (``local``)
    and of ``extra`` (per element; parameters: the
    drift the optimizer's steps allow). A systematic error (a scale, a skipped term) that no
    single element shows fails here."""
    failures = len(found.failures)
    worst = 0.0
    for n, g in golden.items():
        t, e = actual.get(n), expected.get(n)
        if t is None or e is None or t.shape != g.shape or not g.is_floating_point():
            continue  # reported by the elementwise comparison
        thunder_err = (t.double() - g.double()).norm().item()
        eager_err = (e.double() - g.double()).norm().item()
        per_rank = local.error(n) if local is not None else None
        if per_rank is not None and per_rank.shape == g.shape:
            eager_err = max(eager_err, per_rank.norm().item())
        bound = EAGER_ERROR_FACTOR * max(eager_err, roundings * rounding(g, dtype).norm().item())
        reduction = local.reduction(n) if local is not None else None
        if reduction is not None and reduction.shape == g.shape:
            bound += reduction.norm().item()
        if extra is not None and n in extra and extra[n].shape == g.shape:
            bound += extra[n].norm().item()
        bound = strict_unless_finite(bound)
        worst = max(worst, thunder_err / bound if bound else (0.0 if thunder_err == 0 else float("inf")))
        with found.expect(f"{what} [{n}] as a whole"):
            assert thunder_err <= bound, (
                f"{thunder_err:.3g} away from the float32 twin (size {g.double().norm().item():.3g}); "
                f"eager is {eager_err:.3g} away: bound {bound:.3g}"
            )
    found.metrics[f"{what} distance / bound (worst)"] = worst
    return len(found.failures) == failures


def drift_effect(at_thunder: Tensors | None, golden: Tensors | None) -> Tensors | None:
    """Per name and element, how far the twin's result at the Thunder module's weights sits
    from the twin's at its own: what the weights' drift (allowed) makes of the result."""
    if at_thunder is None or golden is None:
        return None
    return {
        n: (t.double() - golden[n].double()).abs()
        for n, t in at_thunder.items()
        if n in golden and t.shape == golden[n].shape and t.is_floating_point()
    }


def gradient_allowance(step: StepRecord, n: str, dtype: torch.dtype, world: int | None = None) -> torch.Tensor | None:
    """Per element, how far Thunder's gradient of ``n`` may sit from the twin's at ``step``
    as eager's does: EAGER_ERROR_FACTOR x the larger of eager's distance and the dtype's
    rounding of the twin's gradient (given ``world``, per-rank eager's distance too, and the
    reduction's roundings on top: ``Local``), plus what the weights' drift makes of the
    gradient (None where eager's or the twin's is missing: no allowance)."""
    g = (step.golden_grads or {}).get(n)
    e = step.reference_grads.get(n)
    if g is None or e is None or g.shape != e.shape:
        return None
    error = (e.double() - g.double()).abs()
    local = Local.of(step.local_at_thunder, step.twin_at_thunder_grads, world - 1, dtype) if world else None
    per_rank = local.error(n) if local is not None else None
    if per_rank is not None and per_rank.shape == g.shape:
        error = torch.maximum(error, per_rank)
    allowance = EAGER_ERROR_FACTOR * torch.maximum(error, rounding(g, dtype))
    reduction = local.reduction(n) if local is not None else None
    if reduction is not None and reduction.shape == g.shape:
        allowance = allowance + reduction
    effect = (drift_effect(step.twin_at_thunder_grads, step.golden_grads) or {}).get(n)
    return allowance if effect is None else allowance + effect


def propagated(
    optimizer: Optimizer, phase: list[StepRecord], n: str, dtype: torch.dtype, world: int | None = None
) -> torch.Tensor | None:
    """Per element, how far the update of the last step of ``phase`` (the steps of one fresh
    optimizer so far) moves, to first order, when each step's gradient is off by its
    ``gradient_allowance``. SGD: lr x the allowance. AdamW, with r = m^/(sqrt(v^) + eps) and
    c1_j, c2_j the bias-corrected weights of step j's gradient in m^ and v^:
    |dr/dg_j| <= c1_j / (sqrt(v^) + eps) + |m^| c2_j |g_j| / (sqrt(v^) (sqrt(v^) + eps)^2)."""
    allowances = [gradient_allowance(s, n, dtype, world) for s in phase]
    grads = [(s.golden_grads or {}).get(n) for s in phase]
    if any(a is None for a in allowances) or any(g is None for g in grads):
        return None
    if optimizer.name == "SGD":
        return optimizer.lr * allowances[-1]
    b1, b2 = optimizer.betas
    a = len(phase)
    c1 = [(1 - b1) * b1 ** (a - j) / (1 - b1**a) for j in range(1, a + 1)]
    c2 = [(1 - b2) * b2 ** (a - j) / (1 - b2**a) for j in range(1, a + 1)]
    g = [t.double() for t in grads]
    m = sum(c * t for c, t in zip(c1, g, strict=True))
    root = sum(c * t * t for c, t in zip(c2, g, strict=True)).sqrt()
    d = root + optimizer.eps
    # where every gradient so far is exactly zero, v^ is too: only the first term remains
    second = torch.where(root > 0, m.abs() / (root * d * d).clamp_min(torch.finfo(torch.float64).tiny), 0.0)
    sensitivity = sum(
        al * (c / d + second * c2_j * gj.abs()) for al, c, c2_j, gj in zip(allowances, c1, c2, g, strict=True)
    )
    return optimizer.lr * sensitivity


def _moved(phase: list[StepRecord], golden: Tensors, dtype: torch.dtype, world: int) -> Tensors:
    """``propagated`` for every parameter of the twin that has one (of its shape)."""
    optimizer = OPTIMIZERS[phase[-1].optimizer]
    out = {}
    for n, g in golden.items():
        m = propagated(optimizer, phase, n, dtype, world)
        if m is not None and m.shape == g.shape:
            out[n] = m
    return out


def _update(
    found: Findings, k: int, phase: list[StepRecord], before: ParametersAfter, dtype: torch.dtype, moved: Tensors
) -> bool:
    """Each parameter's update at step ``k`` (the last of ``phase``) against the twin's, as
    whole tensors; ``moved``: per parameter, ``propagated`` at this step."""
    failures = len(found.failures)
    worst = 0.0
    step = phase[-1]
    after, optimizer = step.after, OPTIMIZERS[step.optimizer]
    for n, g_after in (after.golden or {}).items():
        with found.expect(f"update at step {k} ({optimizer.name}) [{n}]"):
            t_after, t_before = after.thunder.get(n), before.thunder.get(n)
            assert t_after is not None and t_before is not None, "missing"
            assert t_after.shape == g_after.shape, f"shape {tuple(t_after.shape)}, expected {tuple(g_after.shape)}"
            g_before = before.golden[n].double() if before.golden is not None else None
            assert g_before is not None, "the twin's parameters before the step are missing"
            twin = g_after.double() - g_before
            thunder = t_after.double() - t_before.double()
            eager = after.reference[n].double() - before.reference[n].double()
            thunder_err = (thunder - twin).norm().item()
            eager_err = (eager - twin).norm().item()
            floor = (rounding(g_after, dtype).norm() + rounding(g_before, dtype).norm()).item()
            allowed = moved[n].norm().item() if n in moved else 0.0
            bound = EAGER_ERROR_FACTOR * max(eager_err, floor) + allowed
            bound = strict_unless_finite(bound)
            worst = max(worst, thunder_err / bound if bound else (0.0 if thunder_err == 0 else float("inf")))
            assert thunder_err == thunder_err and thunder_err <= bound, (
                f"the update is {thunder_err:.3g} away from the float32 twin's (size {twin.norm().item():.3g}); "
                f"eager's is {eager_err:.3g} away, the dtype's rounding {floor:.3g}, what the optimizer makes of "
                f"gradients off as far as eager's {allowed:.3g}: bound {bound:.3g}"
            )
    found.metrics[f"update at step {k} distance / bound (worst)"] = worst
    return len(found.failures) == failures


AREA = Area("numerics", check)
