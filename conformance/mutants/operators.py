"""The mutation operators: a selection of cosmic-ray's, and three of the kit's own in
cosmic-ray's operator protocol (parso trees) for the regressions that keep Thunder running.

cosmic-ray's 213 operators are mostly every binary or comparison operator swapped for every
other (``+`` for ``<<``): most of those make Thunder raise at once, which proves only that
Thunder runs. The selection keeps the swaps a hurried edit makes (``<`` for ``<=``, ``+`` for
``-``, ``and`` for ``or``, a negated condition, a constant off by one, a loop that runs zero
times) and adds what cosmic-ray lacks: two arguments swapped, an entry dropped from a list,
a call made as a statement deleted.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import parso
import parso.python.tree as tree
from cosmic_ray.operators.operator import Example, Operator
from cosmic_ray.plugins import get_operator

# cosmic-ray's operators kept, by their registered names
CORE = (
    "core/NumberReplacer",
    "core/ZeroIterationForLoop",
    "core/AddNot",
    "core/ReplaceTrueWithFalse",
    "core/ReplaceFalseWithTrue",
    "core/ReplaceAndWithOr",
    "core/ReplaceOrWithAnd",
    "core/ReplaceBreakWithContinue",
    "core/ReplaceContinueWithBreak",
    "core/ReplaceComparisonOperator_Eq_NotEq",
    "core/ReplaceComparisonOperator_NotEq_Eq",
    "core/ReplaceComparisonOperator_Lt_LtE",
    "core/ReplaceComparisonOperator_LtE_Lt",
    "core/ReplaceComparisonOperator_Gt_GtE",
    "core/ReplaceComparisonOperator_GtE_Gt",
    "core/ReplaceComparisonOperator_Is_IsNot",
    "core/ReplaceComparisonOperator_IsNot_Is",
    "core/ReplaceBinaryOperator_Add_Sub",
    "core/ReplaceBinaryOperator_Sub_Add",
    "core/ReplaceBinaryOperator_Mul_Div",
    "core/ReplaceBinaryOperator_Div_Mul",
    "core/ReplaceBinaryOperator_FloorDiv_Mul",
)


def _positional(arglist: Any) -> list[Any]:
    """The plain positional arguments of a call's arglist (no ``*``, no ``name=``)."""
    args = [c for c in arglist.children if c.type != "operator"]
    return [a for a in args if a.type not in ("argument", "star_expr")]


class SwapArguments(Operator):
    """A call's first two positional arguments swapped: ``f(a, b)`` -> ``f(b, a)``."""

    def mutation_positions(self, node: Any) -> Iterator[tuple[tuple[int, int], tuple[int, int]]]:
        if node.type == "trailer" and node.children[0].type == "operator" and node.children[0].value == "(":
            inner = node.children[1] if len(node.children) == 3 else None
            if inner is not None and inner.type == "arglist":
                args = [c for c in inner.children if c.type != "operator"]
                distinct = len(args) >= 2 and args[0].get_code().strip() != args[1].get_code().strip()
                if distinct and all(a in _positional(inner) for a in args[:2]):
                    yield (node.start_pos, node.end_pos)

    def mutate(self, node: Any, index: int) -> Any:
        inner = node.children[1]
        kids = inner.children
        first, second = _two(kids)
        a, b = kids[first], kids[second]
        pa, pb = a.get_first_leaf().prefix, b.get_first_leaf().prefix
        kids[first], kids[second] = b, a
        b.get_first_leaf().prefix, a.get_first_leaf().prefix = pa, pb
        return node

    @classmethod
    def examples(cls) -> tuple[Example, ...]:
        return (Example("f(a, b)", "f(b, a)"), Example("f(a, b, c=1)", "f(b, a, c=1)"))


def _two(kids: list[Any]) -> tuple[int, int]:
    found = [i for i, c in enumerate(kids) if c.type != "operator"]
    return found[0], found[1]


class DropListEntry(Operator):
    """One entry dropped from a list display of two or more: ``[a, b, c]`` -> ``[a, c]``."""

    def mutation_positions(self, node: Any) -> Iterator[tuple[tuple[int, int], tuple[int, int]]]:
        for entry in _entries(node):
            yield (entry.start_pos, entry.end_pos)

    def mutate(self, node: Any, index: int) -> Any:
        entries = _entries(node)
        kept = [e.get_code().strip() for i, e in enumerate(entries) if i != index]
        new = parso.parse("[" + ", ".join(kept) + "]").children[0]
        new.get_first_leaf().prefix = node.get_first_leaf().prefix
        return new

    @classmethod
    def examples(cls) -> tuple[Example, ...]:
        return (Example("x = [a, b]", "x = [b]"), Example("x = [a, b]", "x = [a]", occurrence=1))


def _entries(node: Any) -> list[Any]:
    if node.type != "atom" or len(node.children) != 3 or getattr(node.children[0], "value", None) != "[":
        return []
    inner = node.children[1]
    if inner.type != "testlist_comp" or any(c.type in ("sync_comp_for", "comp_for") for c in inner.children):
        return []
    entries = [c for c in inner.children if not (c.type == "operator" and c.value == ",")]
    if any(e.type == "star_expr" for e in entries):
        return []
    return entries if len(entries) >= 2 else []


class DeleteCallStatement(Operator):
    """A call made for its effect deleted: the statement ``f(x)`` -> ``None``."""

    def mutation_positions(self, node: Any) -> Iterator[tuple[tuple[int, int], tuple[int, int]]]:
        if _call_statement(node):
            yield (node.start_pos, node.end_pos)

    def mutate(self, node: Any, index: int) -> Any:
        return tree.Keyword("None", node.start_pos, prefix=node.get_first_leaf().prefix)

    @classmethod
    def examples(cls) -> tuple[Example, ...]:
        return (Example("f(x)\n", "None\n"), Example("a.b(x)\n", "None\n"))


def _call_statement(node: Any) -> bool:
    if node.type != "atom_expr" or node.parent is None or node.parent.type != "simple_stmt":
        return False
    last = node.children[-1]
    return last.type == "trailer" and last.children[0].value == "("


KIT = {
    "kit/SwapArguments": SwapArguments,
    "kit/DropListEntry": DropListEntry,
    "kit/DeleteCallStatement": DeleteCallStatement,
}
NAMES = (*CORE, *KIT)
# The operators whose mutants tend to keep Thunder running (``--operators kept-running``): all
# but a negated condition, a boolean constant flipped and a call deleted, whose mutants mostly
# make Thunder raise (a check of its own failing) or delete a check that always holds
# (docs/measurements.md: of the first analysis, by operator)
KEPT_RUNNING = tuple(
    n
    for n in NAMES
    if n not in {"core/AddNot", "core/ReplaceTrueWithFalse", "core/ReplaceFalseWithTrue", "kit/DeleteCallStatement"}
)
PRESETS = {"kept-running": KEPT_RUNNING}


def operator(name: str) -> Operator:
    """The operator registered as ``name`` (cosmic-ray's ``core/...`` or the kit's ``kit/...``)."""
    if name in KIT:
        return KIT[name]()
    return get_operator(name)()
