"""``raises`` entries (issue 58): a cell that ends with a raise in Thunder's code is an
expected failure where an entry holding for it names that raise (its type, text its message
holds, the Thunder frame it comes from); another raise, or the same raise from another frame,
still fails, naming what the entry expected; an entry whose cells stop raising is stale. No
world: the verdict is judged on an Outcome given here, with a runner and an item stood in for."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from conformance.frontend import blame, ledger, xfails
from conformance.frontend.templates import Raise
from conformance.frontend.verdict import Conformance, Grouped
from conformance.matrix.cells import Cell
from conformance.world import protocol
from conformance.world.outcome import Outcome
from tests.support.verdicts import stand_in_runner

CELL = Cell("mlp", "real", "fsdp_jit", executors="torchcompile")
VERSION = "0.2.7.dev20260201"
RAISES = {
    "type": "torch._dynamo.exc.Unsupported",
    "message": "async_op=True for distributed collectives",
    "at": "thunder/executors/torch_compile.py:to_torch_translator",
}


def entry(raises: dict[str, str] | None = None, **fields: object) -> xfails.Expectation:
    base = {
        "area": None,
        "when": {"executors": ["torchcompile"]},
        "failures": [],
        "raises": raises or RAISES,
        "reason": "torch.compile refuses FSDP's asynchronous collectives.",
        "link": "a link",
        "thunder": [">=0.2.6"],
        "source": "xfails.toml:40",
    }
    return xfails.Expectation(**{**base, **fields})  # type: ignore[arg-type]


@pytest.fixture
def thunder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A Thunder package the blame reads frames against."""
    root = tmp_path / "site-packages" / "thunder"
    (root / "executors").mkdir(parents=True)
    monkeypatch.setattr(blame, "_thunder_root", lambda: root)
    return root


def raised(
    thunder: Path, kind: str = RAISES["type"], message: str = "", function: str = "to_torch_translator"
) -> Outcome:
    """Rank 0 raised ``kind`` in Thunder's torch_compile.py, rank 1 waited on it."""
    frames = [
        {"file": str(Path(__file__)), "line": 1, "function": "run_cell"},
        {"file": str(thunder / "executors" / "torch_compile.py"), "line": 99, "function": function},
    ]
    message = message or "async_op=True for distributed collectives (all_gather_into_tensor)"
    failed = protocol.RankResult(
        0,
        protocol.FAILED,
        error=f"Traceback ...\n{kind}: {message}",
        frames=frames,
        exception={"type": kind, "message": message},
    )
    return Outcome([failed, protocol.RankResult(1, protocol.ABORTED, error="waited")], 1.0, 0.0)


def verdict(
    entries: list[xfails.Expectation], outcome: Outcome, area: str = "numerics"
) -> tuple[type | None, str, list]:
    runner = stand_in_runner(entries, VERSION, run=lambda cell: outcome, baseline=None)
    runner.session.repro = lambda nodeid: f"python -m pytest {nodeid}"
    node = SimpleNamespace(user_properties=[], nodeid=f"conformance/test_{area}.py::test_{area}[{CELL.id}]")
    try:
        Conformance(runner, node)._expect(CELL, area, record=False)  # type: ignore[arg-type]
    except (pytest.fail.Exception, xfails.KnownNonConformance) as exc:
        return type(exc), str(exc), node.user_properties
    return None, "", node.user_properties


def noted(props: list) -> dict:
    return next(json.loads(v) for k, v in props if k == ledger.PROPERTY)


@pytest.mark.parametrize("area", ["numerics", "memory", "collectives"])
def test_the_raise_an_entry_names_is_expected_in_every_area_of_the_cell(thunder: Path, area: str) -> None:
    kind, message, props = verdict([entry()], raised(thunder), area)
    assert kind is xfails.KnownNonConformance, message
    assert "Thunder raised at thunder/executors/torch_compile.py:99 in to_torch_translator" in message
    assert noted(props) == {"covered": [["xfails.toml:40", 0]], "matched": [["xfails.toml:40", 0]]}


