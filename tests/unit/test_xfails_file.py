"""The xfails file, without a world: a template matches a failure's code and every one of its
fields, never its message (numbers bound to what the kit derived, or ranges; names listed;
free ``{}`` and unknown placeholders refused, and so is a template written as a message),
entries hold for the Thunder versions they list, and an unusable file ends the run before any
world starts with one line and exit status 4. (tests/worlds/test_xfails.py runs entries on worlds.)"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from conformance.checks import collectives
from conformance.checks.findings import Failure
from conformance.frontend import xfails
from conformance.frontend.runner import DEFAULT_XFAILS
from conformance.matrix.cells import Cell
from tests.support.suite_runs import ROOT, run_refused

PIN = re.search(r"lightning-thunder==([^}\s]+)", (ROOT / "tox.ini").read_text()).group(1)

COUNT = (
    '{ code = "collectives.count", phase = "forward", kind = "all_gather", got = "{unbucketed}", '
    'alternative = "unbucketed" }'
)
ENTRY = f"""[[xfail]]
area = "collectives"
when = {{ model = ["tied_lm"] }}
failures = [{COUNT}]
thunder = ["==0.2.6", "==0.2.7.dev20260201"]
reason = "a reason"
link = "a link"
"""


def _entry(**fields) -> xfails.Expectation:
    base = {
        "area": "collectives",
        "when": {},
        "failures": [{"code": "collectives.count"}],
        "reason": "r",
        "link": "l",
        "thunder": [f"=={PIN}"],
    }
    return xfails.Expectation(**{**base, **fields})


DERIVED = {"expected": 3, "unbucketed": 6}


def _failure(code: str = "collectives.count", derived: dict[str, float] | None = None, **fields: Any) -> Failure:
    """A failure as a check records it; its message is no part of what an entry matches."""
    return Failure(code, "a message nothing matches", fields, DERIVED if derived is None else derived)


def _explains(template: dict[str, Any], failure: Failure) -> bool:
    return _entry(failures=[{"code": "collectives.count", **template}]).explains(failure)


@pytest.mark.parametrize(
    ("template", "fields", "explained"),
    [
        ({"got": "{unbucketed}"}, {"got": 6}, True),
        ({"got": "{unbucketed}"}, {"got": 7}, False),  # not the derived count
        ({"got": "{expected+3}"}, {"got": 6}, True),
        ({"got": "{expected-1}"}, {"got": 2}, True),
        ({"got": "{1..expected-1}"}, {"got": 2}, True),
        ({"got": "{1..expected-1}"}, {"got": 3}, False),
        ({"got": "{1..expected-1}"}, {"got": 0}, False),
        ({"got": "{0..0.05}"}, {"got": 0.05}, True),
        ({"got": "{0..0.05}"}, {"got": 5e-2}, True),
        ({"got": "{0..0.05}"}, {"got": 0.051}, False),
        ({"got": "{0..0.05}"}, {"got": float("nan")}, False),  # nan lies in no range
        ({"got": "{0..inf}"}, {"got": float("inf")}, True),
        ({"got": "{0..0.05}"}, {"got": "0.05"}, False),  # a number's placeholder holds numbers only
        ({"got": "{expected}"}, {"got": 3.0}, True),  # the number, int or float
        ({"got": "{expected}"}, {"got": True}, False),  # a boolean is no count
        ({"got": "{expected}"}, {"got": [1, 3]}, False),  # one number per placeholder
        ({"got": "{expected}"}, {"got": "many"}, False),
        # every field, no more and no fewer: the same count equal to another alternative is another failure
        ({"got": "{unbucketed}"}, {"got": 6, "alternative": "zero2"}, False),
        ({"got": "{unbucketed}", "alternative": "unbucketed"}, {"got": 6}, False),
        ({"got": "{unbucketed}", "alternative": "unbucketed"}, {"got": 6, "alternative": "unbucketed"}, True),
        ({"got": 0}, {"got": 6}, False),  # a literal number is pinned
        ({"got": 0}, {"got": 0}, True),
        ({"got": 3}, {"got": 3.0}, True),
        ({"got": "6"}, {"got": 6}, False),  # a literal string is no number
        ({"got": float("nan")}, {"got": float("nan")}, True),  # a nan as written equals a nan
        ({"name": {"one_of": ["lm_head.weight", "b"]}}, {"name": "lm_head.weight"}, True),
        ({"name": {"one_of": ["lm_head.weight", "b"]}}, {"name": "b"}, True),
        ({"name": {"one_of": ["lm_head.weight", "b"]}}, {"name": "lm_headXweight"}, False),  # no pattern: names
        ({"name": {"one_of": ["lm_head.weight", "b"]}}, {"name": "c"}, False),  # a tensor it does not list
        ({"name": "lm_head.weight"}, {"name": "l"}, False),
        ({"names": ["cos", "sin"]}, {"names": ["cos", "sin"]}, True),
        ({"names": ["cos", "sin"]}, {"names": ["sin", "cos"]}, False),  # a list in its order
        ({"names": ["cos", "sin"]}, {"names": ["cos"]}, False),
        ({"raised": "a {"}, {"raised": "a {"}, True),  # braces around no placeholder are text
    ],
)
def test_a_template_matches_a_failures_code_and_every_field(
    template: dict[str, Any], fields: dict[str, Any], explained: bool
) -> None:
    assert _explains(template, _failure(**fields)) is explained


def test_a_template_matches_its_code_only() -> None:
    failure = _failure(phase="forward", kind="all_gather", got=6, alternative="unbucketed")
    template = {"phase": "forward", "kind": "all_gather", "got": "{unbucketed}", "alternative": "unbucketed"}
    assert _explains(template, failure)
    assert not _explains(template, _failure("collectives.bytes", **failure.fields))
    assert not _entry(failures=[{"code": "collectives", **template}]).explains(failure)


def test_a_message_is_never_matched() -> None:
    # the same code and fields under any message are the same failure; another field is not
    template = {"phase": "forward", "kind": "all_gather", "got": "{unbucketed}", "alternative": "unbucketed"}
    fields = {"phase": "forward", "kind": "all_gather", "got": 6, "alternative": "unbucketed"}
    printed = Failure(
        "collectives.count", "forward all_gathers: expected 3, got 6 (the count without bucketing)", fields, DERIVED
    )
    reworded = Failure("collectives.count", "six all-gathers, not three", fields, DERIVED)
    assert _explains(template, printed) and _explains(template, reworded)
    assert not _explains(template, Failure("collectives.count", printed.message, {**fields, "got": 7}, DERIVED))


def test_a_derived_placeholder_needs_the_value_the_kit_derived() -> None:
    entry = _entry(failures=[{"code": "collectives.bytes", "got": "{expected+1..expected_times_world_size}"}])
    assert not entry.explains(_failure("collectives.bytes", {}, got=13))  # the check derived nothing for it
    assert not entry.explains(_failure("collectives.bytes", {"expected": 12}, got=13))
    assert entry.explains(_failure("collectives.bytes", {"expected": 12.0, "expected_times_world_size": 24}, got=13))
    assert not entry.explains(
        _failure("collectives.bytes", {"expected": 12.0, "expected_times_world_size": 24}, got=25)
    )


@pytest.mark.parametrize(
    ("failure", "why"),
    [
        ({"code": "c.x", "got": "{}"}, "a free {} excuses any number"),
        ({"code": "c.x", "got": "{ }"}, "a free {} excuses any number"),
        ({"code": "c.x", "name": "{name}"}, "'name' is not a derived value"),  # no free tensor name either
        ({"code": "c.x", "got": "{count}"}, "'count' is not a derived value"),
        ({"code": "c.x", "got": "{expected*2}"}, "neither a number nor a derived name"),
        ({"code": "c.x", "got": "{3}"}, "a pinned number is written as itself"),
        ({"code": "c.x", "got": "{0.5..0.1}"}, "an empty range"),
        ({"code": "c.x", "name": {"one_of": []}}, "a table value must be { one_of = [values] }"),
        ({"code": "c.x", "name": {"one_of": "a.weight"}}, "a table value must be { one_of = [values] }"),
        ({"code": "c.x", "name": {"any": ["a.weight"]}}, "a table value must be { one_of = [values] }"),
        ({"code": "c.x", "names": [{"a": 1}]}, "is no value a failure holds"),
        ({"code": "c.x", "when": ["infer"]}, "a failure's when must be a table"),
        ({"code": "c.x", "when": {"scenaro": ["infer"]}}, "when: unknown axis 'scenaro'"),
        ({"code": "c.x", "when": {"scenario": []}}, "when: scenario must be a non-empty list"),
        # a message, as templates were written before codes: no failure is matched by its text
        ("forward all_gathers: expected {expected}, got {unbucketed}", "each failure is a table"),
        ({"phase": "forward"}, "each failure is a table"),  # no code
        ({"code": ""}, "each failure is a table"),
        ({"code": "  "}, "each failure is a table"),
        ({"code": 3}, "each failure is a table"),
    ],
)
def test_a_free_or_unknown_placeholder_is_a_bad_template(failure: Any, why: str) -> None:
    with pytest.raises(ValueError, match=re.escape(why)):
        _entry(failures=[failure])


def test_a_template_shows_only_in_the_cells_its_when_names() -> None:
    count = {"code": "collectives.count", "kind": "all_gather", "got": "{unbucketed}", "alternative": "unbucketed"}
    entry = _entry(
        failures=[
            {**count, "phase": "forward"},
            {**count, "phase": "no_grad forward", "when": {"scenario": ["infer"]}},
        ]
    )
    plain, infer = Cell("mlp", "real", "fsdp_jit"), Cell("mlp", "real", "fsdp_jit", scenario="infer")
    assert entry.templates_for(plain) == [0] and entry.templates_for(infer) == [0, 1]
    failure = _failure(phase="no_grad forward", kind="all_gather", got=6, alternative="unbucketed")
    assert entry.explains(failure, infer)
    assert not entry.explains(failure, plain)
    assert entry.matching(failure, infer) == [1]
    # when names the cells, never a field: the failure's fields are the template's others
    assert set(entry.templates[1].fields) == {"phase", "kind", "got", "alternative"}


def test_a_template_reads_as_its_code_and_fields() -> None:
    entry = _entry(
        failures=[{"code": "numerics.tensor", "name": {"one_of": ["a", "b"]}, "problem": "values", "step": 0}]
    )
    assert entry.templates[0].text == "numerics.tensor {name=one of 2, problem='values', step=0}"


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
    assert all(
        (e.failures[0]["code"], e.failures[0]["alternative"]) == ("collectives.count", "unbucketed") for e in declaring
    )
    assert all(e.holds_for(PIN) for e in declaring)


def test_the_kits_file_loads_with_each_entrys_line_and_every_entry_names_versions() -> None:
    entries = xfails.load(DEFAULT_XFAILS)
    lines = DEFAULT_XFAILS.read_text().splitlines()
    headers = [n for n, line in enumerate(lines, 1) if line == "[[xfail]]"]
    assert entries and [int(e.source.rsplit(":", 1)[1]) for e in entries] == headers
    assert all(e.source.split(":")[0].endswith("xfails.toml") for e in entries)
    # each failure template names the line that writes it: its code's; a raise, its entry's
    for entry in entries:
        for template in entry.templates:
            line = lines[int(template.source.rsplit(":", 1)[1]) - 1]
            if entry.raises is not None:
                assert template.source == entry.source, template
            else:
                assert f'code = "{template.code}"' in line, template
    # some hold on the pin, the others on releases measured beside it (README's table)
    assert any(e.holds_for(PIN) for e in entries)
    assert all(any(e.holds_for(v) for v in (PIN, "0.2.1", "0.2.3")) for e in entries)


def test_name_lists_and_non_finite_numbers() -> None:
    where = {"quantity": "gradients", "step": 0, "optimizer": "SGD"}
    entry = _entry(
        area="numerics",
        failures=[
            {
                "code": "numerics.distance",
                **where,
                "name": {"one_of": ["transformer.h.0.norm_1.weight"]},
                "distance": float("nan"),
            }
        ],
    )
    nan = float("nan")
    assert entry.explains(_failure("numerics.distance", **where, name="transformer.h.0.norm_1.weight", distance=nan))
    assert not entry.explains(_failure("numerics.distance", **where, name="lm_head.weight", distance=nan))
    assert not entry.explains(
        _failure("numerics.distance", **where, name="transformer.h.0.norm_1.weight", distance=1.0)
    )
    # a derived nan equals a nan found: the kit derived it so
    size = _entry(area="numerics", failures=[{"code": "numerics.update", "distance": "{twin_size}"}])
    assert size.explains(_failure("numerics.update", {"twin_size": nan}, distance=nan))
    assert not size.explains(_failure("numerics.update", {"twin_size": 1.0}, distance=nan))


def test_a_template_names_its_own_line(tmp_path: Path) -> None:
    path = tmp_path / "x.toml"
    bad = '{ code = "collectives.count", phase = "backward", got = "{}" }'
    text = ENTRY.replace("failures = [", f"failures = [\n    {COUNT.replace('{unbucketed}', '0')},\n    {bad},\n   ")
    path.write_text(text)
    with pytest.raises(xfails.XfailsError, match=re.escape(f"{path}:6: failures: template collectives.count at")):
        xfails.load(path)
    path.write_text(text.replace('got = "{}"', 'got = "{expected}"'))
    (entry,) = xfails.load(path)
    assert [t.source for t in entry.templates] == [f"{path}:5", f"{path}:6", f"{path}:7"]
    # templates sharing a line (the same code twice, or another after it) name that line; a
    # code may be written as a literal string
    shared = f"{COUNT}, {COUNT.replace('{unbucketed}', '0')}, {{ code = 'collectives.bytes', got = 0 }}"
    path.write_text(ENTRY.replace(COUNT, f"\n    {shared},\n    {COUNT}\n"))
    (entry,) = xfails.load(path)
    assert [t.source for t in entry.templates] == [f"{path}:5"] * 3 + [f"{path}:6"]


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
    "bad-template": (ENTRY.replace('got = "{unbucketed}"', 'got = "{}"'), r"x\.toml:4: failures: template .*a free"),
    # a file written before codes: a message is no failure's code
    "message-template": (
        ENTRY.replace(
            COUNT, '"forward all_gathers: expected {expected}, got {unbucketed} (the count without bucketing)"'
        ),
        r"x\.toml:1: failures: each failure is a table",
    ),
    "failures-empty": (ENTRY.replace(COUNT, ""), r"x\.toml:1: failures must be a non-empty list"),
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


@pytest.mark.parametrize("case", ["missing-file", "syntax", "missing-thunder", "bad-template", "message-template"])
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
    unbucketed, zero2 = ("unbucketed", "the count without bucketing"), ("zero2", "the count under ZERO2")
    assert [a for a, _ in alternatives] == [unbucketed, zero2]
    named = collectives.named_alternative
    assert named(alternatives, "forward", "all_gather", 4) == unbucketed
    assert named(alternatives, "backward", "reduce_scatter", 4) == unbucketed
    assert named(alternatives, "backward", "all_gather", 0) == zero2
    assert named(alternatives, "forward", "all_gather", 5) is None
    # where both alternatives give the count found, the first of ALTERNATIVES is named
    same = collectives.expected_counts(model, "zero2", "none")
    assert named([(("a", "without"), same), (("b", "zero2"), same)], "forward", "all_gather", 4) == ("a", "without")
    # an alternative equal to the cell itself is no alternative
    assert collectives.alternative_counts(model, "zero2", "none") == []
    assert [a for a, _ in collectives.alternative_counts(model, "zero3", "none")] == [zero2]
    # the key is the failure's alternative field, an entry's to match
    assert [key for key, _, _ in collectives.ALTERNATIVES] == ["unbucketed", "zero2"]


@pytest.mark.parametrize("newer", ["0.2.8.dev0", "0.2.8", "0.3.0.dev20270101", "1.0.0rc1"])
def test_what_the_pin_does_not_conform_on_a_newer_thunder_inherits(newer: str) -> None:
    """A nightly of Thunder's main, a fork's build, the next release: every known
    non-conformance of the pin holds on it until Thunder fixes it (issue 58); an entry that
    then meets a conforming item is stale. Entries fixed before the pin stay closed."""
    entries = xfails.load(ROOT / "xfails.toml")
    assert [e.source for e in entries if e.holds_for(PIN)] == [e.source for e in entries if e.holds_for(newer)]
    assert all(not e.holds_for(newer) for e in entries if not e.holds_for(PIN))
    assert not any(e.holds_for(None) for e in entries)  # an unknown version: none holds
