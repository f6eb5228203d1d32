"""The xfails file, without a world: templates match whole messages (numbers bound to what the
kit derived, or ranges; names listed; free ``{}`` and ``{name}`` refused),
entries hold for the Thunder versions they list, and an unusable file ends the run before any
world starts with one line and exit status 4. (tests/worlds/test_xfails.py runs entries on worlds.)"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
import torch

from conformance.checks import collectives
from conformance.frontend import xfails
from conformance.frontend.runner import DEFAULT_XFAILS
from conformance.matrix.cells import Cell
from tests.support.suite_runs import ROOT, run_refused

PIN = re.search(r"lightning-thunder==([^}\s]+)", (ROOT / "tox.ini").read_text()).group(1)

ENTRY = """[[xfail]]
area = "collectives"
when = { model = ["tied_lm"] }
failures = ["forward all_gathers: expected {expected}, got {unbucketed} (the count without bucketing)"]
thunder = ["==0.2.6", "==0.2.7.dev20260201"]
reason = "a reason"
link = "a link"
"""


def _entry(**fields) -> xfails.Expectation:
    base = {"area": "collectives", "when": {}, "failures": ["x"], "reason": "r", "link": "l", "thunder": [f"=={PIN}"]}
    return xfails.Expectation(**{**base, **fields})


DERIVED = {"expected": 3, "unbucketed": 6}


@pytest.mark.parametrize(
    ("template", "message", "explained"),
    [
        ("a: expected {expected}, got {unbucketed}", "a: expected 3, got 6", True),
        ("a: expected {expected}, got {unbucketed}", "a: expected 3, got 7", False),  # not the derived count
        ("a: expected {expected}, got {unbucketed}", "a: expected 4, got 6", False),
        ("a: expected {expected}, got {expected+3}", "a: expected 3, got 6", True),
        ("a: expected {expected}, got {expected-1}", "a: expected 3, got 2", True),
        ("a: expected {expected}, got {1..expected-1}", "a: expected 3, got 2", True),
        ("a: expected {expected}, got {1..expected-1}", "a: expected 3, got 3", False),
        ("a: expected {expected}, got {1..expected-1}", "a: expected 3, got 0", False),
        ("a: {0..0.05} away", "a: 0.05 away", True),
        ("a: {0..0.05} away", "a: 5e-2 away", True),
        ("a: {0..0.05} away", "a: 0.051 away", False),
        ("a: {0..0.05} away", "a: nan away", False),  # nan lies in no range
        ("a: {0..inf} away", "a: inf away", True),
        ("a: expected {expected}, got {unbucketed}", "a: expected 3, got 6 (the count under ZERO2)", False),  # full
        ("a: expected {expected}, got {unbucketed}", "b a: expected 3, got 6", False),
        ("a: expected {expected}, got 0", "a: expected 3, got 6", False),  # a literal number is pinned
        ("a: expected {expected}, got 0", "a: expected 3, got 0", True),
        ("a: {expected} bytes", "a: 1 3 bytes", False),  # one number per placeholder
        ("a: {expected} bytes", "a:  bytes", False),
        ("a: {expected} bytes", "a: many bytes", False),
        ("a: {expected} bytes", "a: 3.0 bytes", True),  # the number, however printed
        ("x [{name: lm_head.weight, b}]: y (z)", "x [lm_head.weight]: y (z)", True),  # regex characters are literal
        ("x [{name: lm_head.weight, b}]: y (z)", "x [b]: y (z)", True),
        ("x [{name: lm_head.weight, b}]: y (z)", "x [lm_headXweight]: y (z)", False),
        ("x [{name: lm_head.weight, b}]: y (z)", "x [c]: y (z)", False),  # a tensor it does not list
        ("x [lm_head.weight]: y (z)", "x l: y z", False),
    ],
)
def test_a_template_matches_one_whole_message(template: str, message: str, explained: bool) -> None:
    assert _entry(failures=[template]).explains(message, DERIVED) is explained


def test_a_derived_placeholder_needs_the_value_the_kit_derived() -> None:
    entry = _entry(failures=["a: expected {expected}, got {unbucketed}"])
    assert not entry.explains("a: expected 3, got 6")  # the check derived nothing for it
    assert not entry.explains("a: expected 3, got 6", {"expected": 3})
    assert entry.explains("a: expected 3, got 6", {"expected": 3.0, "unbucketed": 6})


@pytest.mark.parametrize(
    ("template", "why"),
    [
        ("a: expected {}, got {}", "a free {} excuses any number"),
        ("a: expected { }, got 0", "a free {} excuses any number"),
        ("gradients [{name}]: not close", "{name} excuses any tensor"),
        ("a {count}", "'count' is not a derived value"),
        ("a {expected*2}", "neither a number nor a derived name"),
        ("a {3}", "a pinned number is written as itself"),
        ("a {0.5..0.1}", "an empty range"),
        ("a [{name: a b}]", "must list tensor names"),
        ("", "empty"),
        ("  ", "empty"),
        ("a {", "a brace outside a placeholder"),
        ("a } b", "a brace outside a placeholder"),
        ("{{}}", "a brace outside a placeholder"),
    ],
)
def test_a_free_or_unknown_placeholder_is_a_bad_template(template: str, why: str) -> None:
    with pytest.raises(ValueError, match=re.escape(why)):
        xfails.template_pattern(template)


def test_a_template_shows_only_in_the_cells_its_when_names() -> None:
    entry = _entry(
        failures=[
            "forward all_gathers: expected {expected}, got {unbucketed}",
            {
                "template": "no_grad forward all_gathers: expected {expected}, got {unbucketed}",
                "when": {"scenario": ["infer"]},
            },
        ]
    )
    plain, infer = Cell("mlp", "real", "fsdp_jit"), Cell("mlp", "real", "fsdp_jit", scenario="infer")
    assert entry.templates_for(plain) == [0] and entry.templates_for(infer) == [0, 1]
    message = "no_grad forward all_gathers: expected 3, got 6"
    assert entry.explains(message, DERIVED, infer)
    assert not entry.explains(message, DERIVED, plain)


@pytest.mark.parametrize(
    ("specifiers", "version", "holds"),
    [
        (["==0.2.6", "==0.2.7.dev20260201"], "0.2.7.dev20260201", True),
        (["==0.2.6", "==0.2.7.dev20260201"], "0.2.6", True),
        (["==0.2.6", "==0.2.7.dev20260201"], "0.2.7", False),
        (["==0.2.6", "==0.2.7.dev20260201"], "0.2.7.dev20260301", False),
        ([">=0.2.6,<0.3"], "0.2.7.dev20260201", True),  # prereleases included
        ([">=0.3"], "0.2.7.dev20260201", False),
        (["==0.2.6"], None, False),  # unknown version: no entry holds
        (["==0.2.6"], "not a version", False),
    ],
)
def test_an_entry_holds_where_any_specifier_contains_the_version(specifiers, version, holds: bool) -> None:
    entry = _entry(thunder=specifiers)
    assert entry.holds_for(version) is holds
    assert entry.covers(Cell("mlp", "real", "fsdp_jit"), "collectives", version) is holds


def test_an_entry_covers_its_area_and_cells_only() -> None:
    entry = _entry(when={"model": ["tied_lm"], "world_size": [2]})
    assert entry.covers(Cell("tied_lm", "real", "fsdp_jit", world_size=2), "collectives", PIN)
    assert not entry.covers(Cell("tied_lm", "real", "fsdp_jit", world_size=2), "memory", PIN)
    assert not entry.covers(Cell("mlp", "real", "fsdp_jit", world_size=2), "collectives", PIN)
    assert not entry.covers(Cell("tied_lm", "real", "fsdp_jit", world_size=4), "collectives", PIN)


def test_an_entry_naming_a_backend_holds_on_that_backend_only() -> None:
    entry = _entry(when={"model": ["mlp"], "backend": ["gloo"]})
    cell = Cell("mlp", "real", "fsdp_jit")
    assert entry.covers(cell, "collectives", PIN, "gloo")
    assert not entry.covers(cell, "collectives", PIN, "nccl")
    assert not entry.covers(cell, "collectives", PIN)  # a backend unknown to the caller: not covered


def test_an_entry_can_leave_out_simulated_worlds() -> None:
    # a row simulated worlds never run (they check setup only) must not make the entry stale there
    entry = _entry(when={"model": ["pythia_160m"], "simulated": [False]})
    sim = Cell("pythia_160m", "meta_module_init", "jit_fsdp", world_size=1000, simulated=True)
    assert not entry.covers(sim, "collectives", PIN)
    assert entry.covers(Cell("pythia_160m", "meta_module_init", "jit_fsdp", world_size=2), "collectives", PIN)


def test_a_declaration_holds_where_its_entry_holds_whatever_the_area() -> None:
    # the collectives entry's declaration shapes the memory area's bounds: it is about the
    # Thunder in those cells, on those versions (and backends), not about one check
    entry = _entry(when={"bucketing": ["layer"], "backend": ["gloo"]}, declares=["unbucketed"])
    other = _entry(area="memory", when={"model": ["mlp"]}, thunder=["==0.2.1"], declares=["unbucketed"])
    layer, none = Cell("mlp", "real", "fsdp_jit", bucketing="layer"), Cell("mlp", "real", "fsdp_jit")
    assert xfails.declared([entry, other], layer, PIN, "gloo") == ["unbucketed"]
    assert xfails.declared([entry, other], none, PIN, "gloo") == []
    assert xfails.declared([entry, other], layer, PIN, "nccl") == []
    assert xfails.declared([entry, other], layer, "0.2.1", "nccl") == ["unbucketed"]
    assert xfails.declared([entry], layer, None, "gloo") == []  # an unknown version: no entry holds


def test_the_pins_declarations_are_the_entries_that_excuse_unapplied_bucketing() -> None:
    entries = xfails.load(DEFAULT_XFAILS)
    declaring = [e for e in entries if e.declares]
    assert declaring and all(e.declares == ["unbucketed"] for e in declaring)
    assert all("(the count without bucketing)" in str(e.failures[0]) for e in declaring)
    assert all(e.holds_for(PIN) for e in declaring)


def test_the_kits_file_loads_with_each_entrys_line_and_every_entry_names_versions() -> None:
    entries = xfails.load(DEFAULT_XFAILS)
    headers = [n for n, line in enumerate(DEFAULT_XFAILS.read_text().splitlines(), 1) if line == "[[xfail]]"]
    assert entries and [int(e.source.rsplit(":", 1)[1]) for e in entries] == headers
    assert all(e.source.split(":")[0].endswith("xfails.toml") for e in entries)
    # some hold on the pin, the others on releases measured beside it (README's table)
    assert any(e.holds_for(PIN) for e in entries)
    assert all(any(e.holds_for(v) for v in (PIN, "0.2.1", "0.2.3")) for e in entries)


def test_name_lists_and_non_finite_numbers() -> None:
    entry = _entry(failures=["gradients at step 0 (SGD) [{name: transformer.h.0.norm_1.weight}] as a whole: nan away"])
    assert entry.explains("gradients at step 0 (SGD) [transformer.h.0.norm_1.weight] as a whole: nan away")
    assert not entry.explains("gradients at step 0 (SGD) [lm_head.weight] as a whole: nan away")
    # a derived nan equals a printed nan: the kit derived it so
    nan = _entry(failures=["a: size {twin_size}"])
    assert nan.explains("a: size nan", {"twin_size": float("nan")})
    assert not nan.explains("a: size nan", {"twin_size": 1.0})


def test_a_template_names_its_own_line(tmp_path: Path) -> None:
    path = tmp_path / "x.toml"
    text = ENTRY.replace(
        "failures = [",
        'failures = [\n    "a: expected {expected}, got 0",\n    { template = "b {}", when = {} },\n   ',
    )
    path.write_text(text)
    with pytest.raises(xfails.XfailsError, match=re.escape(f"{path}:6: failures: template 'b {{}}'")):
        xfails.load(path)
    path.write_text(text.replace("b {}", "b {expected}"))
    (entry,) = xfails.load(path)
    assert [t.source for t in entry.templates] == [f"{path}:5", f"{path}:6", f"{path}:7"]


def test_lines_are_those_of_each_header(tmp_path: Path) -> None:
    path = tmp_path / "x.toml"
    path.write_text(f"# a comment\n\n{ENTRY}\n# another\n{ENTRY}")
    assert [e.source for e in xfails.load(path)] == [f"{path}:3", f"{path}:12"]


def _without(field: str) -> str:
    return "\n".join(line for line in ENTRY.splitlines() if not line.startswith(f"{field} ")) + "\n"


BAD = {
    "missing-file": (None, r"missing\.toml: cannot be read"),
    "syntax": (
        "\n" + ENTRY.replace('area = "collectives"', "area = collectives"),
        r"x\.toml: not valid TOML: .*line 3",
    ),
    "unknown-field": ("\n" + ENTRY + 'owner = "me"\n', r"x\.toml:2: unknown field\(s\) owner"),
    "missing-thunder": (_without("thunder"), r"x\.toml:1: missing field\(s\) thunder"),
    "missing-failures": (_without("failures"), r"x\.toml:1: missing field\(s\) failures"),
    "thunder-not-a-list": (ENTRY.replace('["==0.2.6", "==0.2.7.dev20260201"]', '"==0.2.6"'), r"x\.toml:1: thunder"),
    "bad-specifier": (ENTRY.replace('"==0.2.6"', '"0.2.6"'), r"x\.toml:1: thunder: '0\.2\.6' is not a PEP 440"),
    "empty-specifier": (ENTRY.replace('"==0.2.6"', '""'), r"x\.toml:1: thunder: an empty specifier"),
    "bad-template": (ENTRY.replace("expected {expected}", "expected {}"), r"x\.toml:4: failures: template .*a free"),
    "unknown-area": (ENTRY.replace('"collectives"', '"colectives"'), r"x\.toml:1: unknown area 'colectives'"),
    "unknown-axis": (ENTRY.replace("model =", "modle ="), r"x\.toml:1: when: unknown axis 'modle'"),
    "unknown-key": ('thunder = "0.2.6"\n' + ENTRY, r"x\.toml: unknown top-level key\(s\) thunder"),
    "unknown-declaration": (ENTRY + 'declares = ["bucketless"]\n', r"x\.toml:1: declares: unknown 'bucketless'"),
    "declares-not-a-list": (ENTRY + 'declares = "unbucketed"\n', r"x\.toml:1: declares must be a list"),
}


def _bad_file(tmp_path: Path, case: str) -> Path:
    text, _ = BAD[case]
    path = tmp_path / ("missing.toml" if text is None else "x.toml")
    if text is not None:
        path.write_text(text)
    return path


@pytest.mark.parametrize("case", BAD)
def test_an_unusable_file_is_one_line_naming_it(tmp_path: Path, case: str) -> None:
    path = _bad_file(tmp_path, case)
    with pytest.raises(xfails.XfailsError) as info:
        xfails.load(path)
    message = str(info.value)
    assert "\n" not in message and str(path) in message, message
    assert re.search(BAD[case][1], message), message


@pytest.mark.parametrize("case", ["missing-file", "syntax", "missing-thunder", "bad-template"])
def test_an_unusable_file_ends_the_run_before_any_world_with_status_4(tmp_path: Path, case: str) -> None:
    path = _bad_file(tmp_path, case)
    start = time.monotonic()
    line = run_refused(tmp_path, "--xfails", str(path))
    assert re.search(BAD[case][1], line), line
    assert time.monotonic() - start < 60


def test_counts_name_the_alternative_they_equal() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))  # 4 storages, 2 layers
    assert collectives.expected_counts(model, "zero3", "layer")["backward"]["all_gather"] == 2
    alternatives = collectives.alternative_counts(model, "zero3", "layer")
    assert [a for a, _ in alternatives] == ["the count without bucketing", "the count under ZERO2"]
    named = collectives.named_alternative
    assert named(alternatives, "forward", "all_gather", 4) == "the count without bucketing"
    assert named(alternatives, "backward", "reduce_scatter", 4) == "the count without bucketing"
    assert named(alternatives, "backward", "all_gather", 0) == "the count under ZERO2"
    assert named(alternatives, "forward", "all_gather", 5) is None
    # where both alternatives give the count found, the first of ALTERNATIVES is named
    same = collectives.expected_counts(model, "zero2", "none")
    assert named([("without", same), ("zero2", same)], "forward", "all_gather", 4) == "without"
    # an alternative equal to the cell itself is no alternative
    assert collectives.alternative_counts(model, "zero2", "none") == []
    assert [a for a, _ in collectives.alternative_counts(model, "zero3", "none")] == ["the count under ZERO2"]
