"""The order a run takes its cells in: an early verdict.

A person waiting on a fork's pull request or a bisect step waits for the first failure, so
the cells most likely to show a regression soon go first (test-case prioritization, scored by
how early the faults are found):

1. **history**: the cells an earlier report (``--baseline``) saw fail or err, cheapest first;
2. **the prefix**: a short run of cells that meets every axis value (every world size,
   composition, scenario, init, ...) and every feature of ci's coverage contract at least once,
   and every **sole carrier**: a cell that alone runs some code path (a weighted greedy set
   cover), in the order the greedy took them: most new things met per expected second first.
   A sole carrier is, by a coverage map (``--coverage-map``: an earlier ``--thunder-coverage``
   run's), a cell that alone ran some line of Thunder's distributed stack; without one, a cell
   that alone carries a feature of its model under a transform family and an init
   (``carries_of``), a simulated world's way of getting its shards among them, or alone meets
   an item of ci's coverage contract (a feature with a family and a scenario: the one cell
   where a second shape's computation runs with a shared weight under DDP, say). A bug only
   such a cell can show would otherwise wait for the tail;
3. **the contract**: the same greedy over ci's coverage-contract items (a feature with a
   transform family and a scenario, or with an init: conformance/matrix/contract.py), in the
   order taken. A regression nearly always needs one such item, and pairs and triples would
   outnumber them in the next stage's gains;
4. **the rest**: each next cell the one that meets the most pairs and triples of axis values
   not yet met, per expected second (the additional-coverage greedy order), a change of
   world charged its start; then what meets nothing new, in the profile's order.

Measured on ci's report, item by item (docs/measurements.md): the share of a clean run's
time before each planted record's first failing item fell from a median of 0.12 (worst
0.89) in the generation order to 0.005 (worst 0.31).

Within each stage another world's cells run as one block, and a world of a small share of the
run runs whole where its first cell falls, so that the order costs no world starts the
generation order does not (ci: 4). The cells and their outcomes are the profile's whatever
the order; ``--order generation`` keeps the covering array's own order (worlds in blocks),
for comparison.
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import itertools
from collections.abc import Callable, Collection, Hashable, Iterable, Mapping, Sequence

from conformance.matrix.cells import AXES, Cell
from conformance.matrix.contract import family, items_of
from conformance.matrix.cost import WORLD_START_S, expected_seconds
from conformance.matrix.features import features
from conformance.matrix.resharded import block_world
from conformance.matrix.simulated import world_of
from fixtures.compositions import COMPOSITIONS

ORDERS = ("early-verdict", "generation")
# a profile of more cells (full's 158,342) takes the combinations' stage in its own order:
# that greedy took six minutes over full here (nightly's 771 cells: 3 s)
GREEDY_LIMIT = 5000

Seconds = Callable[[Cell], float]


@dataclasses.dataclass(frozen=True)
class Order:
    cells: tuple[Cell, ...]
    history: int  # how many of the first cells an earlier report saw fail
    # how many after them meet every axis value and contract feature (a world's block pulled
    # forward among them included), and how many after those meet the rest of the contract
    prefix: int
    contract: int


def values_of(cell: Cell) -> frozenset[Hashable]:
    """What the prefix must meet, as far as ``cell`` goes: each of its axis values (a
    simulated world a value of its own), and, for a real cell, each feature of its model
    that ci's coverage contract is written in (conformance/matrix/features.py)."""
    own: set[Hashable] = {(axis, getattr(cell, axis)) for axis in AXES}
    own.add(("simulated", cell.simulated))
    own.add(("saved_at", cell.saved_at))  # a resharded resume, to more ranks and to fewer
    if COMPOSITIONS[cell.composition].parallelism == "tensor":  # each model's plan: what reaches Thunder
        own.add(("tensor-parallel plan", cell.model))
    if not cell.simulated:
        own |= {("feature", f) for f in features(cell.model, cell.tie, cell.world_size, cell.spec)}
    return frozenset(own)


def combinations_of(cell: Cell) -> frozenset[Hashable]:
    """The pairs and triples of axis values ``cell`` meets (a simulated world a value of its own)."""
    values = [(axis, getattr(cell, axis)) for axis in AXES] + [("simulated", cell.simulated)]
    return frozenset(itertools.chain(itertools.combinations(values, 2), itertools.combinations(values, 3)))


