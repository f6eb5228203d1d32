"""Plausible ways a Thunder could assign shard slots to ranks wrongly: each a permutation
``slot_of[r]`` of a world's N ranks. The sampled ranks of a simulated world
(``conformance.matrix.simulated.sampled_ranks``) are held to be moved by every one of them
that is not the identity (tests/unit/test_scale.py), and a planted bug hands out slots in
decimal string order (tests/planted/sharding.py)."""

from __future__ import annotations

import math
from collections.abc import Iterator


def sorted_order(world_size: int, key) -> list[int]:
    """``slot_of`` when slots are handed out in the order ``key`` sorts the ranks."""
    slot_of = [0] * world_size
    for slot, r in enumerate(sorted(range(world_size), key=key)):
        slot_of[r] = slot
    return slot_of


def decimal_order(world_size: int) -> list[int]:
    """Slots in the string order of the rank numbers ("0" < "1" < "10" < "100" < … < "2"), as
    when they come from sorted store keys: the identity up to 10 ranks."""
    return sorted_order(world_size, str)


def family(world_size: int) -> Iterator[tuple[str, list[int]]]:
    """Every permutation of the family at ``world_size``, named."""
    n = world_size
    yield "decimal string order", decimal_order(n)
    yield "binary string order", sorted_order(n, lambda r: format(r, "b"))
    yield "reversal", [n - 1 - r for r in range(n)]
    for k in sorted({1, 2, n // 2, n - 1} - {0, n}):
        yield f"rotation by {k}", [(r + k) % n for r in range(n)]
    yield "even ranks first", [r // 2 if r % 2 == 0 else (n + 1) // 2 + r // 2 for r in range(n)]
    if n & (n - 1) == 0:
        bits = n.bit_length() - 1
        yield "bit reversal", [int(format(r, f"0{bits}b")[::-1], 2) if bits else 0 for r in range(n)]
    for a in range(2, n):
        if math.gcd(a, n) == 1:
            yield f"stride {a}", [a * r % n for r in range(n)]
    for rows in range(2, n):
        if n % rows == 0:
            cols = n // rows
            yield f"{rows}x{cols} mesh transposed", [(r % cols) * rows + r // cols for r in range(n)]
