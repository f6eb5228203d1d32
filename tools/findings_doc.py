"""docs/findings.md, generated from xfails.toml: where each Thunder version does not conform.

    python tools/findings_doc.py           # the generated text to stdout
    python tools/findings_doc.py --write   # regenerate docs/findings.md
    python tools/findings_doc.py --check   # exit 1 where docs/findings.md is stale

The page is written from the xfails file alone, so that it cannot drift from it
(tests/unit/test_docs.py compares the checked-in page with ``render``). Standard library
only (tomli below Python 3.11), and it does not validate the file: the suite does that when
it loads it (conformance/frontend/xfails.py).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
XFAILS = ROOT / "xfails.toml"
PAGE = ROOT / "docs" / "findings.md"
_HEADER = re.compile(r"^\s*\[\[\s*xfail\s*\]\]")


def _cell(text: str) -> str:
    """``text`` safe inside a Markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


def _code(text: str) -> str:
    """``text`` as a code span, fenced by more backticks than it holds."""
    run = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * (run + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _first_sentence(text: str) -> str:
    """The reason's first sentence: up to a full stop followed by a capital letter."""
    return re.split(r"(?<=[.!?])\s+(?=[A-Z])", text.strip(), maxsplit=1)[0]


def _when(when: dict[str, list[Any]]) -> str:
    if not when:
        return "every cell"
    return "; ".join(f"{axis} = {', '.join(map(str, values))}" for axis, values in when.items())


def _version_key(spec: str) -> tuple[int, list[Any], str]:
    """Specifiers ordered newest first where they pin one version (``==X``), the rest after."""
    pinned = re.fullmatch(r"==\s*(\d+(?:\.\d+)*)(.*)", spec.strip())
    if not pinned:
        return (1, [], spec)
    numbers = [-int(n) for n in pinned.group(1).split(".")]
    # a pre- or dev release sorts before its release: newest first puts it after
    return (0, numbers, pinned.group(2) or "~")


def render(text: str, source: str = "xfails.toml") -> str:
    """The Markdown page for the xfails file whose contents are ``text``."""
    entries: list[dict[str, Any]] = tomllib.loads(text).get("xfail", [])
    lines = [n for n, line in enumerate(text.splitlines(), start=1) if _HEADER.match(line)]
    if len(lines) != len(entries):
        lines = [0] * len(entries)
    out = [
        "# Findings: where each Thunder version does not conform",
        "",
        f"Generated from `{source}` by `tools/findings_doc.py`; do not edit it by hand:",
        "`python tools/findings_doc.py --write` regenerates it, and `tests/unit/test_docs.py`",
        "fails where it is stale. Each entry below is one known non-conformance: the check area,",
        "the cells it covers, the Thunder versions it holds on, the failures it expects (each by",
        "its code and fields: [codes.md](codes.md)) or the raise its cells end with, why, and the",
        "evidence. How entries are matched is in [reports.md](reports.md#known-non-conformances-xfailstoml).",
        "",
        "## By Thunder version",
        "",
    ]
    by_version: dict[str, list[int]] = {}
    for i, entry in enumerate(entries, start=1):
        for spec in entry.get("thunder", []):
            by_version.setdefault(spec, []).append(i)
    for spec in sorted(by_version, key=_version_key):
        numbers = by_version[spec]
        out += [f"### lightning-thunder {spec}", "", f"{len(numbers)} entries.", ""]
        out += ["| entry | area | cells | reason |", "|---|---|---|---|"]
        for i in numbers:
            entry = entries[i - 1]
            reason = _first_sentence(str(entry.get("reason", "")))
            anchor = f"entry-{i}-{_area(entry).replace(' ', '-')}"
            out.append(
                f"| [{i}](#{anchor}) | {_cell(_area(entry))} | {_cell(_when(entry.get('when', {})))} "
                f"| {_cell(reason)} |"
            )
        out.append("")
    out += ["## The entries", ""]
    for i, (entry, line) in enumerate(zip(entries, lines, strict=True), start=1):
        where = f"`{source}` line {line}" if line else f"`{source}`"
        out += [
            f"### Entry {i}: {_area(entry)}",
            "",
            f"- where: {where}",
            f"- Thunder: {', '.join(_code(s) for s in entry.get('thunder', []))}",
            f"- cells: {_when(entry.get('when', {}))}",
        ]
        if "raises" in entry:
            out.append(f"- raise its cells end with: {_raise(entry['raises'])}")
        else:
            out.append("- failures it expects:")
            out += [f"  - {_failure(f)}" for f in entry.get("failures", [])]
        out += [f"- reason: {entry.get('reason', '')}", f"- evidence: {entry.get('link', '')}", ""]
    return "\n".join(out).rstrip("\n") + "\n"


def _area(entry: dict[str, Any]) -> str:
    """The entry's area; a raises entry without one covers every area of its cells."""
    return str(entry.get("area", "every area" if "raises" in entry else ""))


def _raise(raised: object) -> str:
    if not isinstance(raised, dict):
        return _code(str(raised))
    kind, at, message = (_code(str(raised.get(k))) for k in ("type", "at", "message"))
    return f"{kind} from {at}, its message holding {message}"


def _failure(failure: object) -> str:
    """A failure by its code and fields, and the cells it shows in where it names them."""
    if not isinstance(failure, dict):
        return _code(str(failure))
    fields = ", ".join(f"{k} = {_value(v)}" for k, v in failure.items() if k not in ("code", "when"))
    when = failure.get("when")
    return _code(f"{failure.get('code', '')} {{{fields}}}") + (f" (only where {_when(when)})" if when else "")


def _value(value: object) -> str:
    """A field's value as the entry writes it, a long list of names cut to its size."""
    if isinstance(value, dict) and isinstance(value.get("one_of"), list) and len(value["one_of"]) > 4:
        return f"one of {len(value['one_of'])} names ({', '.join(map(str, value['one_of'][:3]))}, ...)"
    if isinstance(value, dict) and "one_of" in value:
        return f"one of {', '.join(map(str, value['one_of']))}"
    return str(value) if not isinstance(value, str) else repr(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--xfails", type=Path, default=XFAILS)
    parser.add_argument("--out", type=Path, default=PAGE)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="write the page")
    mode.add_argument("--check", action="store_true", help="exit 1 where the page is stale")
    args = parser.parse_args(argv)
    page = render(args.xfails.read_text(), args.xfails.name)
    if args.write:
        args.out.write_text(page)
    elif args.check:
        if not args.out.exists() or args.out.read_text() != page:
            print(f"{args.out} is stale: run python tools/findings_doc.py --write", file=sys.stderr)
            return 1
    else:
        sys.stdout.write(page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
