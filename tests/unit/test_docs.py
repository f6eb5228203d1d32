"""The docs cannot drift from the kit: README.md stays a front door (it starts with the two
commands that set up and run the suite and the kit's tests), every internal link in
README.md and docs/ resolves, every repository path and dotted kit name a doc puts in
backticks exists, every planted bug a page cites exists,
docs/findings.md is what tools/findings_doc.py makes of xfails.toml, docs/architecture.md's
layout has a line for every module and none for a module that is gone, and every guarantee
of a check area says whether it is independent of Thunder or held to Thunder's own traces or
state. The checkers (tests/support/doc_checks.py) are each shown to fail on planted input
below.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.support.doc_checks import (
    README_COMMANDS,
    ROOT,
    broken_links,
    cited_bugs,
    docs,
    findings_doc,
    findings_stale,
    layout_drift,
    slug,
    stale_names,
    unmarked_guarantees,
)

# the repository's docs


def test_readme_is_a_front_door() -> None:
    # no size cap (issue 55: caps shaped the layout, not the concern); the set-up comes first
    first = (ROOT / "README.md").read_text().split("```bash\n", 1)[1].split("```", 1)[0]
    assert [line.split("#")[0].strip() for line in first.strip().splitlines()] == README_COMMANDS, (
        "README.md must start with the two set-up commands: the conformance suite's and the kit's tests'"
    )


@pytest.mark.parametrize("doc", docs(), ids=lambda p: str(p.relative_to(ROOT)))
def test_internal_links_resolve(doc: Path) -> None:
    assert broken_links(doc) == []


@pytest.mark.parametrize("doc", docs(), ids=lambda p: str(p.relative_to(ROOT)))
def test_named_paths_and_modules_exist(doc: Path) -> None:
    assert stale_names(doc) == []


CITING = [ROOT / "README.md", *sorted((ROOT / "docs" / "checks").glob("*.md"))]


@pytest.mark.parametrize("doc", CITING, ids=lambda p: p.name)
def test_cited_planted_bugs_exist(doc: Path) -> None:
    from tests.planted.registry import BUGS

    cited = cited_bugs(doc)
    assert cited, f"{doc.name} cites no planted bug"
    assert sorted(cited - set(BUGS)) == []


def test_findings_page_is_generated_from_the_xfails_file() -> None:
    assert not findings_stale(), "docs/findings.md is stale: run python tools/findings_doc.py --write"


def test_the_layout_has_a_line_for_every_module() -> None:
    """A module added, renamed, moved or removed under conformance/, fixtures/, transforms/
    or tools/ is named here until docs/architecture.md's "Layout" says it."""
    assert layout_drift(ROOT / "docs" / "architecture.md") == []


AREA_PAGES = sorted((ROOT / "docs" / "checks").glob("*.md"))


@pytest.mark.parametrize("doc", AREA_PAGES, ids=lambda p: p.name)
def test_every_guarantee_says_what_it_is_held_to(doc: Path) -> None:
    assert unmarked_guarantees(doc) == []


def test_every_area_of_the_readme_says_what_it_is_held_to() -> None:
    # a README row sums up a whole area: it may carry both marks
    assert unmarked_guarantees(ROOT / "README.md", both=True) == []


# the checkers on planted input


@pytest.fixture
def planted(tmp_path: Path) -> Path:
    (tmp_path / "docs").mkdir()
    (tmp_path / "conformance" / "checks").mkdir(parents=True)
    (tmp_path / "conformance" / "__init__.py").write_text("")
    (tmp_path / "conformance" / "checks" / "__init__.py").write_text("")
    (tmp_path / "conformance" / "checks" / "memory.py").write_text(
        "LIMIT = 1\n\nclass Terms:\n    def resident(self): ...\n\ndef check(run): ...\n"
    )
    (tmp_path / "docs" / "a.md").write_text("# A page\n\n## Held after setup\n\ntext\n\n## Held after setup\n")
    return tmp_path


def test_a_broken_link_is_caught(planted: Path) -> None:
    doc = planted / "README.md"
    doc.write_text(
        "# Kit\n\n## The `ci` profile\n\n"
        "[ok](docs/a.md) [ok](docs/a.md#held-after-setup) [ok](docs/a.md#held-after-setup-1) "
        "[ok](#the-ci-profile) [web](https://example.com/x#y)\n"
        "[gone](docs/b.md) [no anchor](docs/a.md#held-after-the-step) [self](#nowhere)\n"
        "```\n[in a fence](docs/c.md)\n```\n`[in code](docs/d.md)`\n"
    )
    broken = broken_links(doc, planted)
    assert [b.split(": ", 1)[1] for b in broken] == [
        "docs/b.md (no such file)",
        "docs/a.md#held-after-the-step (no heading with that anchor)",
        "#nowhere (no heading with that anchor)",
    ]


