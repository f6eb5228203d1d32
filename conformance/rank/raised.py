"""What the Thunder under test raised inside a call that a user makes of PyTorch (DCP's state
dict functions over a model holding ThunderModules), named for a finding rather than raised:
the cell's other judgments stand."""

from __future__ import annotations

import traceback


def named(exc: BaseException) -> str:
    """``Kind at file:line in function: message``, at the innermost frame in Thunder's code
    (the innermost of all where none is Thunder's)."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = next((f for f in reversed(frames) if "/thunder/" in f.filename), frames[-1] if frames else None)
    at = f" at {where.filename.rsplit('/site-packages/', 1)[-1]}:{where.lineno} in {where.name}" if where else ""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}{at}: {first}"


def origin(exc: BaseException) -> str:
    """The package whose code raised ``exc``: its innermost Python frame's (``torch``,
    ``thunder``, ``builtins`` where no frame was recorded). An xfails entry pins it beside the
    kind, so that a raise Thunder's own code makes is not taken for the pin's raise inside
    torch (get_model_state_dict's CUDA mesh on a gloo world)."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "builtins"
    path = frames[-1].filename.replace("\\", "/")
    if "/site-packages/" in path:
        return path.rsplit("/site-packages/", 1)[-1].split("/", 1)[0].removesuffix(".py")
    parts = path.split("/")
    for package in ("thunder", "torch"):  # a source checkout: the innermost directory named so
        if package in parts[:-1]:
            return package
    return parts[-1].removesuffix(".py")
