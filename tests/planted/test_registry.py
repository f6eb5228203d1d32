"""The planted bugs' registry: every record once, under a name of its own, each with a
prediction that can fail, over areas the suite has."""

from __future__ import annotations

import collections
import importlib

from conformance.checks.registry import AREAS
from tests.planted.cells import NONE
from tests.planted.record import PlantedBug
from tests.planted.registry import BUGS, RECORDS, family_modules, walk


def test_every_record_is_held_once_under_a_unique_name() -> None:
    walked = walk()
    assert len({id(b) for b in walked}) == len(walked), "a record is held by two modules"
    twice = [name for name, n in collections.Counter(b.name for b in walked).items() if n > 1]
    assert not twice, f"two records named {twice}"
    assert list(BUGS.values()) == list(RECORDS) == walked


def test_each_record_lives_in_the_family_module_it_names() -> None:
    for module in family_modules():
        held = [v for v in vars(importlib.import_module(module)).values() if isinstance(v, PlantedBug)]
        assert held, f"{module} holds no planted bug"
        for bug in held:
            assert module == f"tests.planted.{bug.family}", f"{bug.name} of {bug.family} is held by {module}"


def test_each_record_names_a_must_fail_area_or_is_shown_at_scale() -> None:
    for bug in RECORDS:
        assert bug.doc.strip(), f"{bug.name} says nothing about what it plants"
        if bug.areas:
            assert any(e.must is not NONE for e in bug.areas.values()), f"{bug.name} must fail nowhere"
        else:
            assert bug.at_scale, f"{bug.name} is judged nowhere: no area on real worlds, not run at scale"


def test_areas_named_are_the_suites() -> None:
    for bug in RECORDS:
        assert set(bug.areas) <= set(AREAS), f"{bug.name}: {set(bug.areas) - set(AREAS)} are no areas"
