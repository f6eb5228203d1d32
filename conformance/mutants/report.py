"""What an analysis found: scores per file and per function, every survivor with its diff and
the cells that ran it, and the kill matrix (which check area found which mutant)."""

from __future__ import annotations

import dataclasses
import statistics
from collections import Counter
from collections.abc import Iterable
from typing import Any

from conformance.mutants.equivalents import DEVICES, BlindSpot, Equivalent
from conformance.mutants.kills import EQUIVALENT, KIT_ERROR, OUTCOMES, RAISED, SILENT, SURVIVED, TIMEOUT, Verdict
from conformance.mutants.operators import family
from conformance.mutants.sites import Mutant
from conformance.mutants.trial import cells_for
from conformance.reports.coverage_map import CoverageMap

RUN = (SILENT, RAISED, TIMEOUT, SURVIVED, KIT_ERROR)  # a verdict from running cells
KILLS = (SILENT, RAISED, TIMEOUT)


@dataclasses.dataclass(frozen=True)
class Score:
    """``silent``: silently-wrong kills / (run - raised or hung), the oracle's own power;
    ``plain``: every kill / run, as mutation tools usually count."""

    counts: dict[str, int]

    @property
    def run(self) -> int:
        return sum(self.counts.get(o, 0) for o in RUN)

    @property
    def kept_running(self) -> int:
        """Mutants run that neither raised nor hung: the silently-wrong score's denominator."""
        return self.run - self.counts.get(RAISED, 0) - self.counts.get(TIMEOUT, 0)

    @property
    def silent(self) -> float | None:
        return self.counts.get(SILENT, 0) / self.kept_running if self.kept_running else None

    @property
    def plain(self) -> float | None:
        kills = sum(self.counts.get(o, 0) for o in (SILENT, RAISED, TIMEOUT))
        return kills / self.run if self.run else None

    def to_json(self) -> dict[str, Any]:
        return {
            "counts": self.counts,
            "run": self.run,
            "kept_running": self.kept_running,
            "silently_wrong": self.counts.get(SILENT, 0),
            "silent_score": self.silent,
            "plain_score": self.plain,
        }


def score(verdicts: Iterable[Verdict]) -> Score:
    return Score(dict(Counter(v.outcome for v in verdicts)))


def build(
    judged: list[tuple[Mutant, Verdict, str]],
    equivalents: dict[str, Equivalent],
    cmap: CoverageMap,
    blind_spots: dict[str, BlindSpot] | None = None,
) -> dict[str, Any]:
    """mutants.json: the whole analysis. A mutant the equivalents file names counts as
    equivalent whatever an earlier trial said of it, unless a check killed it: then the
    argument was wrong, and the report says so (``equivalence_refuted``). A blind spot the
    file names keeps its trial's verdict (a survivor: the score counts it) and carries the
    input that would show it; one a check killed is closed (``blind_spots_closed``)."""
    blind_spots = blind_spots or {}
    refuted = [m.id for m, v, _ in judged if m.id in equivalents and v.outcome in KILLS]
    judged = [(m, Verdict(EQUIVALENT) if m.id in equivalents and m.id not in refuted else v, d) for m, v, d in judged]
    verdicts = [v for _, v, _ in judged]
    by_file: dict[str, list[Verdict]] = {}
    by_function: dict[str, list[Verdict]] = {}
    by_family: dict[str, list[Verdict]] = {}
    for m, v, _ in judged:
        by_file.setdefault(m.path, []).append(v)
        by_family.setdefault(family(m.operator), []).append(v)
        by_function.setdefault(f"{m.path}::{m.function or '<module>'}", []).append(v)
    times = [v.seconds for v in verdicts if v.outcome in RUN]
    matrix: dict[str, list[str]] = {}
    for m, v, _ in judged:
        for area in v.areas if v.outcome == SILENT else ():
            matrix.setdefault(area, []).append(m.id)
    return {
        "score": score(verdicts).to_json(),
        "files": {f: score(vs).to_json() for f, vs in sorted(by_file.items())},
        "functions": {f: score(vs).to_json() for f, vs in sorted(by_function.items())},
        "families": {f: score(vs).to_json() for f, vs in sorted(by_family.items())},
        "seconds": {
            "total": sum(times),
            "median": statistics.median(times) if times else None,
            "cells_run": sum(v.cells_run for v in verdicts),
        },
        "kill_matrix": matrix,
        "equivalence_refuted": refuted,
        "blind_spots_closed": [m.id for m, v, _ in judged if m.id in blind_spots and v.outcome in KILLS],
        "mutants": [
            {
                "id": m.id,
                "file": m.path,
                "function": m.function,
                "line": m.line,
                "operator": m.operator,
                **v.to_json(),
                "diff": d,
                **({"why_equivalent": equivalents[m.id].why} if v.outcome == EQUIVALENT else {}),
                # an argument that holds on some devices only: on the others the trial judges it
                **({"equivalent_on": list(equivalents[m.id].devices)} if v.outcome == EQUIVALENT else {}),
                **({"cells_running": cells_for(m, cmap)} if v.outcome == SURVIVED else {}),
                **(
                    {"blind_spot": {"why": blind_spots[m.id].why, "input": blind_spots[m.id].input}}
                    if m.id in blind_spots
                    else {}
                ),
            }
            for m, v, d in judged
        ],
    }


