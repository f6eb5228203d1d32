"""report.html and the dashboard, read as files (no browser: tests/unit/test_pages_in_browser.py
opens them): one self-contained page whose only script is inline, whose CSP forbids every
request, whose embedded data holds every item of the report with its repro, and that a
message cannot break out of; the writer writes it beside summary.md; the dashboard lays out
the comparison's regressions and fixes per run."""

from __future__ import annotations

import json
import re
from pathlib import Path

from conformance import dashboard
from conformance.reports import html, site
from conformance.reports.session import SessionInfo
from conformance.reports.writer import Reporter
from tests.support.pages import HOSTILE, Elements, clean, failing, runs_folder
from tests.support.suite_runs import ROOT

DATA = re.compile(r'<script type="application/json" id="data">(.*?)</script>', re.S)


def strict(text: str) -> object:
    """JSON as a browser or jq reads it: Python's NaN and Infinity refused."""

    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def embedded(text: str) -> dict:
    return strict(DATA.search(text).group(1))


def external_references(text: str) -> list[str]:
    """Every src, href, action or srcset that names anything but this page (a #fragment),
    another page beside it, or data: (the CSP forbids them, but a page should not even ask)."""
    page = Elements(text)
    found = []
    for attrs in (a for tags in page.found.values() for a in tags):
        for name in ("src", "href", "action", "srcset", "xlink:href"):
            value = attrs.get(name)
            if (
                value is not None
                and re.match(r"^\s*([a-z][a-z0-9+.-]*:|//)", value, re.I)
                and not value.startswith("data:")
            ):
                found.append(f"{name}={value}")
    return found


def test_the_page_needs_nothing_outside_itself() -> None:
    text = html.page(failing(clean()))
    head = Elements(text).found["meta"]
    csp = next(m["content"] for m in head if m.get("http-equiv") == "Content-Security-Policy")
    assert "default-src 'none'" in csp and "img-src data:" in csp and "script-src 'unsafe-inline'" in csp
    assert external_references(text) == []
    assert not any("src" in s for s in Elements(text).found["script"])  # inline only
    # URLs are in the report's text (xfails reasons link their evidence), nowhere in the page's own
    assert not re.search(r"https?://", DATA.sub("", text))


def test_the_static_check_sees_an_external_reference() -> None:
    assert external_references('<img src="https://example.org/a.png"><a href="//cdn.example/x">') == [
        "src=https://example.org/a.png",
        "href=//cdn.example/x",
    ]
    assert external_references('<a href="#cell=x"></a><a href="runs/pin.html"></a><img src="data:,">') == []


def test_every_item_is_embedded_with_its_outcome_and_repro() -> None:
    report = failing(clean())
    data = embedded(html.page(report))
    assert [(i["id"], i["outcome"]) for i in data["items"]] == [(i["id"], i["outcome"]) for i in report["cells"]]
    failed = [i for i in data["items"] if i["outcome"] == "failed"]
    assert len(failed) == 2 and all(i["repro"].startswith("python -m pytest 'conformance/") for i in failed)
    unsupported = next(i for i in data["items"] if i["outcome"] == "unsupported")
    assert unsupported["excuse"] and not unsupported["excuse"].startswith("(")  # the reason, not the skip tuple
    # the axes a report leaves out at their default are filled in, so a filter on them works
    assert {i["axes"]["executors"] for i in data["items"] if "axes" in i} >= {"torch_only"}


def test_a_message_cannot_end_the_data_script() -> None:
    text = html.page(failing(clean()))
    assert text.count("</script>") == 2  # the data's and the renderer's
    assert any(HOSTILE in (i.get("message") or "") for i in embedded(text)["items"])  # carried intact, as data


def test_the_writer_writes_the_page_with_the_runs_repro(tmp_path: Path) -> None:
    session = SessionInfo("gloo", 2, "ci", False, ROOT / "xfails.toml", True)
    reporter = Reporter(tmp_path, session, whole_run=False)  # no coverage contract to derive: seconds
    for rec in failing(clean())["cells"]:
        reporter.records[rec["id"]] = rec
    reporter.pytest_sessionfinish(None, 1)  # type: ignore[arg-type]
    data = embedded((tmp_path / "report.html").read_text())
    passed = next(i for i in data["items"] if i["outcome"] == "passed" and "cell" in i)
    assert passed["repro"] == session.repro(passed["id"])
    # a non-finite metric is written as its string, in the report and the page alike
    report = strict((tmp_path / "report.json").read_text())
    numerics = next(i for i in report["cells"] if i["outcome"] == "failed" and i["area"] == "numerics")
    assert numerics["metrics"]["state dict max_abs_err"] == "inf" and numerics["metrics"]["state dict mean"] == "nan"
    assert next(i for i in data["items"] if i["id"] == numerics["id"])["metrics"]["state dict max_abs_err"] == "inf"


def test_the_dashboard_shows_the_planted_runs_regressions_alone(tmp_path: Path, capsys) -> None:
    runs = runs_folder(tmp_path / "runs")
    assert dashboard.main([str(runs), "--out", str(tmp_path / "site")]) == 0
    index = tmp_path / "site" / "index.html"
    assert capsys.readouterr().out.strip() == str(index)
    text = index.read_text()
    sections = {s["data-run"]: s for s in Elements(text).of("section", "data-regressions")}
    assert {k: (s["data-regressions"], s["data-fixes"]) for k, s in sections.items()} == {
        "0.2.6": ("0", "0"),
        "planted": ("3", "0"),  # two items newly failing, one backward peak grown; nothing vanished
    }
    assert text.count("newly failing: ") == 2 and "(memory) backward peak" in text
    assert external_references(text) == []
    assert text.count("<svg") == 1 + len(site.PANELS) and "<script" not in text
    assert {p.name for p in (tmp_path / "site" / "runs").iterdir()} == {"pin.html", "0.2.6.html", "planted.html"}
    table = {r["data-run"] for r in Elements(text).of("tr", "data-run")}
    assert table == {"pin", "0.2.6", "planted"}


def test_the_dashboard_refuses_a_folder_without_reports(tmp_path: Path, capsys) -> None:
    assert dashboard.main([str(tmp_path)]) == dashboard.USAGE_ERROR
    assert capsys.readouterr().err.startswith("ERROR: ")


def test_the_dashboard_shows_each_nights_mutation_score_where_it_has_one(tmp_path: Path) -> None:
    runs = runs_folder(tmp_path / "runs")
    counts = {"killed: silently wrong": 17, "killed: Thunder raised": 30, "survived": 3, "not covered": 9}
    score = {"counts": counts, "run": 50, "kept_running": 20, "silently_wrong": 17, "silent_score": 17 / 20}
    (runs / "pin" / "mutants.json").write_text(json.dumps({"score": score}))
    site.build(runs, tmp_path / "site")
    text = (tmp_path / "site" / "index.html").read_text()
    assert "mutants: silent score" in text
    assert "<td>85% (17 of 20)</td>" in text and text.count("<td>–</td>") == 2  # the nights without one
