"""Export models that use mmpos encoders: ``torch.export`` and ONNX, with clear errors.

:func:`export` is :func:`torch.export.export`, :func:`to_onnx` is
``torch.onnx.export(..., dynamo=True)``; both behave as torch's functions, except that with
``dynamic_shapes`` an export that fails, or that fixes a size asked to be dynamic (torch keeps
such a size in a run-time guard, which the ONNX exporter drops), raises a ``ValueError`` naming
the encoders that need a static token grid (:func:`static_grid_encoders`) and why.

What is dynamic (``docs/export.md``): an encoder that reads coordinates as tensors
(every rotary encoder, ``sincos``, ``fourier``, ``fuzzy``) and the ``peg`` / ``peg3d``
convolutions allow a dynamic token dimension -- a dynamic image size too when the grid
comes from the image shape (:class:`mmpos.nn.VisionTransformer`). Encoders that choose
tensors by the grid size in Python say so in their registry record
(:attr:`mmpos.EncoderInfo.static_grid`) and need static token shapes (a dynamic batch is fine):

* ``irpe`` (and its presets): bucket ids are built from the grid ``(h, w)``;
* ``learned``: the table is used as is on the training grid and resampled otherwise.

Shapes: whatever the model takes; nothing here changes the model.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .encoders.registry import info_of

__all__ = ["export", "static_grid_encoders", "to_onnx"]


def static_grid_encoders(model: nn.Module) -> dict[str, str]:
    """``{submodule name: reason}`` for every encoder in ``model`` that needs static token shapes.

    The reason is the encoder's record (:attr:`mmpos.EncoderInfo.static_grid`).
    """
    found = {}
    for name, module in model.named_modules():
        info = info_of(module)
        if info is not None and info.static_grid:
            found[name or type(model).__name__] = info.static_grid
    return found


def _explain(model: nn.Module, what: str) -> ValueError:
    static = static_grid_encoders(model)
    if not static:
        return ValueError(f"export with dynamic_shapes failed: {what}")
    names = "; ".join(f"{name} ({type(model.get_submodule(name)).__name__}) {why}" for name, why in static.items())
    return ValueError(
        f"export with dynamic_shapes failed; these encoders need static token shapes: {names}. Export with "
        f"a fixed token grid (dynamic batch only), or use an encoder that reads coordinates (rotary, sincos, "
        f"fourier, fuzzy, peg). torch: {what}"
    )


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _tensor_specs(value: Any, spec: Any) -> list:
    """The per-tensor specs of one input, in the order its tensors are flattened: a pytree input
    (a ``Coords``, a tuple, a dict) takes one spec per child, as ``torch.export`` reads it."""
    from torch.utils import _pytree as pytree

    if isinstance(value, torch.Tensor):
        return [spec]
    node = pytree._get_node_type(value)
    if value is None or node not in pytree.SUPPORTED_NODES:
        return []
    children, context = pytree.SUPPORTED_NODES[node].flatten_fn(value)
    if spec is None:
        specs = [None] * len(children)
    elif isinstance(value, dict):
        specs = [spec.get(k) for k in context]
    else:
        specs = list(spec)
    return [s for child, child_spec in zip(children, specs) for s in _tensor_specs(child, child_spec)]


def _specialized(program: torch.export.ExportedProgram, dynamic_shapes: Any) -> list[str]:
    """Input dimensions asked to be dynamic that the program fixed to the example's size."""
    values = {n.name: n.meta.get("val") for n in program.graph.nodes if n.op == "placeholder"}
    names = list(program.graph_signature.user_inputs)
    if isinstance(dynamic_shapes, dict):
        specs = [(name, dynamic_shapes.get(name)) for name in names]
    else:  # a Coords input (a pytree node) is several tensor inputs: coords_pos, coords_mask, ...
        args = program.example_inputs[0] if program.example_inputs else ()
        flat = [s for a, spec in zip(args, dynamic_shapes) for s in _tensor_specs(a, spec)]
        tensors = [n for n in names if isinstance(values.get(n), torch.Tensor)]
        specs = list(zip(tensors, flat)) if len(flat) == len(tensors) else list(zip(names, dynamic_shapes))
    fixed = []
    for name, spec in specs:
        if not spec or not isinstance(values.get(name), torch.Tensor):
            continue
        dims = spec.keys() if isinstance(spec, dict) else [i for i, d in enumerate(spec) if d is not None]
        shape = values[name].shape
        fixed += [f"{name}.shape[{d}] = {shape[d]}" for d in dims if not isinstance(shape[d], torch.SymInt)]
    return fixed


def _pinned(program: torch.export.ExportedProgram) -> list[str]:
    """Input-shape guards that pin a size to a constant (``(L['x'].size()[2] // 4) == 4``).

    torch keeps them in the private ``ExportedProgram._guards_code`` (checked by ``module()``, not
    by the range constraints, and not exported to ONNX); divisibility guards (``% 4 == 0``) are kept.
    """
    guards = getattr(program, "_guards_code", None) or []
    return [g for g in guards if "size()" in g and "%" not in g and re.search(r"\) == \d+$", g)]


def _check(model: nn.Module, program: torch.export.ExportedProgram, dynamic_shapes: Any) -> None:
    fixed = _specialized(program, dynamic_shapes) + _pinned(program)[:2]
    if fixed:
        raise _explain(model, f"sizes asked to be dynamic were fixed to the example's: {'; '.join(fixed)}")


def export(
    model: nn.Module,
    args: tuple,
    kwargs: dict[str, Any] | None = None,
    *,
    dynamic_shapes: Any = None,
    **options: Any,
) -> torch.export.ExportedProgram:
    """:func:`torch.export.export`; with ``dynamic_shapes``, a ``ValueError`` naming the encoders that need
    static shapes when the export fails or fixes a dimension asked to be dynamic (torch turns a
    violated derived dimension, e.g. ``4 * Dim("h")``, into a run-time guard instead of an error)."""
    try:
        program = torch.export.export(model, args, kwargs, dynamic_shapes=dynamic_shapes, **options)
    except Exception as e:
        if dynamic_shapes is None:
            raise
        raise _explain(model, _first_line(e)) from e
    if dynamic_shapes is not None:
        _check(model, program, dynamic_shapes)
    return program


def to_onnx(
    model: nn.Module,
    args: tuple,
    path: str | Path | None = None,
    *,
    dynamic_shapes: Any = None,
    **options: Any,
):
    """``torch.onnx.export(model, args, path, dynamic_shapes=..., dynamo=True)``; returns the ``ONNXProgram``.

    Needs the ``export`` extra (onnx, onnxscript; onnxruntime to run the result). With
    ``dynamic_shapes`` the model goes through :func:`export` first (same errors) and the checked
    program to the ONNX exporter: torch's ONNX exporter (2.14) does not refuse a size that the
    export pinned, it writes a graph that fails in onnxruntime at any other size.
    """
    if dynamic_shapes is None:
        return torch.onnx.export(model, args, path, dynamo=True, **options)
    program = export(model, args, dynamic_shapes=dynamic_shapes)
    return torch.onnx.export(program, args, path, dynamo=True, **options)