def test_a_stale_name_is_caught(planted: Path) -> None:
    doc = planted / "docs" / "a.md"
    doc.write_text(
        "`conformance/checks/memory.py` `conformance/checks/` `conformance.checks.memory.Terms` "
        "`conformance.checks.memory.Terms.resident` `conformance.checks.memory:check` "
        "`conformance.checks.memory.LIMIT` `conformance/test_<area>.py` `reports/summary.md` "
        "`conformance/checks/memory/`\n"
        "`conformance/checks/numerics.py` `conformance.checks.memory.Bound` `conformance.checks.draws` "
        "`conformance/checks/numerics/` "
        "`conformance.checks.memory.Terms.held` `conformance.rank.probe:probe_compositions()`\n"
    )
    assert [s.split(": ", 1)[1] for s in stale_names(doc, planted)] == [
        "conformance/checks/numerics.py",
        "conformance.checks.memory.Bound",
        "conformance.checks.draws",
        "conformance/checks/numerics/",
        "conformance.checks.memory.Terms.held",
        "conformance.rank.probe:probe_compositions()",
    ]


def test_a_stale_findings_page_is_caught(planted: Path) -> None:
    xfails = (
        '[[xfail]]\narea = "numerics"\nwhen = {}\nthunder = ["==0.2.6"]\n'
        'failures = ["gradients at step {}: off"]\nreason = "Why. More."\nlink = "https://example.com"\n'
    )
    (planted / "xfails.toml").write_text(xfails)
    assert findings_stale(planted)  # no page yet
    page = findings_doc().render(xfails)
    (planted / "docs" / "findings.md").write_text(page)
    assert not findings_stale(planted)
    assert "lightning-thunder ==0.2.6" in page and "[1](#entry-1-numerics)" in page
    (planted / "xfails.toml").write_text(xfails.replace("0.2.6", "0.2.7"))
    assert findings_stale(planted)


def test_a_readme_without_its_commands_is_caught(planted: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (planted / "README.md").write_text("# kit\n\n```bash\npython3 -m tox -e conformance\n```\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", planted)
    with pytest.raises(AssertionError, match="two set-up commands"):
        test_readme_is_a_front_door()


def test_a_cited_bug_that_does_not_exist_is_caught(tmp_path: Path) -> None:
    page = tmp_path / "area.md"
    page.write_text("| planted bug | what |\n|---|---|\n| `gradient_off_later_step` | 1% |\n| `no_such_bug` | x |\n")
    row = "| numerics | holds | `gradients_nowhere`: one step off | [numerics](docs/checks/numerics.md) |\n"
    (tmp_path / "README.md").write_text(row)
    assert cited_bugs(page) == {"gradient_off_later_step", "no_such_bug"}
    assert cited_bugs(tmp_path / "README.md") == {"gradients_nowhere"}


def test_slugs_are_githubs() -> None:
    assert slug("Memory: the bounds") == "memory-the-bounds"
    assert slug("The `state_dict` area (exact)") == "the-state_dict-area-exact"
    assert slug("Known non-conformances (`xfails.toml`)") == "known-non-conformances-xfailstoml"
    assert slug("[Linked](x.md) heading") == "linked-heading"


LAYOUT_PAGE = """# Architecture

## Layout

Every module has its line.

### `conformance/world/`

**May import**: nothing else of the kit.

- `conformance/world/controller.py`: the controller side.
- `conformance/world/gone.py`: a module since removed.
- `conformance/world/controller.py`: the controller, again.
- `protocol.py`: a bare name.
- `conformance/world/`: a folder.
- `fixtures/models.py`: a module under another folder's heading.
- the protocol, in prose

### `conformance/matrix/`

**May import**: `fixtures/`, `conformance/world/`.

- `conformance/matrix/cells.py`: a cell.

### Beside the code

| path | what |
|---|---|
| `xfails.toml` | known non-conformances |

## Glossary

- `conformance/world/elsewhere.py`: outside the layout, not read.
"""


@pytest.fixture
def kit_tree(tmp_path: Path) -> Path:
    for module in (
        "conformance/world/controller.py",
        "conformance/world/protocol.py",
        "conformance/world/added.py",
        "conformance/world/__init__.py",
        "conformance/matrix/cells.py",
        "fixtures/models.py",
        "tools/gpu/probe.py",
    ):
        (tmp_path / module).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / module).write_text('"""A module."""\n')
    (tmp_path / "docs").mkdir()
    return tmp_path


