"""The task a wrapping task runs (``--thunder-coverage``'s tracer, ``--chaos``'s fault): named
as the controller names every task, ``"package.module:function"``, and called as the rank
loop calls one (conformance/world/rankloop.py, which the rank side does not import)."""

from __future__ import annotations

import importlib
from typing import Any


def call(fn: str, kwargs: dict[str, Any]) -> Any:
    module_name, _, attr = fn.partition(":")
    return getattr(importlib.import_module(module_name), attr)(**kwargs)
