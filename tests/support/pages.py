"""Reports for the page and dashboard tests, derived from the excerpt of a real ci report
(tests/unit/data/ci_report_excerpt.json): a clean one with a jit_ddp cell added beside the
ddp_jit ones, and one with failures planted the way the verdict writes them."""

from __future__ import annotations

import copy
import json
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from conformance.reports.outcomes import triage

EXCERPT = Path(__file__).resolve().parents[1] / "unit" / "data" / "ci_report_excerpt.json"
DDP = "tied_lm-real_broadcast_first-ddp_jit-tied-min_bytes-zero2-none-float32-accumulate-ws2"
JIT_DDP = DDP.replace("-ddp_jit-", "-jit_ddp-")
NEOX = "litgpt_neox-meta_transformed_sd-fsdp_jit-tied-all-zero2-none-float32-torch_only-reshape-ws2"
FINDING = "gradients at step 4 (AdamW) [fc1.weight]: max abs error 0.0123 > bound 1.2e-06"
LOG_TAIL = "rank 1 was here last: Segmentation fault (core dumped)"
# a message that would close the data's <script> and run its own, were it not escaped
HOSTILE = '</script><script>document.title="injected"</script><img src="https://example.org/x.png">'


def counted(report: dict[str, Any]) -> dict[str, Any]:
    counts: dict[str, int] = {}
    for item in report["cells"]:
        counts[item["outcome"]] = counts.get(item["outcome"], 0) + 1
    report["counts"] = counts
    report["failures"] = triage(report["cells"])
    return report


def clean() -> dict[str, Any]:
    """The excerpt (4 cells, the generated model's item) and a jit_ddp twin of its DDP cell."""
    report = json.loads(EXCERPT.read_text())
    report["whole_run"] = True
    twin = []
    for item in report["cells"]:
        if item.get("cell") == DDP:
            new = copy.deepcopy(item)
            new["id"] = item["id"].replace(DDP, JIT_DDP)
            new["cell"] = JIT_DDP
            new["axes"]["composition"] = "jit_ddp"
            twin.append(new)
    report["cells"] += twin
    return counted(report)


def item(report: dict[str, Any], cell: str, area: str) -> dict[str, Any]:
    return next(i for i in report["cells"] if i.get("cell") == cell and i.get("area") == area)


def repro(item_id: str) -> str:
    return f"python -m pytest '{item_id}' --nproc 2 --backend gloo"


def failing(report: dict[str, Any]) -> dict[str, Any]:
    """``report`` with the DDP cell's numerics failing on both ranks (findings, repro, metrics
    of NaN and infinity), its
    memory item failing after rank 1 died (the log tail in the message), and the NEOX cell's
    backward peak grown by a KiB (a metric beyond noise)."""
    report = copy.deepcopy(report)
    numerics = item(report, DDP, "numerics")
    numerics["outcome"] = "failed"
    numerics["ranks"] = [{"rank": r, "status": "failed", "failures": [FINDING]} for r in range(2)]
    head = f"{DDP} does not conform (numerics):\n  ranks [0, 1]: {FINDING}"
    numerics["message"] = f"{head}\nrepro: {repro(numerics['id'])}"
    numerics["known_elsewhere_only"] = True  # as if an entry for another Thunder version explained it
    # what a state dict of NaN measures: no page or file may write it as JSON's non-standard Infinity
    numerics["metrics"]["state dict max_abs_err"] = float("inf")
    numerics["metrics"]["state dict mean"] = float("nan")
    memory = item(report, DDP, "memory")
    memory["outcome"] = "failed"
    memory["ranks"][1]["status"] = "died"
    memory["message"] = (
        f"{DDP} did not run to completion (memory)\n--- rank 1: died after 3.0s ---\n[log tail]\n{LOG_TAIL}\n"
        f"{HOSTILE}\nrepro: {repro(memory['id'])}"
    )
    item(report, NEOX, "memory")["metrics"]["measured"]["backward"] += 1024
    report["exit_status"] = 1
    return counted(report)


def runs_folder(folder: Path) -> Path:
    """pin and 0.2.6 clean (0.2.6 the pin's report under another version), then a planted run
    of part of the suite."""
    pin = clean()
    release = json.loads(json.dumps(pin))
    release["environment"]["thunder"] = "0.2.6"
    release["started"] = "2026-11-25T01:00:00+00:00"
    planted = failing(pin)
    planted["started"] = "2026-11-26T01:00:00+00:00"
    planted["whole_run"] = False
    planted["cells"] = [i for i in planted["cells"] if i.get("cell") in (DDP, NEOX)]
    for name, report in (("pin", pin), ("0.2.6", release), ("planted", planted)):
        (folder / name).mkdir(parents=True)
        (folder / name / "report.json").write_text(json.dumps(report))
    return folder


class Elements(HTMLParser):
    """Every element's attributes, by tag, from a page or a DOM the browser dumped."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.found: dict[str, list[dict[str, str]]] = {}
        self.text: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.found.setdefault(tag, []).append({k: v or "" for k, v in attrs})

    def handle_data(self, data: str) -> None:
        self.text.append(data)

    def of(self, tag: str, attr: str) -> list[dict[str, str]]:
        return [a for a in self.found.get(tag, []) if attr in a]