def carries_of(cell: Cell) -> frozenset[Hashable]:
    """Each feature of ``cell``'s model under its transform family and its init (what a bug in
    a transform's handling of an init can need: a random buffer broadcast by FSDP, say); for a
    simulated cell, sharding at scale under its family and its init (module init: Thunder cuts
    every shard itself; a transformed state dict: it loads the kit's), which no real cell runs."""
    if cell.simulated:
        at_scale = (("carries", "sharding at scale"), ("family", family(cell.composition)), ("init", cell.init))
        return frozenset({at_scale})
    found = features(cell.model, cell.tie, cell.world_size, cell.spec)
    return frozenset((("carries", f), ("family", family(cell.composition)), ("init", cell.init)) for f in found)


def _sole_carriers(cells: Sequence[Cell], by_lines: Collection[str] | None) -> dict[str, frozenset[Hashable]]:
    """Cell id -> what it alone carries, for each of ``cells`` that alone carries something: by
    a coverage map's lines where there is one (``by_lines``: the ids that alone ran some line),
    else by ``carries_of`` and ``contract_of``."""
    if by_lines is not None:
        return {c.id: frozenset({("sole carrier", c.id)}) for c in cells if c.id in by_lines}
    carried = {c.id: carries_of(c) | contract_of(c) for c in cells}
    counts = collections.Counter(item for c in cells for item in carried[c.id])
    alone = {c.id: frozenset(i for i in carried[c.id] if counts[i] == 1) for c in cells}
    return {cell: items for cell, items in alone.items() if items}


def contract_of(cell: Cell) -> frozenset[Hashable]:
    """The items of ci's coverage contract ``cell`` meets (none for a simulated one, which
    checks no numerics and no state dict: the contract counts real cells only)."""
    return frozenset() if cell.simulated else items_of(cell.__dict__)


def _greedy(
    cells: Sequence[Cell],
    meets: Callable[[Cell], frozenset[Hashable]],
    seconds: Seconds,
    after: Cell | None = None,
) -> list[Cell]:
    """Cells in turn, each the one that meets the most not-yet-met things per expected second,
    a change of world charged WORLD_START_S (ties: the profile's order), until no cell meets
    anything new.

    Lazy: the heap holds each cell's gain per second without the world's start, as it was
    when last computed: a bound, since gains only shrink as cells are taken. A step pops
    cells until the best score found beats every bound left."""
    met: set[Hashable] = set()
    cost = [max(seconds(c), 1e-3) for c in cells]
    # a first bound: all of a cell's things, counted without keeping them (full's cells
    # would hold gigabytes of them); each is counted again only when it reaches the top
    heap = [(-len(meets(c)) / cost[i], i) for i, c in enumerate(cells)]
    heapq.heapify(heap)
    taken: list[Cell] = []
    last = after
    while heap:
        best, best_i, best_own, popped = 0.0, -1, frozenset(), []
        while heap and -heap[0][0] > best:
            _, i = heapq.heappop(heap)
            own = meets(cells[i])
            gain = len(own - met)
            start = WORLD_START_S if last is not None and world_of(cells[i]) != world_of(last) else 0.0
            popped.append((-gain / cost[i], i))
            if gain / (cost[i] + start) > best:
                best, best_i, best_own = gain / (cost[i] + start), i, own
        for entry in popped:
            if entry[1] != best_i:
                heapq.heappush(heap, entry)
        if best_i < 0:  # nothing left meets anything new
            break
        taken.append(cells[best_i])
        met |= best_own
        last = cells[best_i]
    return taken