def _only_on(mutant: dict[str, Any]) -> str:
    """ " (on cpu only)" where the equivalence argument holds on some devices only."""
    on = mutant.get("equivalent_on") or list(DEVICES)
    return "" if set(on) >= set(DEVICES) else f" (on {', '.join(on)} only)"


def _blind_spot(entry: dict[str, str]) -> list[str]:
    return [f"A blind spot of the kit's inputs: {entry['why']}. Shown by: {entry['input']}.", ""]


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.0f}%"


def markdown(data: dict[str, Any]) -> str:
    """mutants.md: the score first, then where the kit is blind."""
    s = data["score"]
    counts = ", ".join(f"{s['counts'].get(o, 0)} {o}" for o in OUTCOMES if s["counts"].get(o))
    lines = [
        "# Mutation analysis of the Thunder under test",
        "",
        f"**Silently-wrong score {_pct(s['silent_score'])}** (kills a check found / mutants run that kept "
        f"Thunder running); plain score {_pct(s['plain_score'])} (every kill / mutants run).",
        "",
        f"{len(data['mutants'])} mutants: {counts}. Trials: {data['seconds']['total']:.0f} s in all, median "
        f"{data['seconds']['median'] or 0:.0f} s, {data['seconds']['cells_run']} cells run.",
        "",
        "| file | run | silent | raised | survived | silent score | plain score |",
        "|---|---|---|---|---|---|---|",
    ]
    for f, fs in data["files"].items():
        c = fs["counts"]
        lines.append(
            f"| `{f}` | {fs['run']} | {c.get(SILENT, 0)} | {c.get(RAISED, 0) + c.get(TIMEOUT, 0)} | "
            f"{c.get(SURVIVED, 0)} | {_pct(fs['silent_score'])} | {_pct(fs['plain_score'])} |"
        )
    lines += [
        "",
        "## By kind of change (operator family)",
        "",
        "| family | run | silent | raised | survived | silent score |",
        "|---|---|---|---|---|---|",
    ]
    for f, fs in data.get("families", {}).items():
        c = fs["counts"]
        lines.append(
            f"| {f} | {fs['run']} | {c.get(SILENT, 0)} | {c.get(RAISED, 0) + c.get(TIMEOUT, 0)} | "
            f"{c.get(SURVIVED, 0)} | {_pct(fs['silent_score'])} |"
        )
    lines += ["", "## Kill matrix (check area → silently-wrong mutants it found)", ""]
    for area, ids in sorted(data["kill_matrix"].items(), key=lambda kv: -len(kv[1])):
        lines.append(f"- **{area}**: {len(ids)}")
    survivors = [m for m in data["mutants"] if m["outcome"] == SURVIVED]
    lines += ["", f"## Survivors ({len(survivors)})", ""]
    for m in survivors:
        cells = m.get("cells_running", [])
        lines += [
            f"### `{m['id']}` ({m['function'] or '<module>'})",
            "",
            f"Ran on {len(cells)} cells, all conformed: "
            + ", ".join(f"`{c}`" for c in cells[:5])
            + (" …" if len(cells) > 5 else ""),
            "",
            *(_blind_spot(m["blind_spot"]) if "blind_spot" in m else []),
            "```diff",
            m["diff"].rstrip(),
            "```",
            "",
        ]
    errors = [m for m in data["mutants"] if m["outcome"] == KIT_ERROR]
    if errors:
        lines += [f"## The kit broke ({len(errors)}): report these to the kit", ""]
        lines += [f"- `{m['id']}`: {m['detail']}" for m in errors]
        lines.append("")
    if data["equivalence_refuted"]:
        lines += ["## Equivalents the kit refuted (a check killed them): fix mutants-equivalent.toml", ""]
        lines += [f"- `{i}`" for i in data["equivalence_refuted"]]
        lines.append("")
    if data.get("blind_spots_closed"):
        lines += ["## Blind spots a check now sees: drop their entries from mutants-equivalent.toml", ""]
        lines += [f"- `{i}`" for i in data["blind_spots_closed"]]
        lines.append("")
    equivalent = [m for m in data["mutants"] if m["outcome"] == EQUIVALENT]
    if equivalent:
        lines += [f"## Equivalent, set aside ({len(equivalent)})", ""]
        lines += [f"- `{m['id']}`{_only_on(m)}: {m['why_equivalent']}" for m in equivalent]
        lines.append("")
    return "\n".join(lines)
