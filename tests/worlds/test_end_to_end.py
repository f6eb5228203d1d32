"""The real suite through pytest, read back from every report it writes."""

from __future__ import annotations

import collections
import json
import re
import subprocess
import sys

import pytest

from conformance.checks.registry import AREAS, applies
from conformance.frontend.chaos import Chaos, Fault
from conformance.frontend.lifetimes import Lifetimes
from conformance.matrix.axes import axis_values
from conformance.matrix.cells import AXES, QUIET_DEFAULTS, Cell
from conformance.matrix.coverage import unmet_pairs
from conformance.matrix.profiles import BOUNDARY_WORLD_SIZES, cells
from conformance.matrix.resharded import worlds_of
from conformance.matrix.simulated import sampled_ranks
from conformance.reports.outcomes import CHAOS_LOST
from fixtures.compositions import COMPOSITIONS, pairing
from fixtures.offloads import POLICIES
from tests.support.suite_runs import (
    ROOT,
    SuiteRun,
    offered,
    reused_ci_run,
    run_suite,
    runs_to_the_end,
    unsupported_values,
)

pytestmark = pytest.mark.slow  # starts worlds or runs the suite in a subprocess


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory) -> SuiteRun:
    # The whole ci profile, or the run .ci/run made of it just before (CI_REPORT_ENV). The
    # timeout only guards against a hang (each cell has a deadline of its own), so it leaves
    # room for a slow 2-core host, where the profile ran past 600 s
    return reused_ci_run() or run_suite(tmp_path_factory.mktemp("e2e"), timeout=1500, shared=False)


def unsupported(run: SuiteRun) -> dict[str, str]:
    """Probed value -> reason, as the cells reported unsupported say (the worlds' probe)."""
    return unsupported_values(run.report)


def test_every_cell_conforms_or_is_a_recorded_exception(suite: SuiteRun) -> None:
    assert suite.returncode == 0, suite.output
    # the legacy composition was removed from Thunder 0.2.1 on; nvFuser needs CUDA (torch.compile
    # runs on the CPU: its cells raise there, as the raises entries expect), and so does the
    # plugins API's default recipe
    assert set(unsupported(suite)) == {
        "legacy_jit_fsdp",
        "nvfuser",
        pairing("plugins_fsdp", "default"),
        pairing("plugins_ddp", "default"),
    }
    selected = cells("ci", 2, unsupported(suite))
    for area in AREAS:
        outcomes = suite.outcomes(area)
        assert set(outcomes) == {c.id for c in selected if applies(c, area)}
        for cell in selected:
            if not applies(cell, area):
                continue
            refused = {cell.composition, cell.executors, pairing(cell.composition, cell.executors)}
            if refused & set(unsupported(suite)):
                assert outcomes[cell.id] == "unsupported"
            else:
                assert outcomes[cell.id] in ("passed", "xfailed"), (cell.id, area)
    for item in suite.report["cells"]:
        if item["outcome"] == "xfailed":
            assert item["xfail_reason"] and "[expected: xfails]" in item["message"]
            # its findings, as a failure's message reads, or where a raises entry expected the
            # cell to raise (torchcompile's cells on the CPU), where in Thunder it raised: never
            # the kit's frames and locals
            found = item["message"].startswith(f"{item['cell']} does not conform")
            raised = item["message"].startswith(f"cell {item['cell']} did not run to completion: Thunder raised at ")
            assert found or raised, item["message"][:200]


def test_report_covers_every_axis_value_and_pair_that_runs(suite: SuiteRun) -> None:
    assert suite.report["profile"] == "ci"
    coverage = suite.report["coverage"]
    for axis, values in axis_values(2).items():
        assert set(coverage[axis]) >= set(map(str, values)), axis
        assert all(n > 0 for v, n in coverage[axis].items() if v not in unsupported(suite)), axis
    assert coverage["composition"]["legacy_jit_fsdp"] == 0  # its one cell is unsupported: it ran nothing
    simulated_sizes = {str(c.world_size) for c in cells("ci", 2, unsupported(suite)) if c.simulated}
    assert simulated_sizes and set(coverage["world_size"]) == {"2", *map(str, BOUNDARY_WORLD_SIZES), *simulated_sizes}
    # the only pairs that met in no cell that ran are those of the unsupported values, and the
    # refused pairs themselves
    refused = unsupported(suite)
    assert suite.report["unmet_pairs"]
    assert all(
        set(p.values()) & set(refused) or pairing(p.get("composition", ""), p.get("executors", "")) in refused
        for p in suite.report["unmet_pairs"]
    )
    ran = [c for c in cells("ci", 2, refused) if offered(c, refused)]
    assert suite.report["unmet_pairs"] == unmet_pairs(ran, 2, profile="ci")
    assert "composition=legacy_jit_fsdp ran in no cell" in suite.summary


