"""Token coordinates shared by every encoder.

A :class:`Coords` describes, for a batch of token sequences, where each token is:

* ``pos``      float ``(B, N, A)`` -- position of token ``n`` along axis ``a``
* ``axes``     names of the ``A`` axes, e.g. ``("h", "w")`` or ``("t", "h", "w")``
* ``mask``     bool ``(B, N)`` -- ``True`` for real tokens, ``False`` for padding
* ``num_prefix_tokens`` number of leading class/register tokens (timm's name); they carry no
  position (their ``pos`` rows are zero, so rotary encoders leave them unrotated)
* ``grid_shape`` the token grid after the prefix tokens, e.g. ``(14, 14)``; ``None`` when
  the tokens do not form one regular grid
* ``modality`` long ``(B, N)`` -- a :class:`Modality` code per token

Coordinates are data: build them once (in a data loader, or from static shapes)
and pass them through the model, so ``forward`` holds no data-dependent Python.

``Coords`` is a registered pytree node (``torch.utils._pytree``): its tensors ``pos``,
``mask``, ``modality`` are the children and ``axes``, ``num_prefix_tokens``, ``grid_shape``
the static context, so ``torch.export.export(model, (x, coords))``, ``torch.compile`` and
``torch.onnx.export(..., dynamo=True)`` take a ``Coords`` as an ordinary input (as transformers
passes ``position_ids``). ``dynamic_shapes`` for it is a list of three specs, one per child
(``[{0: b, 1: n}, None, None]``; ``None`` for a child that is ``None``).
"""

from __future__ import annotations

import enum
import json
import math
import warnings
from collections.abc import Sequence
from dataclasses import InitVar, dataclass, replace

import torch
from torch import Tensor

from ._validate import check_axes, check_finite, check_int

__all__ = ["Coords", "Modality"]


class Modality(enum.IntEnum):
    """Codes stored in :attr:`Coords.modality`."""

    TEXT = 0
    IMAGE = 1
    VIDEO = 2
    POINTS = 3
    SPECIAL = 4  # prefix tokens: class / register tokens
    AUDIO = 5  # audio tokens (Qwen-Omni): temporal positions only, the same on every axis


#: Largest integer below which every integer is exact, per half-precision dtype.
_HALF_EXACT = {torch.float16: 2048, torch.bfloat16: 256}
#: Most tokens a builder makes; beyond it (or int32 indexing) a clear error, before allocating.
_MAX_TOKENS = 2**31 - 1
#: Up to this many tokens more than a grid's are read as missing class / register tokens in error hints.
_MAX_HINTED_PREFIX = 16


#: Largest integer below which every integer is exact in float32; float64 holds them up to 2**53.
_FLOAT32_EXACT = 2**24
_warned_inexact: set[torch.dtype] = set()


def _position_dtype(dtype: torch.dtype | None, largest: float) -> torch.dtype:
    """The builders' dtype: float32 by default, float64 when positions pass float32's exact range (2**24).

    An explicit dtype that cannot hold ``largest`` exactly is kept, with a warning (once per dtype).
    """
    if dtype is None:
        return torch.float64 if largest > _FLOAT32_EXACT else torch.float32
    if dtype == torch.float32 and largest > _FLOAT32_EXACT:  # (half precision warns in Coords itself)
        _warn_inexact(dtype, largest)
    return dtype


def _warn_inexact(dtype: torch.dtype, largest: float) -> None:
    if dtype not in _warned_inexact:
        _warned_inexact.add(dtype)
        warnings.warn(
            f"positions up to {largest:.0f} in {dtype}: above {_FLOAT32_EXACT} (2**24) float32 cannot hold every "
            "integer, so neighbouring tokens share one position; build the coordinates in float64 "
            "(dtype=torch.float64, the builders' default for such positions)",
            stacklevel=4,
        )


def _half_warning(dtype: torch.dtype) -> str:
    return (
        f"coordinates in {dtype} hold integer positions exactly only up to {_HALF_EXACT[dtype]}; larger "
        "positions are rounded (several tokens share one position). Build coordinates in float32 "
        "(encoders compute their angles and tables in float32 anyway)."
    )


