"""Where a mutant can be made: every position of every operator in the chosen Thunder files,
named so that the id says which source it was made of."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterable, Iterator
from pathlib import Path

from cosmic_ray.ast import ast_nodes, get_ast
from cosmic_ray.ast.ast_query import ASTQuery
from cosmic_ray.mutating import mutate_code

from conformance.mutants.operators import NAMES, operator
from conformance.reports.coverage_map import source_digest

# What the acceptance of mutation analysis names: FSDP, DDP, their prims and utilities, the
# front door (thunder.distributed), checkpoints and materialization.
DEFAULT_FILES = (
    "thunder/distributed/transforms/fsdp_v2.py",
    "thunder/distributed/transforms/ddp_v2.py",
    "thunder/distributed/prims.py",
    "thunder/distributed/__init__.py",
    "thunder/distributed/checkpoint.py",
    "thunder/distributed/utils.py",
    "thunder/transforms/materialization.py",
)


@dataclasses.dataclass(frozen=True)
class Mutant:
    """One first-order mutation: ``operator``'s ``occurrence``-th position in ``path``."""

    path: str  # Thunder-relative: thunder/distributed/utils.py
    source: str  # the first 12 hex digits of the file's sha256: the source the mutant was made of
    operator: str
    occurrence: int
    line: int
    end_line: int
    function: str  # the enclosing definition ("" at module level)

    @property
    def id(self) -> str:
        return f"{self.path}@{self.source}:{self.line}:{self.operator}#{self.occurrence}"

    @property
    def lines(self) -> range:
        return range(self.line, self.end_line + 1)

    def mutated(self, text: str) -> str | None:
        """The file's text with this mutation applied (None: the operator found no such position)."""
        return mutate_code(text, operator(self.operator), self.occurrence)


def source_hash(text: str) -> str:
    return source_digest(text)[:12]


def sites(path: str, text: str, operators: Iterable[str] = NAMES) -> Iterator[Mutant]:
    """Every mutant of one file, in cosmic-ray's order (its occurrence numbering)."""
    digest = source_hash(text)
    module = get_ast(text)
    for name in operators:
        op = operator(name)
        occurrence = 0
        for node in ast_nodes(module):
            for start, end in op.mutation_positions(node):
                definition = ASTQuery(node).get_definition_name() or ""
                yield Mutant(path, digest, name, occurrence, start[0], end[0], definition)
                occurrence += 1


def all_sites(thunder_root: Path, paths: Iterable[str]) -> list[Mutant]:
    """Every mutant of ``paths`` (Thunder-relative) in the Thunder found at ``thunder_root``
    (its ``thunder`` folder's parent)."""
    found: list[Mutant] = []
    for path in paths:
        found.extend(sites(path, (thunder_root / path).read_text()))
    return found


def sample(mutants: list[Mutant], n: int | None, seed: int) -> list[Mutant]:
    """``n`` of them drawn with ``seed`` (all for None): the same draw on every machine for the
    same source, and a prefix of one order, so that a larger ``n`` with the same seed extends a
    sample (a resumed session judges only the new ones)."""
    ordered = sorted(mutants, key=lambda m: m.id)
    random.Random(seed).shuffle(ordered)
    return ordered if n is None else ordered[:n]