def test_reports_agree_with_junit(suite: SuiteRun) -> None:
    junit = {}
    for case in suite.junit.iter("testcase"):
        nodeid = f"{case.get('classname').replace('.', '/')}.py::{case.get('name')}"
        if case.find("failure") is not None or case.find("error") is not None:
            junit[nodeid] = "failed"
        elif case.find("skipped") is not None:
            junit[nodeid] = "not run"  # JUnit has one word for xfail and unsupported
        else:
            junit[nodeid] = "passed"
    report = {c["id"]: c["outcome"] for c in suite.report["cells"]}
    as_junit = {
        k: {"xfailed": "not run", "unsupported": "not run", "xpassed": "passed"}.get(v, v) for k, v in report.items()
    }
    streamed = {c["id"]: c["outcome"] for c in suite.jsonl}
    assert as_junit == junit
    assert report == streamed
    assert suite.report["counts"] == dict(collections.Counter(report.values()))


def test_junit_carries_each_cells_axes(suite: SuiteRun) -> None:
    cases = [c for c in suite.junit.iter("testcase") if "generated" not in c.get("name")]
    assert len(cases) == sum(applies(c, a) for c in cells("ci", 2, unsupported(suite)) for a in AREAS)
    for case in cases:
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        simulated = case.get("name").endswith("sim]")  # a simulated cell says so in its axes too
        resharded = re.search(r"-ws\d+to\d+\]$", case.get("name")) is not None  # and a resharded resume
        axes = set(json.loads(props["axes"])) - set(QUIET_DEFAULTS)  # written where not at their default
        extra = {"simulated"} if simulated else {"saved_at"} if resharded else set()
        assert axes == set(AXES) - set(QUIET_DEFAULTS) | extra


def ended_early(item: dict) -> bool:
    """Whether the cell's task did not end on every rank (a rank raised, died or was aborted):
    such a rank has a status but no findings of the item's area."""
    return any(r["status"] != "passed" and "failures" not in r for r in item["ranks"])


def planned_starts(items: list[dict]) -> int:
    """The worlds a run of ``items`` (in the order they ran) starts: the probe's world, then
    each world an item needs that the kit's own lifetimes' rules (conformance/frontend/
    lifetimes.py, one idle world, a tox run's foresight) had closed, or that a task which did
    not end on every rank had (the controller never reuses a world after one: a raise may leave
    a collective half done), and never one a cell's findings closed."""
    ran = [i for i in items if "axes" in i and i["outcome"] != "unsupported"]
    # a resharded resume's saving world first, then the cell's own
    keys = [(worlds_of(Cell(**i["axes"])), i["id"]) for i in ran]
    broke = {i["id"] for i in ran if ended_early(i)}
    lifetimes = Lifetimes(max_idle=1, foresight=True)
    lifetimes.plan((item, key) for needed, item in keys for key in needed)
    open_worlds, started = {(2, False)}, 1  # the composition probe's
    run_cells: set[str] = set()
    for (needed, item), cell in zip(keys, (i["cell"] for i in ran), strict=True):
        for key in needed:
            lifetimes.used(key)
            if cell not in run_cells and key not in open_worlds:  # a cell's later areas read its task's answers
                open_worlds.add(key)
                started += 1
        key = needed[-1]
        run_cells.add(cell)
        if item in broke:
            open_worlds.discard(key)
        for closed in lifetimes.to_close(item, open_worlds):
            open_worlds.discard(closed)
    return started


