"""Export models that use mmpos encoders: ``torch.export`` and ONNX, with clear errors.

:func:`export` is :func:`torch.export.export`, :func:`to_onnx` is
``torch.onnx.export(..., dynamo=True)``; both behave exactly as torch's functions, except
that when an export with ``dynamic_shapes`` fails and the model holds encoders that need a
static token grid (:func:`static_grid_encoders`), the error names them and says why.

What is dynamic (``docs/export.md``): an encoder that reads coordinates as tensors
(every rotary encoder, ``sincos``, ``fourier``, ``fuzzy``) and the ``peg`` / ``peg3d``
convolutions allow a dynamic token dimension -- a dynamic image size too when the grid
comes from the image shape (:class:`mmpos.nn.VisionTransformer`). Two encoders choose
tensors by the grid size in Python and need static token shapes (a dynamic batch is fine):

* ``irpe`` (and its presets): bucket ids are built from the grid ``(h, w)``;
* ``learned``: the table is used as is on the training grid and resampled otherwise.

Shapes: whatever the model takes; nothing here changes the model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from .encoders.irpe import IRPE
from .encoders.learned import LearnedPositionEmbedding

__all__ = ["STATIC_GRID", "export", "static_grid_encoders", "to_onnx"]

#: encoder classes that need static token shapes, and why
STATIC_GRID: dict[type, str] = {
    IRPE: "builds its bucket ids from the token grid size in Python",
    LearnedPositionEmbedding: "picks or resamples its table by the token grid size in Python",
}


def static_grid_encoders(model: nn.Module) -> dict[str, str]:
    """``{submodule name: reason}`` for every encoder in ``model`` that needs static token shapes."""
    return {
        name or type(model).__name__: STATIC_GRID[type(m)]
        for name, m in model.named_modules()
        if type(m) in STATIC_GRID
    }


def _explain(model: nn.Module, error: Exception) -> Exception:
    static = static_grid_encoders(model)
    if not static:
        return error
    names = "; ".join(f"{name} ({type(model.get_submodule(name)).__name__}) {why}" for name, why in static.items())
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return ValueError(
        f"export with dynamic_shapes failed; these encoders need static token shapes: {names}. Export with "
        f"a fixed token grid (dynamic batch only), or use an encoder that reads coordinates (rotary, sincos, "
        f"fourier, fuzzy, peg). torch said: {first}"
    )


def export(
    model: nn.Module,
    args: tuple,
    kwargs: dict[str, Any] | None = None,
    *,
    dynamic_shapes: Any = None,
    **options: Any,
) -> torch.export.ExportedProgram:
    """:func:`torch.export.export`, naming the encoders that need static shapes when a dynamic export fails."""
    try:
        return torch.export.export(model, args, kwargs, dynamic_shapes=dynamic_shapes, **options)
    except Exception as e:
        if dynamic_shapes is None:
            raise
        raise _explain(model, e) from e


def to_onnx(
    model: nn.Module,
    args: tuple,
    path: str | Path | None = None,
    *,
    dynamic_shapes: Any = None,
    **options: Any,
):
    """``torch.onnx.export(model, args, path, dynamic_shapes=..., dynamo=True)``; returns the ``ONNXProgram``.

    Needs the ``export`` extra (onnx, onnxscript; onnxruntime to run the result).
    """
    try:
        return torch.onnx.export(model, args, path, dynamic_shapes=dynamic_shapes, dynamo=True, **options)
    except Exception as e:
        if dynamic_shapes is None:
            raise
        raise _explain(model, e) from e