def _positive_sizes(sizes: Sequence[int], name: str) -> tuple[int, ...]:
    out = tuple(sizes)  # torch.SymInt too: a grid from a dynamic image size under torch.export
    if not out or any(not isinstance(s, (int, torch.SymInt)) or isinstance(s, bool) or s <= 0 for s in out):
        raise ValueError(f"{name} must be positive integers, got {sizes!r}")
    return out


@dataclass(frozen=True, eq=False)
class Coords:
    """Positions of the tokens of a batch; see the module docstring for the fields."""

    pos: Tensor
    axes: tuple[str, ...]
    mask: Tensor | None = None
    num_prefix_tokens: int = 0
    grid_shape: tuple[int, ...] | None = None
    modality: Tensor | None = None
    #: internal: ``True`` for coordinates derived from valid ones (or built finite), which skip the
    #: data-dependent finiteness check -- it synchronises with the device, and forward must not
    _trusted: InitVar[bool] = False

    def __post_init__(self, _trusted: bool) -> None:
        pos = self.pos
        if not isinstance(pos, Tensor) or pos.dim() != 3 or not pos.is_floating_point():
            got = tuple(pos.shape) if isinstance(pos, Tensor) else type(pos).__name__
            raise ValueError(f"pos must be a floating tensor of shape (B, N, A), got {got}")
        if pos.dtype in _HALF_EXACT and not torch.compiler.is_compiling():
            warnings.warn(_half_warning(pos.dtype), stacklevel=3)
        object.__setattr__(self, "axes", check_axes(self.axes, "axes"))  # distinct non-empty names, not a string
        if len(self.axes) != pos.shape[-1]:
            raise ValueError(f"axes must name the {pos.shape[-1]} position axes, got {self.axes!r}")
        b, n = pos.shape[:2]
        if self.mask is not None and (self.mask.dtype != torch.bool or tuple(self.mask.shape) != (b, n)):
            raise ValueError(
                f"mask must be a bool tensor of shape (B, N) = {(b, n)}, got {self.mask.dtype} {tuple(self.mask.shape)}"
            )
        if self.modality is not None and tuple(self.modality.shape) != (b, n):
            raise ValueError(f"modality must have shape (B, N) = {(b, n)}, got {tuple(self.modality.shape)}")
        p = check_int(self.num_prefix_tokens, f"num_prefix_tokens (N={n} tokens)", 0, high=n)
        if self.grid_shape is not None:
            grid = _positive_sizes(self.grid_shape, "grid_shape")
            object.__setattr__(self, "grid_shape", grid)
            if math.prod(grid) + p != n:
                raise ValueError(
                    f"grid_shape {grid} with num_prefix_tokens={p} describes {math.prod(grid) + p} tokens, "
                    f"but pos has N={n}"
                )
        checked = not _trusted and not torch.compiler.is_compiling() and pos.device.type != "meta"
        if checked and pos.numel():  # one host sync: builders and direct construction only
            largest = float(pos.abs().amax())  # NaN or inf when any position is
            if not math.isfinite(largest):
                raise ValueError("pos must be finite: found NaN or inf coordinates")
            if pos.dtype == torch.float32 and largest > _FLOAT32_EXACT:
                _warn_inexact(pos.dtype, largest)

    # ------------------------------------------------------------------ builders
    @classmethod
    def sequence(
        cls,
        n: int,
        batch: int = 1,
        start: float = 0,
        *,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> Coords:
        """1-D positions ``start, start+1, ...``: ``pos`` ``(batch, n, 1)``, axis ``"seq"``.

        ``dtype``: float32 by default, float64 when a position passes 2**24 (where float32 would
        merge neighbouring integers); an explicit float32 there warns once.
        """
        (n, batch) = _positive_sizes((n, batch), "n and batch")
        if n > _MAX_TOKENS:
            raise ValueError(f"n={n:,} tokens is more than the {_MAX_TOKENS:,} a Coords may hold")
        check_finite(start, "start")
        dtype = _position_dtype(dtype, max(abs(start), abs(start + n - 1)))
        pos = torch.arange(n, dtype=torch.float64, device=device).add_(start).to(dtype)  # one rounding, exact sum
        pos = pos.view(1, n, 1).expand(batch, n, 1)
        modality = torch.full((batch, n), int(Modality.TEXT), dtype=torch.long, device=device)
        return cls(pos, ("seq",), modality=modality, _trusted=True)

    @classmethod
    def grid(
        cls,
        *sizes: int,
        num_prefix_tokens: int = 0,
        axes: Sequence[str] | None = None,
        batch: int = 1,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> Coords:
        """Row-major grid positions (integer indices) after ``num_prefix_tokens`` position-less tokens.

        ``dtype``: float32 by default, float64 for an axis longer than 2**24 (exact integer indices).

        ``Coords.grid(h, w)`` gives axes ``("h", "w")``, ``Coords.grid(t, h, w)`` gives
        ``("t", "h", "w")``; ``pos`` is ``(batch, num_prefix_tokens + prod(sizes), len(sizes))``.
        ``Coords.grid(14, 14, num_prefix_tokens=1)``: a ViT's class token and 196 patches.
        """
        sizes = _positive_sizes(sizes, "sizes")
        if axes is not None:
            axes = check_axes(axes, "axes")  # a string "hw" is not two axis names
        if axes is None:
            defaults = {1: ("seq",), 2: ("h", "w"), 3: ("t", "h", "w")}
            if len(sizes) not in defaults:
                raise ValueError(f"axes must be given for a {len(sizes)}-D grid")
            axes = defaults[len(sizes)]
        if len(axes) != len(sizes):
            raise ValueError(f"axes must name the {len(sizes)} grid axes, got {tuple(axes)!r}")
        prefix = check_int(num_prefix_tokens, "num_prefix_tokens", 0)
        (batch,) = _positive_sizes((batch,), "batch")
        if math.prod(sizes) + prefix > _MAX_TOKENS:
            raise ValueError(
                f"sizes {sizes} with num_prefix_tokens={prefix} make {math.prod(sizes) + prefix:,} tokens, more than the "
                f"{_MAX_TOKENS:,} a Coords may hold"
            )
        if dtype is None and any(isinstance(s, torch.SymInt) for s in sizes):
            dtype = torch.float32  # a dynamic size under torch.export: no guard on its value
        dtype = _position_dtype(dtype, max(sizes) - 1)
        ranges = [torch.arange(s, dtype=dtype, device=device) for s in sizes]
        cells = torch.stack(torch.meshgrid(*ranges, indexing="ij"), dim=-1).reshape(-1, len(sizes))
        pos = torch.cat([cells.new_zeros(prefix, len(sizes)), cells], dim=0)
        n = pos.shape[0]
        kind = Modality.VIDEO if len(sizes) == 3 and axes[0] == "t" else Modality.IMAGE
        modality = torch.full((n,), int(kind), dtype=torch.long, device=device)
        modality[:prefix] = int(Modality.SPECIAL)
        return cls(
            pos.unsqueeze(0).expand(batch, n, len(sizes)),
            tuple(axes),
            num_prefix_tokens=prefix,
            grid_shape=sizes,
            modality=modality.unsqueeze(0).expand(batch, n),
            _trusted=True,  # integer cells: finite by construction (built in forward by vision models)
        )

    @classmethod
    def points(cls, xyz: Tensor, mask: Tensor | None = None, axes: Sequence[str] | None = None) -> Coords:
        """Free coordinates, e.g. a point cloud: ``xyz`` ``(B, N, A)`` or ``(N, A)``."""
        if not isinstance(xyz, Tensor) or xyz.dim() not in (2, 3):
            raise ValueError(f"xyz must be a tensor of shape (B, N, A) or (N, A), got {getattr(xyz, 'shape', xyz)}")
        if xyz.dim() == 2:
            xyz = xyz.unsqueeze(0)
            mask = None if mask is None else mask.reshape(1, -1)
        if not xyz.is_floating_point():
            xyz = xyz.float()
        if axes is None:
            axes = ("x", "y", "z")[: xyz.shape[-1]] if xyz.shape[-1] <= 3 else None
            if axes is None:
                raise ValueError(f"axes must be given for {xyz.shape[-1]}-D points")
        modality = torch.full(xyz.shape[:2], int(Modality.POINTS), dtype=torch.long, device=xyz.device)
        return cls(xyz, tuple(axes), mask=mask, modality=modality)

    @classmethod
    def stack(cls, items: Sequence[Coords], padding_side: str = "right") -> Coords:
        """Batch coordinates of different lengths; padding gets ``mask=False`` and ``pos=0``."""
        if padding_side not in ("right", "left"):
            raise ValueError(f"padding_side must be 'right' or 'left', got {padding_side!r}")
        if not items:
            raise ValueError("items must hold at least one Coords")
        axes = items[0].axes
        for c in items:
            if c.axes != axes:
                raise ValueError(f"all items must share axes {axes}, got {c.axes}")
            if c.num_prefix_tokens != items[0].num_prefix_tokens:
                raise ValueError(
                    f"all items must share num_prefix_tokens={items[0].num_prefix_tokens}, got {c.num_prefix_tokens}"
                )
        n = max(c.num_tokens for c in items)
        pos, mask, modality = [], [], []
        for c in items:
            pad = n - c.num_tokens
            where = (0, pad) if padding_side == "right" else (pad, 0)
            pos.append(torch.nn.functional.pad(c.pos, (0, 0) + where))
            mask.append(torch.nn.functional.pad(c.token_mask, where, value=False))
            mod = c.modality if c.modality is not None else torch.zeros_like(c.token_mask, dtype=torch.long)
            modality.append(torch.nn.functional.pad(mod, where, value=int(Modality.TEXT)))
        grids = {c.grid_shape for c in items}
        same = len(grids) == 1 and all(c.num_tokens == n for c in items)
        return cls(
            torch.cat(pos),
            axes,
            mask=torch.cat(mask),
            num_prefix_tokens=items[0].num_prefix_tokens if same or padding_side == "right" else 0,
            grid_shape=items[0].grid_shape if same else None,
            modality=torch.cat(modality),
            _trusted=True,  # valid items padded with zeros
        )

    # ------------------------------------------------------------------ views
    @property
    def batch_size(self) -> int:
        return self.pos.shape[0]

    @property
    def num_tokens(self) -> int:
        return self.pos.shape[1]

    @property
    def num_axes(self) -> int:
        return self.pos.shape[2]

    @property
    def token_mask(self) -> Tensor:
        """``(B, N)`` bool, ``True`` for real tokens (all ``True`` when ``mask`` is ``None``)."""
        if self.mask is None:
            return torch.ones(self.pos.shape[:2], dtype=torch.bool, device=self.pos.device)
        return self.mask

    def axis(self, name: str) -> int:
        """Index of axis ``name`` in ``pos``."""
        if name not in self.axes:
            raise ValueError(f"axis {name!r} is not one of {self.axes}")
        return self.axes.index(name)

    def select(self, *axes: str) -> Coords:
        """Keep only the named axes, in the given order.

        The tokens keep their order, so ``grid_shape`` survives only when all axes are kept in
        their order (a reordered grid is not row-major in the new axis order: ``None``).
        """
        idx = [self.axis(a) for a in axes]
        grid = self.grid_shape if idx == list(range(self.num_axes)) else None
        return replace(self, pos=self.pos[..., idx], axes=tuple(axes), grid_shape=grid, _trusted=True)

    def _per_axis(self, value: float | Sequence[float], name: str) -> Tensor:
        v = torch.as_tensor(value, dtype=self.pos.dtype)  # on the host: the check below reads it
        if v.dim() == 1 and v.shape[0] != self.num_axes:
            raise ValueError(f"{name} must be a scalar or hold one value per axis {self.axes}, got {tuple(value)}")
        if v.dim() > 1:
            raise ValueError(f"{name} must be a scalar or a 1-D sequence, got shape {tuple(v.shape)}")
        if not all(math.isfinite(x) for x in v.reshape(-1).tolist()):  # a Python value: checked on the host
            raise ValueError(f"{name} must be finite, got {value!r}")
        return v.to(self.pos.device)

    def positioned(self) -> Tensor:
        """``(1, N, 1)`` float, 0 on prefix tokens and 1 elsewhere."""
        keep = torch.ones(1, self.num_tokens, 1, dtype=self.pos.dtype, device=self.pos.device)
        keep[:, : self.num_prefix_tokens] = 0
        return keep

    def flattened(self) -> Coords:
        """1-D raster positions ``0 .. N - num_prefix_tokens - 1`` of the grid tokens (axis ``"seq"``).

        Lets a 1-D encoder (e.g. plain RoPE) read a 2-D / 3-D grid in flattened order.
        """
        if self.grid_shape is None:
            raise ValueError("flattened() needs grid coordinates (grid_shape is None)")
        n = self.num_tokens
        index = torch.arange(n, dtype=self.pos.dtype, device=self.pos.device) - self.num_prefix_tokens
        pos = (index.clamp(min=0).view(1, n, 1)).expand(self.batch_size, n, 1)
        return replace(self, pos=pos, axes=("seq",), grid_shape=(n - self.num_prefix_tokens,), _trusted=True)

    def scaled(self, factor: float | Sequence[float]) -> Coords:
        """Positions multiplied by ``factor`` (a scalar or one value per axis)."""
        return replace(self, pos=self.pos * self._per_axis(factor, "factor"), _trusted=True)

    def shifted(self, offset: float | Sequence[float]) -> Coords:
        """Positions plus ``offset`` (prefix tokens keep position 0)."""
        return replace(self, pos=self.pos + self._per_axis(offset, "offset") * self.positioned(), _trusted=True)

    def normalized(self) -> Coords:
        """Grid positions mapped to cell centres in [-1, 1]: ``(2 i + 1) / size - 1``.

        This is the ``align_corners=False`` convention of ``F.grid_sample``.
        """
        if self.grid_shape is None or len(self.grid_shape) != self.num_axes:
            raise ValueError(
                f"normalized() needs a grid with one size per axis; grid_shape={self.grid_shape}, axes={self.axes}"
            )
        size = torch.tensor(self.grid_shape, dtype=self.pos.dtype, device=self.pos.device)
        return replace(self, pos=((2 * self.pos + 1) / size - 1) * self.positioned(), _trusted=True)

    def to(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> Coords:
        """Move to ``device``; ``dtype`` (a floating type) applies to ``pos`` only."""
        if dtype is not None and not dtype.is_floating_point:
            raise ValueError(f"dtype must be a floating type, got {dtype}")
        return replace(
            self,
            pos=self.pos.to(device=device, dtype=dtype),
            mask=None if self.mask is None else self.mask.to(device),
            modality=None if self.modality is None else self.modality.to(device),
            _trusted=dtype is None,  # a device move keeps values; a narrower dtype may overflow to inf
        )

    def expand(self, batch: int) -> Coords:
        """The same coordinates for ``batch`` sequences (from a batch of 1, without a copy)."""
        if (
            isinstance(batch, bool)
            or not isinstance(batch, (int, torch.SymInt))
            or (isinstance(batch, int) and batch < 1)
        ):
            raise ValueError(f"expand() needs a positive int batch, got {batch!r}")  # 0 made an empty batch, -1 none
        if self.batch_size == batch:
            return self
        if self.batch_size != 1:
            raise ValueError(f"expand() needs batch size 1, got {self.batch_size} (target batch={batch})")
        n, a = self.num_tokens, self.num_axes
        return replace(
            self,
            pos=self.pos.expand(batch, n, a),
            mask=None if self.mask is None else self.mask.expand(batch, n),
            modality=None if self.modality is None else self.modality.expand(batch, n),
            _trusted=True,
        )

    def check_tokens(self, batch: int, tokens: int, name: str = "x", heads: int | None = None) -> None:
        """Raise ``ValueError`` unless these coordinates describe ``tokens`` tokens for ``batch`` sequences.

        ``heads``: the size of the dimension read as heads when ``name`` is ``(B, H, N, D)``. The
        message names the likely cause: class tokens the coordinates lack (``num_prefix_tokens``),
        or ``name`` given as ``(B, N, H, D)``.
        """
        if self.num_tokens != tokens or self.batch_size not in (1, batch):
            raise ValueError(
                f"coords describe {self.batch_size} x {self.num_tokens} tokens but {name} has "
                f"batch {batch} x {tokens} tokens (coords batch must be 1 or {batch})" + self._hint(tokens, name, heads)
            )

    def _hint(self, tokens: int, name: str, heads: int | None) -> str:
        """The likely cause of a token count ``tokens`` that differs from :attr:`num_tokens` (or ``""``)."""
        n, extra = self.num_tokens, tokens - self.num_tokens
        if heads is not None and heads == n and extra:
            return f"; {name} must be (B, H, N, D) but looks like (B, N, H, D) (N = {n} in dim 1): transpose(1, 2)"
        if self.grid_shape is not None and 0 < extra <= _MAX_HINTED_PREFIX:
            p = self.num_prefix_tokens + extra
            grid = ", ".join(str(s) for s in self.grid_shape)
            return (
                f"; N = {tokens} = {n} + {extra}: for {extra} class / register token(s) before the grid, "
                f"pass num_prefix_tokens={p} (Coords.grid({grid}, num_prefix_tokens={p}))"
            )
        return ""


# --------------------------------------------------------------------------- pytree node
_CHILDREN = ("pos", "mask", "modality")


def _flatten(c: Coords) -> tuple[list, tuple]:
    """Children: the tensors ``pos``, ``mask``, ``modality`` (the last two may be ``None``);
    context: the static fields."""
    return [c.pos, c.mask, c.modality], (c.axes, c.num_prefix_tokens, c.grid_shape)


def _unflatten(children, context) -> Coords:
    """Rebuild from the children of a valid ``Coords`` without re-validating: under tracing the
    checks would add guards on symbolic sizes (and the values came from a checked ``Coords``)."""
    pos, mask, modality = children
    axes, num_prefix_tokens, grid_shape = context
    out = object.__new__(Coords)
    for name, value in zip(
        ("pos", "axes", "mask", "num_prefix_tokens", "grid_shape", "modality"),
        (pos, axes, mask, num_prefix_tokens, grid_shape, modality),
    ):
        object.__setattr__(out, name, value)
    return out


def _dump_context(context: tuple) -> str:
    axes, num_prefix_tokens, grid_shape = context
    return json.dumps([list(axes), num_prefix_tokens, None if grid_shape is None else list(grid_shape)])


def _load_context(dumped: str) -> tuple:
    axes, num_prefix_tokens, grid_shape = json.loads(dumped)
    return tuple(axes), num_prefix_tokens, None if grid_shape is None else tuple(grid_shape)


def _register_pytree() -> None:
    """Register :class:`Coords` with torch's pytree (feature-detected: ``flatten_with_keys_fn``
    and ``GetAttrKey``, which ``torch.export`` uses for input names, exist from torch 2.3 on)."""
    import inspect

    from torch.utils import _pytree as pytree

    if Coords in pytree.SUPPORTED_NODES:
        return
    kwargs: dict = {
        "serialized_type_name": f"{Coords.__module__}.{Coords.__qualname__}",
        "to_dumpable_context": _dump_context,  # torch.export.save writes the context as JSON
        "from_dumpable_context": _load_context,
    }
    if "flatten_with_keys_fn" in inspect.signature(pytree.register_pytree_node).parameters and hasattr(
        pytree, "GetAttrKey"
    ):

        def flatten_with_keys(c: Coords):
            children, context = _flatten(c)
            return [(pytree.GetAttrKey(n), v) for n, v in zip(_CHILDREN, children)], context

        kwargs["flatten_with_keys_fn"] = flatten_with_keys
    pytree.register_pytree_node(Coords, _flatten, _unflatten, **kwargs)
    if hasattr(torch.serialization, "add_safe_globals"):  # torch.export.load reads example inputs weights-only
        torch.serialization.add_safe_globals([Coords])  # fields are tensors, tuples and ints: no code runs


_register_pytree()
