"""How early ci tells of each planted bug: per record of tests/planted/, the share of a clean
run's item time spent before the first item that the record must fail (issue 42's measure).

    python tools/first_failures.py reports/          # a clean ci run's report folder

The clean run's items are taken in the order they ran (report.jsonl) and, beside it, in the
covering array's generation order (``--order generation``: worlds by size, simulated last),
each costing the seconds it took in the clean run. A record's first failing item is the first
whose cell and area its expectations say must fail (``Expect.must``; its ``may`` cells could
only fail sooner): so each share is what a run with -x would spend before its first failure,
at most. The kit's planted tests hold that each record fails on exactly those cells. Prints a
Markdown table, the medians and the worst; records that fail on no cell of ci are left out (of
the at-scale ones, the slot permutations in string order fail ci's simulated module-init cell).

    python tools/first_failures.py reports/ --measured runs/   # runs/<record>/report.jsonl

With ``--measured``, each record's real ``-x`` run of ci (one report folder per record, named
for it) gives the item it stopped at: the share is the clean run's seconds of the items the
``-x`` run passed before it, beside the prediction.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from conformance.matrix.cells import Cell  # noqa: E402
from tests.planted.registry import RECORDS  # noqa: E402
from tests.planted.sharding import STRING_ORDER, shows_string_order  # noqa: E402


def must_fail(record: Any, cell: Cell, area: str) -> bool:
    """Whether ``record`` must fail ``area`` on ``cell``: its expectations say so, or, for a
    slot permutation that only scale shows, tests/planted/test_scale.py's prediction does."""
    if record.name in STRING_ORDER:
        return area == "sharding" and shows_string_order(cell)
    expect = record.areas.get(area)
    return expect is not None and expect.must(cell)


def share(items: list[dict[str, Any]], record: Any) -> float | None:
    """The share of the items' seconds before the record's first must-fail item (None: none)."""
    total, before = sum(i["duration"] for i in items), 0.0
    for item in items:
        if must_fail(record, item["cell_obj"], item["area"]):
            return before / total
        before += item["duration"]
    return None


def measured(clean: dict[str, float], ran: list[dict[str, Any]]) -> tuple[float, dict[str, Any]] | None:
    """The clean run's share of seconds (``clean``: item id -> seconds) spent on the items a
    ``-x`` run ran before its first failed item, and that item (None: nothing failed)."""
    total, before = sum(clean.values()), 0.0
    for item in sorted(ran, key=lambda i: i["ended_s"]):
        if item["outcome"] == "failed":
            return before / total, item
        before += clean.get(item["id"], 0.0)
    return None


def _measured_rows(clean_items: list[dict[str, Any]], folder: Path) -> None:
    clean = {i["id"]: i["duration"] for i in clean_items}
    print("| record | -x: first failure | predicted | area | on a cell it must fail |")
    print("|---|---|---|---|---|")
    shares = []
    for record in RECORDS:
        jsonl = folder / record.name / "report.jsonl"
        predicted = share(clean_items, record)
        if predicted is None or not jsonl.exists():
            continue
        ran = [json.loads(line) for line in jsonl.read_text().splitlines()]
        got = measured(clean, [i for i in ran if "axes" in i])
        if got is None:
            print(f"| `{record.name}` | nothing failed | {predicted:.3f} | – | – |")
            continue
        first, item = got
        shares.append(first)
        must = must_fail(record, Cell(**item["axes"]), item["area"])
        print(f"| `{record.name}` | {first:.3f} | {predicted:.3f} | {item['area']} | {'yes' if must else 'no'} |")
    if shares:
        print(f"\n{len(shares)} records run: median {statistics.median(shares):.3f}, worst {max(shares):.3f}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("report", type=Path, help="a clean ci run's report folder (report.jsonl, report.json)")
    p.add_argument("--measured", type=Path, help="a folder of real -x runs, one report folder per record")
    args = p.parse_args(argv)
    ran = [json.loads(line) for line in (args.report / "report.jsonl").read_text().splitlines()]
    items = [dict(i, cell_obj=Cell(**i["axes"])) for i in ran if "axes" in i]
    items.sort(key=lambda i: i["ended_s"])  # as they ran
    if args.measured is not None:
        _measured_rows(items, args.measured)
        return 0
    profile_order = {c: k for k, c in enumerate(dict.fromkeys(i["cell"] for i in items))}
    # generation: the profile's cells by world (size, simulated last), each cell's items together
    generation_rank = {c.id: k for k, c in enumerate(_generation_cells())}
    generation = sorted(
        items,
        key=lambda i: (
            i["cell_obj"].simulated,
            i["cell_obj"].world_size,
            generation_rank.get(i["cell"], len(generation_rank)),
            profile_order[i["cell"]],
        ),
    )
    rows = []
    for record in RECORDS:
        early = share(items, record)
        if early is not None:
            rows.append((record.name, early, share(generation, record)))
    rows.sort(key=lambda r: -r[1])
    print("| record | run's order | generation order |")
    print("|---|---|---|")
    for name, early, gen in rows:
        print(f"| `{name}` | {early:.3f} | {'–' if gen is None else f'{gen:.3f}'} |")
    firsts = [e for _, e, _ in rows]
    gens = [g for _, _, g in rows if g is not None]
    print(f"\n{len(rows)} records; run's order: median {statistics.median(firsts):.3f}, worst {max(firsts):.3f}; ")
    print(f"generation order: median {statistics.median(gens):.3f}, worst {max(gens):.3f}")
    return 0


def _generation_cells() -> list[Cell]:
    """ci's cells in the covering array's own order, over what this machine offers."""
    from conformance.matrix.profiles import cells
    from tests.support.suite_runs import probed_on_this_machine

    return cells("ci", 2, probed_on_this_machine())


if __name__ == "__main__":
    sys.exit(main())