def test_report_records_environment_and_measurements(suite: SuiteRun) -> None:
    env = suite.report["environment"]
    assert env["backend"] == "gloo" and env["world_size"] == 2
    assert env["thunder"] and env["torch"]
    # a healthy world is started again only where the lifetimes' rules closed it (one idle
    # world kept, the early-verdict order coming back to it), never because a cell broke it
    assert suite.report["worlds_started"] == planned_starts(suite.report["cells"]), "a healthy world was restarted"
    offloading: collections.Counter[str] = collections.Counter()  # policy -> most tensors one cell offloaded
    for cell in suite.report["cells"]:
        if "generated" in cell["id"]:  # examples of generated models are not cells of the matrix
            continue
        if cell["axes"].get("simulated"):  # its sampled ranks and metrics: tests/unit/test_scale.py
            assert [r["rank"] for r in cell["ranks"]] == list(sampled_ranks(cell["axes"]["world_size"]))
            continue
        # an axis added later is left out of the axes written at its default (a resharded
        # resume's saving world size beside them)
        assert set(AXES) - set(QUIET_DEFAULTS) <= set(cell["axes"]) <= {*AXES, "saved_at"}
        assert [r["rank"] for r in cell["ranks"]] == list(range(cell["axes"]["world_size"]))
        metrics = cell["metrics"]
        if cell["outcome"] != "passed":
            continue
        if COMPOSITIONS[cell["axes"]["composition"]].parallelism == "tensor":
            _assert_tensor_parallel_measured(cell)
            continue
        if cell["area"] == "numerics" and cell["axes"]["dtype"] == "float32":
            errors = {k: v for k, v in metrics.items() if k.startswith("gradients at step") and "max_abs_err" in k}
            assert len(errors) == 6 and max(errors.values()) < 1e-4, errors  # every step compared
        if cell["area"] == "collectives":
            # every step's forward, or each group of steps owing alike (PyTorch's DDP owes its
            # bucket rebuild's broadcasts in the second step's alone: "forward of steps 1")
            forwards = [v for k, v in metrics.items() if re.fullmatch(r"forward( of steps [\d, ]+)? all_gathers", k)]
            # FSDP gathers in the forward; DDP, every rank holding the whole model, gathers nothing
            gathers = not COMPOSITIONS[cell["axes"]["composition"]].replicated
            assert forwards, sorted(metrics)
            for fwd in forwards:
                assert fwd["expected"] == fwd["actual"] and (fwd["actual"] > 0) == gathers
        if cell["area"] == "offload":
            assert metrics["offloaded"]["expected"] == metrics["offloaded"]["actual"]
            policy = cell["axes"]["offload"]
            offloading[policy] = max(offloading[policy], metrics["offloaded"]["actual"])
        if cell["area"] == "memory":
            # Thunder's plan (an estimate, a walk along it) exists where Thunder's own transform
            # shards; under PyTorch's parallelism the bounds alone, from FSDP2's and DDP's design
            planned = COMPOSITIONS[cell["axes"]["composition"]].parallelism != "torch"
            for phase in ("setup", "forward", "backward"):
                peak = metrics[f"{phase} peak"]
                assert 0 < peak["measured"] <= peak["bound"], (cell["id"], phase, peak)
                assert not planned or peak["estimate"] > 0, (cell["id"], phase, peak)
            if not planned:
                continue
            for phase in ("forward", "backward"):
                # the walk of the plan is exact but for the copies a batched matmul may make of its
                # operands, allowed at its peak: a runtime under it by more shows the kit's model wrong
                along = metrics[f"{phase} peak along the plan"]
                over = along["measured"] - along["plan"]
                allowed = along.get("matmul copies allowed", 0)
                assert -allowed <= over <= along["gloo's late release"], (cell["id"], phase, along)
    assert set(offloading) == set(POLICIES) - {"none"} and all(offloading.values()), offloading


def _assert_tensor_parallel_measured(cell: dict) -> None:
    """What a passed tensor-parallel cell's report holds: every step's output compared with
    eager's whole model and eager tensor parallelism, Megatron's all-reduces counted and no
    gather, and exact bytes and elements a rank holds (a CPU world)."""
    metrics = cell["metrics"]
    if cell["area"] == "numerics":
        errors = {k: v for k, v in metrics.items() if k.endswith("max_abs_err")}
        assert any(k.startswith("step 0 output against eager's whole model") for k in errors), sorted(metrics)
        assert any(k.startswith("step 0 output against eager tensor parallelism") for k in errors), sorted(metrics)
        assert max(errors.values()) < 1e-4, errors
    if cell["area"] == "collectives":
        counted = {k: v for k, v in metrics.items() if isinstance(v, dict) and "expected" in v}
        assert all(v["expected"] == v["actual"] for v in counted.values()), counted
        assert counted["forward all_reduces"]["actual"] > 0 and counted["forward all_gathers"]["actual"] == 0, counted
    if cell["area"] == "memory":
        held = metrics["retained after setup"]
        assert 0 < held["measured"] == held["bound"], (cell["id"], held)
    if cell["area"] == "sharding":
        held = metrics["elements held"]
        assert 0 < held["actual"] == held["expected"], (cell["id"], held)