def early_verdict(
    cells: Sequence[Cell],
    seconds: Seconds,
    failed_before: Collection[str] = (),
    sole_carriers: Collection[str] | None = None,
) -> Order:
    """``cells`` (a profile's, in its own order) in the early-verdict order; ``seconds``: each
    cell's expected cost; ``failed_before``: ids an earlier report saw fail or err;
    ``sole_carriers``: ids a coverage map says alone ran some line of Thunder (None: no map, the
    cells that alone carry a feature under a family and an init stand for them)."""
    history = sorted((c for c in cells if c.id in failed_before), key=seconds)
    rest = [c for c in cells if c.id not in failed_before]
    sole = _sole_carriers(rest, sole_carriers)
    # the greedy's own order, not cheapest first: sorted by cost the costliest sole carriers
    # (a simulated world's) came last (docs/measurements.md, session 41)
    prefix = _greedy(rest, lambda c: values_of(c) | sole.get(c.id, frozenset()), seconds)
    taken = [*history, *prefix]
    contract = _greedy(_left(rest, taken), contract_of, seconds, taken[-1] if taken else None)
    taken += contract
    after = taken[-1] if taken else None
    tail = _greedy(_left(rest, taken), combinations_of, seconds, after) if len(rest) <= GREEDY_LIMIT else []
    tail += _left(rest, [*taken, *tail])  # nothing new to meet: the profile's order
    main = _mainworld_of(cells)
    # each stage with every other world's cells as one block, then small worlds whole over the run
    stages = [
        _in_blocks(stage, {block_world(c, main) for c in stage} - {main}, main)
        for stage in (history, prefix, contract, tail)
    ]
    staged = [c for stage in stages for c in stage]
    run = _in_blocks(staged, _small_worlds(staged, main, seconds), main)
    # each stage ends where its last cell now is (small worlds' cells pulled forward count in it)
    where = {c.id: i for i, c in enumerate(run)}
    ends = [max((where[c.id] + 1 for c in stage), default=0) for stage in stages[:3]]
    ends = list(itertools.accumulate(ends, max))
    return Order(tuple(run), ends[0], ends[1] - ends[0], ends[2] - ends[1])


def arranged(
    cells: Sequence[Cell],
    mode: str,
    measured: Mapping[str, float],
    failed_before: Collection[str],
    sole_carriers: Collection[str] | None = None,
) -> Order:
    """``cells`` in the order ``mode`` names (``ORDERS``): generation keeps theirs; the early
    verdict costs each cell what ``measured`` (a baseline's times) says, else what it expects,
    and takes ``sole_carriers`` (a coverage map's) in its prefix."""
    if mode == "generation":
        return Order(tuple(cells), 0, 0, 0)
    return early_verdict(cells, lambda c: measured.get(c.id, expected_seconds(c)), failed_before, sole_carriers)


def _left(cells: Sequence[Cell], taken: Sequence[Cell]) -> list[Cell]:
    chosen = {c.id for c in taken}
    return [c for c in cells if c.id not in chosen]


def _mainworld_of(cells: Sequence[Cell]) -> tuple[int, bool] | None:
    """The world most cells need (the session's); ties: the first cell's."""
    counts: dict[tuple[int, bool], int] = {}
    for c in cells:
        counts[world_of(c)] = counts.get(world_of(c), 0) + 1
    return max(counts, key=lambda w: (counts[w], w == world_of(cells[0]))) if counts else None


def _in_blocks(
    cells: Sequence[Cell], worlds: Collection[tuple[int, bool]], main: tuple[int, bool] | None
) -> list[Cell]:
    """``cells`` with those of each world in ``worlds`` as one block where the first of them
    falls: such a world then starts once in ``cells`` and is done (a run keeps one idle world,
    ``--max-idle-worlds 1``: the main one waits meanwhile), instead of starting again each
    time the order comes back to it. A resharded resume goes in the block of its world that
    is not ``main`` (``resharded.block_world``)."""
    out: list[Cell] = []
    placed: set[tuple[int, bool]] = set()
    for c in cells:
        world = block_world(c, main)
        if world not in worlds:
            out.append(c)
        elif world not in placed:
            placed.add(world)
            out += [d for d in cells if block_world(d, main) == world]
    return out


# a world other than the main one whose cells together expect at most this share of the run
# runs whole where its first cell falls: it then starts once, where the stages would start it
# again each, pulling no more than this much ahead of the main world's cells (ci 2026-11-30:
# the world of 3 ranks 7.1% with tensor parallelism's and the resharded resumes, of 4 1.3%,
# the simulated one 9.7%; 5% until then)
SMALL_WORLD_SHARE = 0.1


def _small_worlds(run: Sequence[Cell], main: tuple[int, bool] | None, seconds: Seconds) -> set[tuple[int, bool]]:
    per_world: dict[tuple[int, bool], float] = {}
    for c in run:
        world = block_world(c, main)
        per_world[world] = per_world.get(world, 0.0) + seconds(c)
    total = sum(per_world.values()) or 1.0
    return {w for w, s in per_world.items() if w != main and s <= SMALL_WORLD_SHARE * total}


def met_by(cells: Iterable[Cell]) -> frozenset[Hashable]:
    """Everything the prefix must meet that ``cells`` meet."""
    return frozenset().union(*(values_of(c) for c in cells))
