"""A hostile Thunder for the kit's own tests: a real Thunder module seen through a proxy that
makes one thing the rank side reads of it wrong in one way (tests/unit/test_hostile_thunder.py).

A ``Wrong`` names the place (a parameter, its gradient, a buffer, an entry of a state dict,
the forward's output), the name there and the way: on the meta device, another dtype, another
shape, a NaN or an inf among the values, absent (a gradient that is None, a key that is
missing), an entry the eager model does not have, or a tensor whose every torch op raises.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

# place -> the ways it can be wrong (a state dict's entry can also be one too many)
PLACES: dict[str, tuple[str, ...]] = {
    "parameter": ("meta", "float64", "short", "flat", "nan", "inf", "missing", "raise"),
    "gradient": ("meta", "float64", "short", "flat", "nan", "inf", "none", "raise"),
    "buffer": ("meta", "float64", "short", "nan", "missing", "extra", "raise"),
    "original_state_dict": ("meta", "float64", "short", "nan", "missing", "extra", "raise"),
    # what thunder.distributed.checkpoint.get_model_state_dict returns (``checkpoint_wrong``)
    "checkpoint": ("meta", "float64", "short", "nan", "missing", "extra", "raise"),
    "output": ("meta", "float64", "short", "flat", "nan", "inf", "raise"),
    # Thunder's record of what it ran: none kept, or one with no bound symbols (``stripped``)
    "trace": ("missing", "stripped"),
}
TRACE_GETTERS = {"forward": "last_traces", "backward": "last_backward_traces"}
EXTRA = "stray_tensor_thunder_added"


@dataclasses.dataclass(frozen=True)
class Wrong:
    place: str
    name: str  # the parameter's, buffer's or entry's name ("" for the output)
    way: str


# what a tensor says of itself without computing: Raising answers these
_METADATA = {
    "__get__",
    "__repr__",
    "__format__",
    "dim",
    "size",
    "numel",
    "stride",
    "element_size",
    "__len__",
    "is_floating_point",
    "is_complex",
}


class Raising(torch.Tensor):
    """A tensor every torch op on whose values raises, as one Thunder made wrong would (its
    shape, dtype and device can still be asked)."""

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = getattr(func, "__name__", str(func))
        if name in _METADATA:
            return super().__torch_function__(func, types, args, kwargs or {})
        raise RuntimeError(f"planted: a torch op on a tensor Thunder returned raised ({name})")


def corrupt(t: torch.Tensor, way: str) -> Any:
    """``t`` made wrong in ``way`` (a new tensor; ``t`` is left alone)."""
    t = t.detach()
    if way == "meta":
        return torch.empty_like(t, device="meta")
    if way == "float64":
        return t.to(torch.float64 if t.dtype != torch.float64 else torch.float32).clone()
    if way == "short":  # one row (or element) fewer
        return t[:-1].clone() if t.dim() else t.reshape(1).clone()
    if way == "flat":
        return t.reshape(-1).clone() if t.dim() != 1 else t.reshape(1, -1).clone()
    if way in ("nan", "inf"):
        bad = t.clone()
        if bad.is_floating_point() and bad.numel():
            bad.view(-1)[0] = float(way)
        return bad
    if way == "raise":
        return t.clone().as_subclass(Raising)
    return None  # "none", "missing": absent


@contextlib.contextmanager
def traces_wrong(wrong: Wrong) -> Iterator[None]:
    """Thunder's record of the ``wrong.name`` trace made wrong while the block runs."""
    import pytest
    import thunder
    from thunder.core.trace import from_trace

    getter = TRACE_GETTERS[wrong.name]
    real = getattr(thunder, getter)

    def recorded(module: Any) -> list[Any]:
        kept = real(module)
        return [] if wrong.way == "missing" else [from_trace(kept[-1])]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(thunder, getter, recorded)
        yield


@contextlib.contextmanager
def checkpoint_wrong(hostile: Hostile) -> Iterator[None]:
    """``get_model_state_dict`` of ``hostile``'s module made wrong while the block runs (every
    checkpoint the resume scenario takes, ``rank0_only`` included); where the real one raises
    (an FSDP module's on CPU), it still raises."""
    import pytest
    from thunder.distributed import checkpoint

    real = checkpoint.get_model_state_dict

    def taken(module: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return hostile._entries("checkpoint", real(hostile._tm, *args, **kwargs))

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(checkpoint, "get_model_state_dict", taken)
        yield


class _Held:
    """A parameter as the proxy hands it out: its gradient replaced."""

    def __init__(self, param: nn.Parameter, grad: Any) -> None:
        self._param, self.grad = param, grad

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._param, attr)


class Hostile:
    """``tm`` with ``wrong`` applied to whatever the rank side reads of it; all else is
    ``tm``'s own."""

    def __init__(self, tm: Any, wrong: Wrong) -> None:
        self._tm, self._wrong = tm, wrong

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._tm, attr)

    def _hit(self, place: str, name: str) -> bool:
        return self._wrong.place == place and self._wrong.name == name

    def _parameter(self, name: str, p: Any) -> Any:
        if self._hit("parameter", name):
            return corrupt(p, self._wrong.way)
        if self._hit("gradient", name):
            return _Held(p, None if p.grad is None else corrupt(p.grad, self._wrong.way))
        return p

    def named_parameters(self, *args: Any, **kwargs: Any) -> Iterator[tuple[str, Any]]:
        for n, p in self._tm.named_parameters(*args, **kwargs):
            if not (self._hit("parameter", n) and self._wrong.way == "missing"):
                yield n, self._parameter(n, p)

    def parameters(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
        return (p for _, p in self.named_parameters(*args, **kwargs))

    def get_parameter(self, name: str) -> Any:
        if self._hit("parameter", name) and self._wrong.way == "missing":
            raise AttributeError(f"ThunderModule has no parameter `{name}`")
        return self._parameter(name, self._tm.get_parameter(name))

    def named_buffers(self, *args: Any, **kwargs: Any) -> Iterator[tuple[str, Any]]:
        yield from self._entries("buffer", dict(self._tm.named_buffers(*args, **kwargs))).items()

    def original_state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return self._entries("original_state_dict", self._tm.original_state_dict(*args, **kwargs))

    def _entries(self, place: str, entries: dict[str, Any]) -> dict[str, Any]:
        if self._wrong.place != place:
            return entries
        out = dict(entries)
        if self._wrong.way == "extra":
            some = next(iter(out.values()), torch.zeros(1))
            out[EXTRA] = torch.zeros_like(some)
        elif self._wrong.name in out:
            wrong = corrupt(out[self._wrong.name], self._wrong.way)
            if wrong is None:
                del out[self._wrong.name]
            else:
                out[self._wrong.name] = wrong
        return out

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        out = self._tm(*args, **kwargs)
        return corrupt(out, self._wrong.way) if self._wrong.place == "output" else out
