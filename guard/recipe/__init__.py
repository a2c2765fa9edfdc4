"""The guard's build recipe, one module per stage: :mod:`~guard.recipe.data` (with :mod:`~guard.recipe.prompts`,
:mod:`~guard.recipe.sources`, :mod:`~guard.recipe.generate`), :mod:`~guard.recipe.safeguard`, :mod:`~guard.recipe.sae`,
:mod:`~guard.recipe.encode`, :mod:`~guard.recipe.selection`, :mod:`~guard.recipe.calibration`, and
:mod:`~guard.recipe.pipeline`, which runs them in order.

Nothing heavy is imported here: ``from guard.recipe import build`` stays cheap until it is called."""

from __future__ import annotations

from typing import Any

__all__ = ["build"]


def build(*args: Any, **kwargs: Any) -> dict[str, Any]:
    """See :func:`guard.recipe.pipeline.build`."""
    from guard.recipe.pipeline import build as _build

    return _build(*args, **kwargs)
