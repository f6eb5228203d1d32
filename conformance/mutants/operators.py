"""The mutation operators: a selection of cosmic-ray's, and four of the kit's own in
cosmic-ray's operator protocol (parso trees) for the regressions that keep Thunder running.

cosmic-ray's 213 operators are mostly every binary or comparison operator swapped for every
other (``+`` for ``<<``): most of those make Thunder raise at once, which proves only that
Thunder runs. The selection keeps the swaps a hurried edit makes (``<`` for ``<=``, ``+`` for
``-``, ``and`` for ``or``, a negated condition, a constant off by one, a loop that runs zero
times, a ``not`` dropped) and adds what cosmic-ray lacks: two arguments swapped, an entry
dropped from a list, a call made as a statement deleted, a membership test turned around.
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
    "core/ReplaceUnaryOperator_Delete_Not",
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


class ReverseMembership(Operator):
    """A membership test turned around: ``a in b`` -> ``a not in b``, and back. cosmic-ray has
    no operator for it, yet a lookup in a map of what was already handled is where a
    negation keeps Thunder running (issue 59: FSDP's unpadding visitor)."""

    def mutation_positions(self, node: Any) -> Iterator[tuple[tuple[int, int], tuple[int, int]]]:
        if _membership(node):
            yield (node.start_pos, node.end_pos)

    def mutate(self, node: Any, index: int) -> Any:
        prefix = node.get_first_leaf().prefix
        if node.type == "comp_op":
            return tree.Keyword("in", node.start_pos, prefix=prefix)
        op = parso.parse("a not in b").children[0].children[1]  # the comparison's comp_op
        op.get_first_leaf().prefix = prefix
        return op

    @classmethod
    def examples(cls) -> tuple[Example, ...]:
        return (
            Example("x = a in b\n", "x = a not in b\n"),
            Example("x = a not in b\n", "x = a in b\n"),
            Example("for a in b: pass\nx = a in c\n", "for a in b: pass\nx = a not in c\n"),
        )


def _membership(node: Any) -> bool:
    """``in`` or ``not in`` as a comparison's operator (not a ``for``'s ``in``)."""
    if node.type == "comp_op":
        return [getattr(c, "value", None) for c in node.children] == ["not", "in"]
    in_comparison = node.parent is not None and node.parent.type == "comparison"
    return node.type == "keyword" and node.value == "in" and in_comparison


KIT = {
    "kit/SwapArguments": SwapArguments,
    "kit/DropListEntry": DropListEntry,
    "kit/DeleteCallStatement": DeleteCallStatement,
    "kit/ReverseMembership": ReverseMembership,
}
NAMES = (*CORE, *KIT)
# The operators whose mutants tend to keep Thunder running (``--operators kept-running``): all
# but a negated condition, a boolean constant flipped and a call deleted, whose mutants mostly
# make Thunder raise (a check of its own failing) or delete a check that always holds
# (docs/measurements.md: of the first analysis, by operator). The two negations added after the
# kept-running census (a ``not`` dropped, a membership turned around) stay out of it too, so that
# its census stays the census of one set; ``all`` takes every operator.
LEFT_OUT_OF_KEPT_RUNNING = {
    "core/AddNot",
    "core/ReplaceUnaryOperator_Delete_Not",
    "core/ReplaceTrueWithFalse",
    "core/ReplaceFalseWithTrue",
    "kit/DeleteCallStatement",
    "kit/ReverseMembership",
}
KEPT_RUNNING = tuple(n for n in NAMES if n not in LEFT_OUT_OF_KEPT_RUNNING)
PRESETS = {"kept-running": KEPT_RUNNING, "all": NAMES}

# The kind of change each operator makes, for the report's score per family: which kinds of
# edit the kit is blind to
FAMILIES = {
    "a comparison's boundary moved": ("Lt_LtE", "LtE_Lt", "Gt_GtE", "GtE_Gt"),
    "equality or identity turned around": ("Eq_NotEq", "NotEq_Eq", "Is_IsNot", "IsNot_Is"),
    "a condition negated": ("core/AddNot", "Delete_Not", "kit/ReverseMembership"),
    "a boolean constant flipped": ("TrueWithFalse", "FalseWithTrue"),
    "and for or": ("AndWithOr", "OrWithAnd"),
    "arithmetic swapped": ("ReplaceBinaryOperator_",),
    "a number changed": ("core/NumberReplacer",),
    "a loop cut short": ("ZeroIterationForLoop", "BreakWithContinue", "ContinueWithBreak"),
    "a call changed": ("kit/SwapArguments", "kit/DeleteCallStatement"),
    "a list entry dropped": ("kit/DropListEntry",),
}


def family(name: str) -> str:
    """The family of operator ``name`` (every operator of ``NAMES`` has one)."""
    return next(f for f, marks in FAMILIES.items() if any(m in name for m in marks))


def operator(name: str) -> Operator:
    """The operator registered as ``name`` (cosmic-ray's ``core/...`` or the kit's ``kit/...``)."""
    if name in KIT:
        return KIT[name]()
    return get_operator(name)()
