"""JSON text every reader parses: a metric Thunder drove to NaN or infinity (a state dict of
NaN, a gradient that overflowed) is a finding, and Python's ``json`` would write it as the bare
``NaN``/``Infinity`` that browsers, ``jq`` and most languages refuse. Non-finite floats are
written as the strings ``"nan"``, ``"inf"`` and ``"-inf"``; ``float()`` reads each back."""

from __future__ import annotations

import json
import math
from typing import Any


def finite(value: Any) -> Any:
    """``value`` with every non-finite float, however deep in lists and dicts, as its string."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def dumps(value: Any, **options: Any) -> str:
    """``json.dumps`` of ``value`` that no strict parser refuses (``allow_nan=False`` keeps it so)."""
    return json.dumps(finite(value), allow_nan=False, **options)
