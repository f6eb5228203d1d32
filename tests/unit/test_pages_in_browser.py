"""report.html and the dashboard opened in headless Chromium (tests/support/browser.py): the
grid holds every item of report.json with its outcome, a filter in the URL hash shows exactly
its cells, a failing cell's view shows its findings, its repro line and its rank's log tail,
no script fails, and no request leaves the page (the browser's own network log, and a planted
request shows the log would see one). Screenshots go under the test's tmp folder; their paths
are printed. Without chromium these tests skip saying why, and fail where CI is set.

With CONFORMANCE_CI_REPORT (.ci/run's ci run) the real run's report.html is checked too."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

from conformance.reports import html
from conformance.reports.site import build
from tests.support.browser import Browser, Visit, chromium
from tests.support.pages import DDP, FINDING, JIT_DDP, LOG_TAIL, Elements, clean, failing, runs_folder
from tests.support.suite_runs import CI_REPORT_ENV

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    b = Browser(chromium(), tmp_path_factory.mktemp("chromium-profile"))
    yield b
    b.close()


@pytest.fixture(scope="module")
def report_page(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    report = failing(clean())
    path = tmp_path_factory.mktemp("page") / "report.html"
    path.write_text(html.page(report))
    return report, path


def grid(visit: Visit) -> dict[str, str]:
    """item id -> outcome, of the grid's cells as the browser rendered them."""
    return {td["data-item"]: td["data-outcome"] for td in Elements(visit.dom).of("td", "data-item")}


def only_the_page(visit: Visit, page: Path) -> None:
    """The page asked for itself alone and ran without an error."""
    assert [u.partition("#")[0] for u in visit.requests] == [page.as_uri()], visit.requests
    assert visit.errors == []


def shot(tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"{name}.png"
    print(f"screenshot: {path}")
    return path


def test_the_grid_lists_every_item_with_its_outcome(browser: Browser, report_page, tmp_path: Path) -> None:
    report, path = report_page
    visit = browser.visit(path.as_uri(), shot(tmp_path, "grid"))
    only_the_page(visit, path)
    assert grid(visit) == {i["id"]: i["outcome"] for i in report["cells"]}
    # the header tells a fork's new failures from those known on other Thunder versions
    assert "2 failed (1 new, 1 known on other Thunder versions)" in "\n".join(Elements(visit.dom).text)
    assert visit.screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_filter_in_the_hash_shows_exactly_its_cells(browser: Browser, report_page, tmp_path: Path) -> None:
    report, path = report_page
    visit = browser.visit(path.as_uri() + "#composition=ddp_jit", shot(tmp_path, "ddp_jit"))
    only_the_page(visit, path)
    ddp_jit = {i["id"]: i["outcome"] for i in report["cells"] if i.get("axes", {}).get("composition") == "ddp_jit"}
    assert grid(visit) == ddp_jit and len({i.partition("[")[2] for i in ddp_jit}) == 2
    assert not any(JIT_DDP in item for item in grid(visit))  # the other DDP composition is another value
    failed = browser.visit(path.as_uri() + "#composition=ddp_jit,jit_ddp&outcome=failed")
    assert {i.partition("[")[2].rstrip("]") for i in grid(failed)} == {DDP}


def test_a_failing_cells_view_shows_findings_repro_and_log_tail(browser: Browser, report_page, tmp_path: Path) -> None:
    report, path = report_page
    visit = browser.visit(f"{path.as_uri()}#cell={quote(DDP, safe='')}", shot(tmp_path, "failing-cell"))
    only_the_page(visit, path)
    page = Elements(visit.dom)
    text = "\n".join(page.text)
    numerics = next(i for i in report["cells"] if i.get("cell") == DDP and i["area"] == "numerics")
    assert FINDING in text and LOG_TAIL in text
    assert f"python -m pytest '{numerics['id']}' --nproc 2 --backend gloo" in text
    sections = {s["data-item"]: s["data-outcome"] for s in page.of("section", "data-item")}
    assert sections == {i["id"]: i["outcome"] for i in report["cells"] if i.get("cell") == DDP}
    assert {tr["data-phase"] for tr in page.of("tr", "data-phase")} == {"setup", "forward", "backward", "step"}
    assert "injected" not in visit.dom.split("<title>")[1].split("</title>")[0]  # the hostile message stayed text


def test_the_network_log_would_see_a_request(browser: Browser, tmp_path: Path) -> None:
    """The checks above can fail: a page without the CSP that loads an image asks for it (to a
    closed port of this machine, which Chrome does not refuse as unsafe), and with the kit's
    CSP the same image is refused before it leaves: blocked for "csp", and an error."""
    url = "http://127.0.0.1:65535/x.png"
    bare = tmp_path / "bare.html"
    bare.write_text(f'<!DOCTYPE html><img src="{url}">')
    visit = browser.visit(bare.as_uri())
    assert url in visit.requests and url not in visit.blocked
    guarded = tmp_path / "guarded.html"
    guarded.write_text(html.document("t", f'<img src="{url}">'))
    visit = browser.visit(guarded.as_uri())
    assert visit.blocked == {url: "csp"}
    assert any("Content Security Policy" in e for e in visit.errors), visit.errors


def test_the_dashboard_in_the_browser(browser: Browser, tmp_path: Path) -> None:
    index = build(runs_folder(tmp_path / "runs"), tmp_path / "site")
    visit = browser.visit(index.as_uri(), shot(tmp_path, "dashboard"))
    only_the_page(visit, index)
    sections = {s["data-run"]: int(s["data-regressions"]) for s in Elements(visit.dom).of("section", "data-run")}
    assert sections == {"0.2.6": 0, "planted": 3}
    run = tmp_path / "site" / "runs" / "planted.html"
    linked = browser.visit(f"{run.as_uri()}#cell={quote(DDP, safe='')}")
    only_the_page(linked, run)
    assert FINDING in linked.dom


def test_the_real_ci_runs_page(browser: Browser, tmp_path: Path) -> None:
    folder = os.environ.get(CI_REPORT_ENV)
    if not folder:
        pytest.skip(f"{CI_REPORT_ENV} is unset: no ci run of this commit to open (.ci/run sets it)")
    page = Path(folder) / "report.html"
    report = json.loads((Path(folder) / "report.json").read_text())
    visit = browser.visit(page.as_uri(), shot(tmp_path, "ci-run"))
    only_the_page(visit, page)
    assert grid(visit) == {i["id"]: i["outcome"] for i in report["cells"]}
    print(f"{page}: {page.stat().st_size} bytes, {len(report['cells'])} items")
