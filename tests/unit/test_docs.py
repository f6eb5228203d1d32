"""The docs cannot drift from the kit: README.md stays a front door (at most README_LIMIT
bytes), every internal link in README.md and docs/ resolves, every repository path and dotted
kit name a doc puts in backticks exists, every planted bug a page cites exists, and
docs/findings.md is what tools/findings_doc.py makes of xfails.toml. The checkers
(tests/support/doc_checks.py) are each shown to fail on planted input below.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.support.doc_checks import (
    README_LIMIT,
    ROOT,
    broken_links,
    cited_bugs,
    docs,
    findings_doc,
    findings_stale,
    slug,
    stale_names,
)

# the repository's docs


def test_readme_is_a_front_door() -> None:
    size = len((ROOT / "README.md").read_bytes())
    assert size <= README_LIMIT, f"README.md is {size} bytes, more than {README_LIMIT}: move reference into docs/"


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


def test_an_oversized_readme_is_caught(planted: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (planted / "README.md").write_text("x" * (README_LIMIT + 1))
    monkeypatch.setattr(sys.modules[__name__], "ROOT", planted)
    with pytest.raises(AssertionError, match="more than 15000"):
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