def test_a_module_without_a_line_and_a_line_without_a_module_are_caught(kit_tree: Path) -> None:
    page = kit_tree / "docs" / "architecture.md"
    page.write_text(LAYOUT_PAGE)
    assert layout_drift(page, kit_tree) == [
        "docs/architecture.md:12: conformance/world/gone.py: no such module",
        "docs/architecture.md:13: conformance/world/controller.py: listed again (first on line 11)",
        "docs/architecture.md:14: protocol.py: not a module of conformance/, fixtures/, transforms/, tools/ "
        "from the root",
        "docs/architecture.md:15: conformance/world/: not a module of conformance/, fixtures/, transforms/, tools/ "
        "from the root",
        "docs/architecture.md:16: fixtures/models.py: not under its section's ['conformance/world/']",
        "docs/architecture.md:17: not a module line (- `path/from/the/root.py`: its purpose): - the protocol, in prose",
        "docs/architecture.md:7: **May import**: says []; tests/unit/test_layout.py lets fixtures (line 16) import "
        "['transforms']",
        "docs/architecture.md:19: **May import**: says ['fixtures', 'world']; tests/unit/test_layout.py lets matrix "
        "(line 23) import ['fixtures']",
        "conformance/world/added.py: no line in docs/architecture.md's Layout",
        "conformance/world/protocol.py: no line in docs/architecture.md's Layout",
        "tools/gpu/probe.py: no line in docs/architecture.md's Layout",
    ]


def test_a_complete_layout_passes(kit_tree: Path) -> None:
    page = kit_tree / "docs" / "architecture.md"
    page.write_text(
        "## Layout\n\n### `conformance/world/`\n\n**May import**: nothing else of the kit.\n\n"
        "- `conformance/world/controller.py`: the controller.\n"
        "- `conformance/world/protocol.py`: the protocol.\n"
        "- `conformance/world/added.py`: what was added.\n\n"
        "### `conformance/matrix/`\n\n**May import**: `fixtures/`.\n\n- `conformance/matrix/cells.py`: a cell.\n\n"
        "### `fixtures/`\n\n**May import**: `transforms/`.\n\n- `fixtures/models.py`: models.\n\n"
        "### `tools/`\n\n**May import**: anything.\n\n- `tools/gpu/probe.py`: a probe.\n"
    )
    assert layout_drift(page, kit_tree) == []


def test_an_unmarked_guarantee_is_caught(tmp_path: Path) -> None:
    page = tmp_path / "area.md"
    page.write_text(
        "# An area\n\n## What it guarantees\n\n"
        "*independent*: held to the model; *self-consistency*: held to Thunder's own traces.\n\n"
        "- *independent* — held to the model\n"
        "- held to nothing said\n"
        "  wrapped onto a second line\n"
        "- a group whose items are marked:\n"
        "  - *self-consistency* — against the trace\n"
        "  - *independent* — against eager\n"
        "- a group with one item unmarked:\n"
        "  - *independent* — against eager\n"
        "  - against nothing said\n"
        "- *self-consistency* — a marked group:\n"
        "  - its items need no mark\n"
        "- *independent* *self-consistency* — both\n\n"
        "| what | bound | held to |\n|---|---|---|\n| held | S | *independent* |\n| peak | plan | |\n\n"
        "## Where each expectation comes from\n\n- not a guarantee\n"
    )
    assert [f.split(": ", 1)[1].split(":")[0] for f in unmarked_guarantees(page, tmp_path)] == [
        "a list item without a mark (*independent* or *self-consistency*)",
        "a list item without a mark (*independent* or *self-consistency*)",
        "a list item with both marks",
        "a row without a mark (*independent* or *self-consistency*)",
    ]
    assert [f.split(":")[1] for f in unmarked_guarantees(page, tmp_path)] == ["8", "15", "18", "23"]
    assert unmarked_guarantees(page, tmp_path, both=True)[-1].split(":")[1] == "23"
    (tmp_path / "none.md").write_text("# An area\n\n## Blind spots\n\n- one\n")
    assert unmarked_guarantees(tmp_path / "none.md", tmp_path) == [
        "none.md: no section titled What it guarantees or The bounds or What a cell checks"
    ]