@pytest.mark.parametrize(
    ("kind", "message", "function"),
    [
        ("IndexError", "", "to_torch_translator"),  # another exception
        (RAISES["type"], "tensor-parallel collectives", "to_torch_translator"),  # another message
        (RAISES["type"], "", "elsewhere"),  # the same raise from another frame
    ],
    ids=["type", "message", "frame"],
)
def test_another_raise_still_fails_naming_what_the_entry_expects(
    thunder: Path, kind: str, message: str, function: str
) -> None:
    got, text, props = verdict([entry()], raised(thunder, kind, message, function))
    assert got is pytest.fail.Exception
    assert "xfails.toml:40: expects raises torch._dynamo.exc.Unsupported at " in text
    assert "[expected: xfails]" not in text
    assert noted(props) == {"covered": [["xfails.toml:40", 0]], "matched": []}


def test_an_entry_for_other_versions_or_cells_excuses_nothing(thunder: Path) -> None:
    assert verdict([entry(thunder=["==0.2.6"])], raised(thunder))[0] is pytest.fail.Exception
    assert verdict([entry(when={"executors": ["nvfuser"]})], raised(thunder))[0] is pytest.fail.Exception
    assert verdict([entry(area="memory")], raised(thunder), "numerics")[0] is pytest.fail.Exception
    assert verdict([entry(area="memory")], raised(thunder), "memory")[0] is xfails.KnownNonConformance


def test_a_cell_that_stops_raising_makes_the_entry_stale(thunder: Path) -> None:
    """Fixed in Thunder: the cell runs to completion and conforms; the item names the entry."""
    entries = [entry()]
    runner = stand_in_runner(entries, VERSION)
    node = SimpleNamespace(user_properties=[])
    with pytest.raises(pytest.fail.Exception, match=r"xfails.toml:40: stale"):
        Conformance(runner, node)._judge(CELL, "numerics", Grouped(), "repro: x", record=False)  # type: ignore[arg-type]
    # and over a whole run its template named a cell that reached a verdict and matched nothing
    [stale] = ledger.stale_templates(entries, VERSION, {("xfails.toml:40", 0): 1}, set())
    assert stale.text.startswith("raises torch._dynamo.exc.Unsupported at thunder/executors/torch_compile.py")


def test_a_kit_crash_or_a_lost_rank_is_never_an_expected_raise(thunder: Path) -> None:
    died = Outcome(
        [protocol.RankResult(0, protocol.DIED, error="killed"), protocol.RankResult(1, protocol.FAILED, error="peer")],
        1.0,
        0.0,
    )
    assert verdict([entry()], died)[0] is pytest.fail.Exception


def test_raises_entries_load_and_refuse_what_is_free(tmp_path: Path) -> None:
    body = (
        '[[xfail]]\nwhen = { executors = ["torchcompile"] }\nthunder = [">=0.2.6"]\n'
        'raises = { type = "IndexError", message = "list index out of range", at = "thunder/distributed/utils.py" }\n'
        'reason = "r"\nlink = "l"\n'
    )
    path = tmp_path / "x.toml"
    path.write_text(body)
    [loaded] = xfails.load(path)
    assert loaded.area is None and loaded.templates[0].raised(
        Raise("IndexError", "list index out of range", "thunder/distributed/utils.py", "get_bsym")
    )
    for bad, says in [
        (body.replace('message = "list index out of range"', 'message = ""'), "non-empty"),
        (body.replace('at = "thunder/distributed/utils.py"', 'at = "get_bsym"'), "names no file"),
        (body.replace("raises = {", 'failures = [{ code = "numerics.tensor" }]\nraises = {'), "not both"),
        (body.replace('reason = "r"\n', ""), re.escape("missing field(s) reason")),
    ]:
        path.write_text(bad)
        with pytest.raises(xfails.XfailsError, match=says):
            xfails.load(path)


def test_the_raise_names_the_type_by_its_module() -> None:
    Unsupported = type("Unsupported", (Exception,), {"__module__": "torch._dynamo.exc"})
    assert protocol.exception_of(Unsupported("no")) == {"type": "torch._dynamo.exc.Unsupported", "message": "no"}
    assert protocol.exception_of(IndexError("x")) == {"type": "IndexError", "message": "x"}


def test_a_raise_known_on_other_versions_still_fails_and_says_so(thunder: Path) -> None:
    kind, message, _ = verdict([entry(thunder=["==0.2.6"])], raised(thunder))
    assert kind is pytest.fail.Exception
    assert f"known on ==0.2.6 (xfails.toml:40), not declared for {VERSION}: torch.compile refuses" in message
