"""What a planted bug is: its patch of Thunder (a context manager entered in every rank for
one cell) and the prediction of what the suite says about it, kept together in one record."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Mapping

from tests.planted.cells import NONE, Pred

Patch = Callable[[], contextlib.AbstractContextManager[None]]


@dataclasses.dataclass(frozen=True)
class Expect:
    """One check area's verdict on a planted bug: it must fail on the cells ``must`` picks,
    saying ``words`` (a string, or alternatives separated by " | "), may fail on those ``may``
    picks, and must pass (or stay the pin's known xfail) everywhere else."""

    must: Pred
    may: Pred = NONE
    words: str = ""


@dataclasses.dataclass(frozen=True)
class PlantedBug:
    """A bug planted into Thunder inside the ranks.

    ``areas``: area -> its expectation on real worlds; an area not named must pass everywhere.
    Empty where only simulated worlds show the bug (``at_scale``).
    ``cells``: None runs the smoke profile; else predicates, each choosing one cell of ci's
    profile (else nightly's): the first that take the bug's path and the first that do not.
    ``at_scale``: tests/planted/test_scale.py also runs it on simulated worlds.
    ``at_raises``: its cells may be ones a raises entry expects to raise (the bug changes that
    raise, or fixes it); other bugs never run there, where a raise ends the cell before them.
    ``parallelisms``: whose parallelism the cells its predicates choose among run
    (``Composition.parallelism``): Thunder's own transforms for a bug in Thunder's transforms.
    """

    name: str
    family: str
    patch: Patch
    areas: Mapping[str, Expect]
    cells: tuple[Pred, ...] | None = None
    at_scale: bool = False
    doc: str = ""
    parallelisms: frozenset[str] = frozenset({"thunder"})
    at_raises: bool = False


def planted(
    areas: Mapping[str, Expect] | None = None,
    *,
    cells: tuple[Pred, ...] | None = None,
    at_scale: bool = False,
    parallelisms: frozenset[str] = frozenset({"thunder"}),
    at_raises: bool = False,
) -> Callable[[Patch], PlantedBug]:
    """Decorate a patch into its record: the name is the function's, the family its module's,
    the doc its docstring."""

    def record(patch: Patch) -> PlantedBug:
        return PlantedBug(
            name=patch.__name__,
            family=patch.__module__.rsplit(".", 1)[-1],
            patch=patch,
            areas=dict(areas or {}),
            cells=cells,
            at_scale=at_scale,
            doc=patch.__doc__ or "",
            parallelisms=parallelisms,
            at_raises=at_raises,
        )

    return record
