"""Hypothesis profiles for the generated cells (conformance/test_generated.py); hypothesis's
own ``--hypothesis-profile`` picks one, ``ci`` unless told."""

from __future__ import annotations

from hypothesis import HealthCheck, Phase, settings

_QUIET = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large]
# ci never shrinks: under a bug that fails every cell, shrinking reruns a failing generated
# model cell by cell, which costs more than the clean run; the failing example prints its
# one-line replay instead. dev and nightly shrink, bounded by hypothesis (5 minutes a test).
_NO_SHRINK = (Phase.explicit, Phase.reuse, Phase.generate)


def register() -> None:
    """Register dev, ci and nightly, and load ci."""
    settings.register_profile("dev", max_examples=10, deadline=None, suppress_health_check=_QUIET)
    settings.register_profile(
        "ci", max_examples=6, derandomize=True, deadline=None, suppress_health_check=_QUIET, phases=_NO_SHRINK
    )
    settings.register_profile("nightly", max_examples=200, deadline=None, suppress_health_check=_QUIET)
    settings.load_profile("ci")
