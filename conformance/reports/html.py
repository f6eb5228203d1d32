"""report.html: one self-contained page per run, written beside summary.md.

The page is the report's data as JSON in a ``<script type="application/json">`` and a plain
inline script that renders it (``page_assets.py``): the matrix as a grid (a row per cell, a column per area,
coloured by outcome), filters over every axis value and outcome, settable from the URL hash
(``#composition=ddp_jit&outcome=failed``), and a view per cell (``#cell=ID``). Nothing is
fetched: a Content-Security-Policy forbids every request but inline script, inline style and
data: images, so the page works from disk and as a CI artifact and cannot leak the report.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

from conformance.matrix.cells import AXES, axis_value
from conformance.reports import json_text
from conformance.reports.outcomes import MARKS, excuse, triage_line
from conformance.reports.page_assets import REPORT_SCRIPT, STYLE

# nothing but the page itself: no fetch, no frame, no font, no form target, no <base>
CSP = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:; "
    "base-uri 'none'; form-action 'none'"
)
REPRO_PREFIX = "repro: "
# what an item keeps in the page: the cell view shows all of it; the rest of a report item
# (its templates' bookkeeping, when it ended) says nothing a reader of the page looks for
KEPT = ("id", "cell", "area", "outcome", "message", "xfail_reason", "ranks", "metrics", "known_elsewhere", "duration")


def page(report: dict[str, Any], repro: Callable[[str], str] | None = None) -> str:
    """The whole page for ``report`` (report.json's schema). An item's repro is the last line of
    its message, which failed and xfailed items carry, else ``repro`` of its id (the run's own
    ``SessionInfo.repro``); a report read back from disk has none for items that passed."""
    data = page_data(report, repro)
    env = report.get("environment") or {}
    title = f"Thunder {env.get('thunder', '?')} conformance: {report.get('profile', '?')}"
    return document(title, body=_body(data), script=REPORT_SCRIPT)


def page_data(report: dict[str, Any], repro: Callable[[str], str] | None = None) -> dict[str, Any]:
    """What the page's script reads: the run's header values and every item, each with its
    axes filled in (an axis a report leaves out is at its default), its excuse and repro."""
    items = []
    areas: list[str] = []
    for item in report["cells"]:
        kept = {k: item[k] for k in KEPT if k in item}
        if "axes" in item:
            kept["axes"] = {a: str(axis_value(item["axes"], a)) for a in AXES}
        if item.get("area") and item["area"] not in areas:
            areas.append(item["area"])
        if item["outcome"] in ("xfailed", "unsupported"):
            kept["excuse"] = excuse(item)
        # the line the verdict printed where there is one (a generated cell's is a replay)
        kept["repro"] = repro_line(item) or (repro(item["id"]) if repro is not None else None)
        items.append(kept)
    env = report.get("environment") or {}
    return {
        "thunder": env.get("thunder"),
        "torch": env.get("torch"),
        "backend": env.get("backend"),
        "world_size": env.get("world_size"),
        "profile": report.get("profile"),
        "started": report.get("started"),
        "exit_status": report.get("exit_status"),
        "counts": report.get("counts") or {},
        "failures_note": triage_line(report.get("failures")),  # summary.md's words beside the count
        "warnings": report.get("warnings") or [],
        "axes": list(AXES),
        "areas": areas,
        "outcomes": list(MARKS),
        "items": items,
    }


def repro_line(item: dict[str, Any]) -> str | None:
    """The repro line a failed or xfailed item's message ends with (verdict.py writes it)."""
    for line in reversed((item.get("message") or "").splitlines()):
        if line.startswith(REPRO_PREFIX):
            return line.removeprefix(REPRO_PREFIX)
    return None


def embedded_json(value: Any) -> str:
    """JSON that cannot end its <script> early: every '<' escaped (JSON.parse reads it back)."""
    return json_text.dumps(value, separators=(",", ":")).replace("<", "\\u003c")


def document(title: str, body: str, script: str = "") -> str:
    """A page that needs nothing outside itself: ``body``, then the inline ``script``."""
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">',
        '<meta name="referrer" content="no-referrer">',
        f"<title>{html.escape(title)}</title>",
        f"<style>{STYLE}</style>",
        f"</head><body>{body}",
    ]
    if script:
        parts.append(f"<script>{script}</script>")
    parts.append("</body></html>\n")
    return "\n".join(parts)


def _body(data: dict[str, Any]) -> str:
    # the script fills these in; without it (a mail client's preview) the heading still says what this is
    return (
        f'<script type="application/json" id="data">{embedded_json(data)}</script>'
        '<header><h1 id="title">Thunder conformance report</h1><p id="run"></p></header>'
        '<main id="main"><p>This page renders with JavaScript: the report is embedded in it.</p></main>'
    )