def test_summary_shows_every_cell(suite: SuiteRun) -> None:
    lines = suite.summary.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("| model |"))
    table = lines[header + 2 : lines.index("", header)]
    assert len(table) == len(cells("ci", 2, unsupported(suite)))
    assert "## Memory: bound / measured per cell" in suite.summary
    assert "![measured against estimated memory](memory.png)" in suite.summary
    assert (suite.report_dir / "memory.png").read_bytes().startswith(b"\x89PNG")
    assert f"{suite.report['counts']['passed']} passed" in suite.summary
    assert "## Known non-conformances" in suite.summary


def test_isolate_starts_a_world_per_cell(tmp_path) -> None:
    # two cells show a world each as well as four would, at half the starts
    two = [c.id for c in cells("smoke", 2, {}) if c.composition != "legacy_jit_fsdp"][:2]
    run = run_suite(tmp_path, "--isolate", "--profile", "smoke", "-k", " or ".join(two), shared=False)
    assert run.returncode == 0, run.output
    assert run.report["worlds_started"] == 2


def test_each_xdist_worker_owns_a_world(tmp_path) -> None:
    run = run_suite(
        tmp_path, "-n", "2", "--dist", "loadgroup", "--profile", "smoke", "-k", "not generated", shared=False
    )
    assert run.returncode == 0, run.output
    assert len(run.report["cells"]) == sum(applies(c, a) for c in cells("smoke", 2, {}) for a in AREAS)
    assert run.report["worlds_started"] >= 1
    # loadgroup keeps both areas of a cell on one worker, so both read one run of it
    runs = collections.defaultdict(set)
    for item in run.report["cells"]:
        runs[item["cell"]].add(item["metrics"]["cell_run_s"])
    assert all(len(r) == 1 for r in runs.values()), runs


CHAOS_SHARE = 0.5
# phases every cell that trains passes through (a scenario's backward it may lack)
UNIVERSAL = {
    "Thunder's transforms",
    "recording setup",
    "forward",
    "gathering",
    "scenario",
    "state dict round trip",
    "checks",
}


def test_chaos_faults_only_its_cells(suite: SuiteRun, tmp_path) -> None:
    """--chaos on ci's four cheapest real cells that train, two of them faulted (a rank killed,
    a rank stopped): each faulted cell is xfailed naming the rank, how it was lost and the
    phase; every other item ends as in the ci run."""
    items = [i for i in suite.report["cells"] if "axes" in i]  # not a generated model's
    ran = {i["cell"]: Cell(**i["axes"]) for i in items if i["outcome"] != "unsupported"}
    cost = {i["cell"]: i["metrics"]["cell_run_s"] for i in items if i["cell"] in ran}
    # cells that train through every phase (a negative cell is refused in a twentieth of a
    # second, a torchcompile cell raises at its first step: no later phase to lose it in)
    probed = unsupported(suite)
    trained = [c for c in ran.values() if not c.simulated and c.world_size == 2 and runs_to_the_end(c, probed)]
    cheapest = sorted(trained, key=lambda c: cost[c.id])[:4]

    def planned(seed: int) -> dict[str, Fault]:
        return {c.id: f for c in cheapest if (f := Chaos(seed, CHAOS_SHARE).fault(c)) is not None}

    # the first seed that faults two of the four, at two phases every such cell passes through,
    # one rank killed and one stopped
    seed = next(
        s
        for s in range(1000)
        if len(planned(s)) == 2 == len({f.phase for f in planned(s).values()} & UNIVERSAL)
        and {f.how for f in planned(s).values()} == {"kill", "stop"}
    )
    faults = planned(seed)
    selection = " or ".join(c.id for c in cheapest)
    run = run_suite(tmp_path, "-k", selection, "--chaos", str(seed), "--chaos-share", str(CHAOS_SHARE))
    assert run.returncode == 0, run.output
    clean = {i["id"]: i["outcome"] for i in suite.report["cells"]}
    assert set(run.report["chaos"]["cells"]) == set(faults)
    for item in run.report["cells"]:
        fault = faults.get(item["cell"])
        if fault is None:
            assert item["outcome"] == clean[item["id"]], item
            continue
        assert item["chaos"]["verdict"] == CHAOS_LOST and item["outcome"] == "xfailed", item
        assert f"rank {fault.process} {fault.status()} during " in item["message"], item
        assert fault.phase in item["message"], item
    assert f"**--chaos {seed}** (share {CHAOS_SHARE}): 2 cells faulted: 2 {CHAOS_LOST}." in run.summary


@pytest.mark.parametrize("bad", [["--backend", "bogus"], ["--nproc", "0"]])
def test_usage_error_exits_with_pytests_usage_status(bad: list[str]) -> None:
    proc = subprocess.run([sys.executable, "-m", "pytest", "conformance", *bad], cwd=ROOT, capture_output=True)
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR
