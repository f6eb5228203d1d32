"""Bugs planted in Thunder's checkpoint module, caught on resharded resumes (a checkpoint saved
at one world size, resumed at another: conformance/matrix/resharded.py)."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any

import pytest

from tests.planted.cells import RESUME, Pred
from tests.planted.record import Expect, planted

RESHARDED: Pred = lambda cell: cell.saved_at is not None  # noqa: E731
TO_FEWER: Pred = lambda cell: RESHARDED(cell) and cell.saved_at > cell.world_size  # noqa: E731
TO_MORE: Pred = lambda cell: RESHARDED(cell) and cell.saved_at < cell.world_size  # noqa: E731
SAME_SIZE: Pred = lambda cell: RESUME(cell) and not RESHARDED(cell)  # noqa: E731


@planted(
    {"state_dict": Expect(TO_FEWER, words="full checkpoint after training | weights after loading")},
    cells=(TO_FEWER, TO_MORE, SAME_SIZE),
)
@contextlib.contextmanager
def load_reads_only_this_worlds_files() -> Iterator[None]:
    """``thunder.distributed.checkpoint.load`` reads the files of ranks below the loading
    world's size only, as if every checkpoint had been saved by the world that loads it: a
    checkpoint saved by more ranks loses what its last ranks wrote (torch's DCP spreads a full
    checkpoint's tensors over the saving ranks' files), and those tensors keep the values they
    had before loading. The same world, or a bigger one, reads every file."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from thunder.distributed import checkpoint

    class ThisWorldsFiles(dcp.FileSystemReader):
        def read_data(self, plan: Any, planner: Any) -> Any:
            world = dist.get_world_size()
            kept = [i for i in plan.items if _writer(self.storage_data[i.storage_index].relative_path) < world]
            return super().read_data(type(plan)(kept, plan.storage_data, plan.planner_data), planner)

    def load(module_state: dict[str, Any], path: Any, **kwargs: Any) -> None:
        dcp.load(module_state, storage_reader=ThisWorldsFiles(path), **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(checkpoint, "load", load)
        yield


def _writer(relative_path: str) -> int:
    """The saving rank of a DCP file (``__{rank}_{n}.distcp``)."""
    found = re.match(r"__(\d+)_", relative_path)
    assert found is not None, f"a DCP file not named by its rank: {relative_path}"
    return int(found.group(1))
