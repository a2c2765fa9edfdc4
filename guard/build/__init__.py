"""The guard's build recipe, one module per stage: :mod:`~guard.build.data` (with :mod:`~guard.build.prompts`,
:mod:`~guard.build.sources`, :mod:`~guard.build.generate`), :mod:`~guard.build.safeguard`, :mod:`~guard.build.sae`,
:mod:`~guard.build.encode`, :mod:`~guard.build.selection`, :mod:`~guard.build.calibration`, and
:mod:`~guard.build.pipeline`, which runs them in order.

Nothing heavy is imported here: ``from guard.build import build`` stays cheap until it is called."""

from __future__ import annotations

from typing import Any

__all__ = ["build"]


def build(*args: Any, **kwargs: Any) -> dict[str, Any]:
    """See :func:`guard.build.pipeline.build`."""
    from guard.build.pipeline import build as _build

    return _build(*args, **kwargs)
