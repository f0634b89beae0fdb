"""``irpe``: image relative position encoding (iRPE), bias and contextual, on q, k and v.

Paper: Wu et al., "Rethinking and Improving Relative Position Encoding for Vision
Transformer", ICCV 2021, https://arxiv.org/abs/2107.14222. Reference: microsoft/Cream,
``iRPE/DeiT-with-iRPE/irpe.py`` (``piecewise_index``, ``_rp_2d_*``, ``get_bucket_ids_2d``,
``iRPE``, ``iRPE_Cross``, ``get_rpe_config``), ``rpe_vision_transformer.py``
(``RPEAttention``: how the terms enter attention) and ``rpe_models.py`` (the presets).

Every (query, key) pair of a 2-D token grid gets a bucket id from the offset
``pos_query - pos_key`` (row, column); a table holds one entry per bucket:

* ``bias`` mode: a scalar per bucket (and head), added to the logits;
* ``contextual`` mode on keys: ``s * q_i . r_k[b(i, j)]``; on queries:
  ``s * k_j . r_q[b(j, i)]``; on values: ``out_i += sum_j attn_ij r_v[b(i, j)]``,
  with ``s = head_dim ** -0.5`` as in the reference (it scales q before the lookup).

Contextual q/k terms are computed as ``z = x @ table`` ``(B, H, N, buckets)`` and a
gather, never an ``(N, N, D)`` tensor; the value term accumulates the attention weights
per bucket ``(B, H, N, buckets)`` (``scatter_add``) and multiplies with the table, never
an ``(H, N, N, D)`` tensor.

Shapes: q, k ``(B, H, N, D)``; tables ``(H', buckets)`` (bias), ``(H', D, buckets)``
(contextual q/k), ``(H', buckets, D)`` (v), ``H'`` = 1 when ``shared_head``; bucket ids
``(N, N)`` long (``(2, N, N)`` for ``cross``); ``bias`` -> ``(B or 1, H or 1, N, N)``;
``output`` -> ``(B, H, N, D)``.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from .._validate import check_bool, check_bytes, check_float, check_int, check_ints
from ..coords import Coords
from .base import BiasEncoder, resolve_head_dim
from .registry import register_encoder

__all__ = ["IRPE", "METHODS", "PRESETS", "bucket_ids", "num_buckets", "piecewise_index"]

METHODS = ("euc", "quant", "cross", "product")
_MODES = {"bias": "bias", "ctx": "contextual", "contextual": "contextual"}
_PAPER = "Wu et al. 2021, iRPE (arXiv:2107.14222)"
_REFERENCE = "microsoft/Cream iRPE/DeiT-with-iRPE/irpe.py (iRPE, get_bucket_ids_2d)"
_STATIC_GRID = "builds its bucket ids from the token grid size in Python"

# Presets of the reference (rpe_models.py, all shared_head=True, skip=1); the number in
# the reference names counts the buckets used on a 14 x 14 grid plus the class bucket.
PRESETS: dict[str, dict] = {
    "product-ctx-k": {"method": "product", "mode": "ctx", "ratio": 1.9, "rpe_on": "k"},  # ctx_product_50_shared_k
    "product-ctx-qk": {"method": "product", "mode": "ctx", "ratio": 1.9, "rpe_on": "qk"},  # ctx_product_50_shared_qk
    "product-ctx-qkv": {"method": "product", "mode": "ctx", "ratio": 1.9, "rpe_on": "qkv"},  # ctx_product_50_shared_qkv
    "euc-ctx-k": {"method": "euc", "mode": "ctx", "ratio": 20, "rpe_on": "k"},  # ctx_euc_20_shared_k
    "quant-ctx-k": {"method": "quant", "mode": "ctx", "ratio": 33, "rpe_on": "k"},  # ctx_quant_51_shared_k
    "cross-ctx-k": {"method": "cross", "mode": "ctx", "ratio": 20, "rpe_on": "k"},  # ctx_cross_56_shared_k
}


def _coefficients(ratio: float) -> tuple[float, float, float]:
    """``alpha, beta, gamma = ratio, 2 ratio, 8 ratio`` (reference ``get_single_rpe_config``)."""
    ratio = check_float(ratio, "ratio")  # positive and finite
    return 1 * ratio, 2 * ratio, 8 * ratio


def _check_method(method: str) -> str:
    if not isinstance(method, str) or method.lower() not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    return method.lower()


def piecewise_index(offset: Tensor, alpha: float, beta: float, gamma: float) -> Tensor:
    """Eq. (18): ``round(x)`` for ``|x| <= alpha``, log-spaced up to ``beta`` beyond.

    Computed as the reference does: the far branch in float32, rounded half to even,
    clipped at ``beta`` and truncated to an integer, so ids lie in ``[-int(beta), int(beta)]``.

    Args:
        offset: relative positions (long, or float), any shape.

    Returns:
        long tensor of the same shape.
    """
    magnitude = offset.abs()
    # the clamp only touches entries the near branch keeps (and keeps log() finite there)
    ramp = alpha + torch.log(magnitude.float().clamp(min=alpha) / alpha) / math.log(gamma / alpha) * (beta - alpha)
    far = (torch.sign(offset) * ramp.round().clip(max=beta)).long()
    near = offset.round().long() if offset.is_floating_point() else offset.long()
    return torch.where(magnitude > alpha, far, near)


def num_buckets(method: str, ratio: float, num_prefix_tokens: int = 0) -> int:
    """Table size: ``(2 int(beta) + 1) ** 2`` for ``product``, ``2 int(beta) + 1`` otherwise
    (per direction for ``cross``), plus one shared bucket when ``num_prefix_tokens > 0``."""
    method = _check_method(method)
    side = 2 * int(_coefficients(ratio)[1]) + 1
    return (side**2 if method == "product" else side) + (1 if num_prefix_tokens > 0 else 0)


def bucket_ids(grid_shape: Sequence[int], method: str, ratio: float, num_prefix_tokens: int = 0) -> tuple[Tensor, int]:
    """Bucket id of every (query, key) pair of ``num_prefix_tokens`` tokens followed by a row-major grid.

    Args:
        grid_shape: ``(H, W)`` of the token grid.
        method: ``"euc"`` (rounded Euclidean distance), ``"quant"`` (squared distance, as
            the reference code buckets it), ``"product"`` (row and column offsets, joint
            id) or ``"cross"`` (row and column offsets, separate tables).
        ratio: ``alpha = ratio``, ``beta = 2 ratio``, ``gamma = 8 ratio``.
        num_prefix_tokens: leading class/register tokens; all pairs touching one share the extra
            bucket id ``num_buckets - 1``.

    Returns:
        ``(ids, num_buckets)``: ids long ``(N, N)`` (``(2, N, N)`` rows then columns for
        ``cross``, each indexing its own table) in ``[0, num_buckets)``, ``N = num_prefix_tokens + H W``.
    """
    method = _check_method(method)
    alpha, beta, gamma = _coefficients(ratio)
    height, width = check_ints(grid_shape, "grid_shape (H, W)", length=2)
    prefix = check_int(num_prefix_tokens, "num_prefix_tokens", 0)
    n = prefix + height * width  # the (maps, N, N) int64 ids (their transient offsets are of the same order)
    check_bytes((2 if method == "cross" else 1) * n * n * 8, f"iRPE bucket ids of a {height} x {width} grid")
    rows = torch.arange(height).repeat_interleave(width)  # (L,) row of each grid token
    cols = torch.arange(width).repeat(height)
    d_row = rows[:, None] - rows[None, :]  # (L, L) query minus key
    d_col = cols[:, None] - cols[None, :]
    shift = int(beta)  # ids in [-shift, shift] move to [0, 2 shift]
    if method == "euc":
        ids = piecewise_index((d_row**2 + d_col**2).float().sqrt().round(), alpha, beta, gamma) + shift
    elif method == "quant":
        ids = piecewise_index(d_row**2 + d_col**2, alpha, beta, gamma) + shift
    elif method == "product":
        row_ids = piecewise_index(d_row, alpha, beta, gamma) + shift
        ids = row_ids * (2 * shift + 1) + piecewise_index(d_col, alpha, beta, gamma) + shift
    else:  # cross
        ids = torch.stack([piecewise_index(d, alpha, beta, gamma) + shift for d in (d_row, d_col)])
    size = num_buckets(method, ratio)
    if prefix:
        n = prefix + height * width
        full = ids.new_full((*ids.shape[:-2], n, n), size)  # the shared prefix bucket
        full[..., prefix:, prefix:] = ids
        ids, size = full, size + 1
    return ids, size


def _table_ids(method: str, ratio: float, table_size: int, grid: tuple[int, ...], prefix: int) -> Tensor:
    """``(maps, N, N)`` ids into a table of ``maps * table_size`` buckets (cross: rows, then columns)."""
    ids, size = bucket_ids(grid, method, ratio, prefix)
    if size > table_size:
        raise ValueError(
            f"coords have num_prefix_tokens={prefix} but this encoder was built with num_prefix_tokens=0 "
            "(no prefix bucket): pass num_prefix_tokens >= 1"
        )
    if method != "cross":
        return ids.unsqueeze(0)
    return ids + torch.tensor([0, table_size]).view(2, 1, 1)


class _BytesLRU:
    """Least-recently-used cache bounded by the bytes of the tensors it holds, not by their count.

    Ids of an ``N``-token grid take ``8 N^2`` bytes (134 MB for 64 x 64 + 1), so a count bound
    lets a few large grids fill the memory; a tensor larger than the whole budget is not kept.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes, self.bytes = max_bytes, 0
        self._items: OrderedDict[tuple, Tensor] = OrderedDict()

    def get(self, key: tuple, make: Callable[[], Tensor]) -> Tensor:
        if key in self._items:
            self._items.move_to_end(key)
            return self._items[key]
        value = make()
        size = value.numel() * value.element_size()
        if size <= self.max_bytes:
            self._items[key] = value
            self.bytes += size
            while self.bytes > self.max_bytes:
                _, old = self._items.popitem(last=False)
                self.bytes -= old.numel() * old.element_size()
        return value

    def clear(self) -> None:
        self._items.clear()
        self.bytes = 0


# Ids depend on static ints only: every layer (and encoder) with the same settings shares
# one tensor per device (never modified in place), within a budget of 256 MiB.
_ID_CACHE = _BytesLRU(256 * 2**20)


def _shared_table_ids(method: str, ratio: float, table_size: int, grid: tuple, prefix: int) -> Tensor:
    key = (method, ratio, table_size, grid, prefix, torch.device("cpu"))
    return _ID_CACHE.get(key, lambda: _table_ids(method, ratio, table_size, grid, prefix))


def _table_ids_on(method: str, ratio: float, table_size: int, grid: tuple, prefix: int, device: torch.device) -> Tensor:
    device = torch.device(device)
    if device.type == "cpu":
        return _shared_table_ids(method, ratio, table_size, grid, prefix)
    key = (method, ratio, table_size, grid, prefix, device)
    return _ID_CACHE.get(key, lambda: _shared_table_ids(method, ratio, table_size, grid, prefix).to(device))


@register_encoder("irpe", paper=_PAPER, reference=_REFERENCE, static_grid=_STATIC_GRID)
class IRPE(BiasEncoder):
    """Image relative position encoding on queries, keys and/or values.

    Args:
        dim: model width (with ``num_heads`` gives ``head_dim``), or pass ``head_dim``.
        num_heads: attention heads (needed for per-head tables).
        head_dim: channels per head ``D``.
        method: ``"product"`` (default), ``"euc"``, ``"quant"`` or ``"cross"``.
        mode: ``"ctx"`` / ``"contextual"`` (default) or ``"bias"``.
        ratio: bucket ratio (reference default 1.9: 7 x 7 product buckets).
        rpe_on: any of ``"q"``, ``"k"``, ``"v"`` (e.g. ``"qkv"``); ``v`` needs contextual mode.
        shared_head: one table for all heads (reference default) or one per head.
        num_prefix_tokens: prefix (class) tokens expected (the reference's ``skip``); ``> 0`` adds the one bucket all pairs touching a
            prefix token share. Any ``coords.num_prefix_tokens`` works with it; without it,
            coords with prefix tokens are refused.
        grid_size: the training grid ``(H, W)``, whose bucket ids (with ``num_prefix_tokens``
            tokens) are built once here; other grids reuse the same tables (offsets
            saturate) with ids built on first use.

    Tables start at zero, as in the reference.
    """

    def __init__(
        self,
        dim: int | None = None,
        num_heads: int | None = None,
        head_dim: int | None = None,
        method: str = "product",
        mode: str = "ctx",
        ratio: float = 1.9,
        rpe_on: str = "k",
        shared_head: bool = True,
        num_prefix_tokens: int = 1,
        grid_size: Sequence[int] | None = None,
    ) -> None:
        super().__init__()
        self.head_dim = resolve_head_dim(dim, num_heads, head_dim)
        self.method = _check_method(method)
        if not isinstance(mode, str) or mode not in _MODES:
            raise ValueError(f"mode must be one of {tuple(_MODES)}, got {mode!r}")
        self.mode = _MODES[mode]
        _coefficients(ratio)
        self.ratio = ratio
        if not isinstance(rpe_on, str) or not rpe_on or set(rpe_on) - set("qkv") or len(set(rpe_on)) != len(rpe_on):
            raise ValueError(f"rpe_on must name some of 'q', 'k', 'v' once each (e.g. 'k', 'qkv'), got {rpe_on!r}")
        if "v" in rpe_on and self.mode == "bias":
            raise ValueError("rpe_on with 'v' needs mode='ctx': the reference has no bias mode on values")
        self.rpe_on = "".join(t for t in "qkv" if t in rpe_on)
        check_bool(shared_head, "shared_head")
        if not shared_head and num_heads is None:
            raise ValueError("num_heads must be given when shared_head=False")
        self.shared_head = shared_head
        self.num_heads = num_heads
        self.num_prefix_tokens = check_int(num_prefix_tokens, "num_prefix_tokens", 0)
        self.has_output = "v" in self.rpe_on
        # buckets per table; cross keeps a row table and a column table side by side
        self.num_buckets = num_buckets(self.method, ratio, num_prefix_tokens)
        width = (2 if self.method == "cross" else 1) * self.num_buckets
        heads = 1 if shared_head else num_heads
        shapes = {
            "q": (heads, width) if self.mode == "bias" else (heads, self.head_dim, width),
            "k": (heads, width) if self.mode == "bias" else (heads, self.head_dim, width),
            "v": (heads, width, self.head_dim),
        }
        elements = sum(math.prod(shapes[t]) for t in self.rpe_on)
        check_bytes(4 * elements, f"iRPE tables of ratio={ratio!r} ({self.num_buckets:,} buckets, rpe_on={rpe_on!r})")
        for target in "qkv":
            table = nn.Parameter(torch.zeros(shapes[target])) if target in self.rpe_on else None
            self.register_parameter(f"{target}_table", table)
        self.grid_size = None if grid_size is None else check_ints(grid_size, "grid_size", length=2)
        train_ids = None if grid_size is None else self.table_ids(self.grid_size, num_prefix_tokens)
        self.register_buffer("train_ids", train_ids, persistent=False)  # (maps, N, N), shared on CPU

    # ------------------------------------------------------------------ bucket ids
    def table_ids(self, grid_shape: Sequence[int], prefix: int) -> Tensor:
        """``(maps, N, N)`` long ids into the tables' bucket axis (``maps`` = 2 for cross), on CPU."""
        return _shared_table_ids(self.method, self.ratio, self.num_buckets, tuple(grid_shape), prefix)

    def _ids(self, coords: Coords, device: torch.device) -> Tensor:
        grid = coords.grid_shape
        if grid is None or len(grid) != 2:
            raise ValueError(f"irpe needs 2-D grid coordinates (Coords.grid(h, w)); got grid_shape={grid}")
        if self.train_ids is not None and grid == self.grid_size and coords.num_prefix_tokens == self.num_prefix_tokens:
            return self.train_ids  # fast path: the buffer built in __init__
        if torch.compiler.is_compiling():  # pure function of static ints, traced into the graph
            return _table_ids(self.method, self.ratio, self.num_buckets, grid, coords.num_prefix_tokens).to(device)
        return _table_ids_on(self.method, self.ratio, self.num_buckets, grid, coords.num_prefix_tokens, device)

    # ------------------------------------------------------------------ hooks
    def _check(self, x: Tensor, coords: Coords, name: str) -> None:
        if x.dim() != 4 or x.shape[-1] != self.head_dim:
            raise ValueError(f"{name} must be (B, H, N, head_dim={self.head_dim}), got {tuple(x.shape)}")
        if not self.shared_head and x.shape[1] != self.num_heads:
            raise ValueError(f"{name} must have num_heads={self.num_heads} heads (per-head tables), got {x.shape[1]}")
        coords.check_tokens(x.shape[0], x.shape[2], name)

    def _scores(self, x: Tensor, table: Tensor) -> Tensor:
        """``s * x_i . table[:, b]`` for every bucket ``b``: ``(B, H, N, buckets)``."""
        return (x @ table.to(x.dtype)) * self.head_dim**-0.5

    def _contextual(self, x: Tensor, table: Tensor, ids: Tensor) -> Tensor:
        """``s * x_i . table[:, ids[i, j]]`` as ``(B, H, N, N)`` through ``(B, H, N, buckets)``."""
        b, h, n, _ = x.shape
        z = self._scores(x, table)
        out = z.gather(-1, ids[0].expand(b, h, n, n))
        for extra in ids[1:]:  # cross: the column map
            out = out + z.gather(-1, extra.expand(b, h, n, n))
        return out

    def bias(self, q: Tensor, k: Tensor, coords: Coords) -> Tensor:
        """Logits term ``(B or 1, H or 1, N, N)`` in scaled units; ``q``, ``k`` unscaled."""
        self._check(q, coords, "q")
        self._check(k, coords, "k")
        ids = self._ids(coords, q.device)  # (maps, N, N)
        terms = []
        if self.mode == "bias":
            for ids_map in ids:
                if self.k_table is not None:
                    terms.append(self.k_table[:, ids_map].unsqueeze(0))  # (1, H', N, N)
                if self.q_table is not None:
                    terms.append(self.q_table[:, ids_map.T].unsqueeze(0))  # query bucket b(j, i)
        else:
            if self.k_table is not None:
                terms.append(self._contextual(q, self.k_table, ids))
            if self.q_table is not None:
                terms.append(self._contextual(k, self.q_table, ids).transpose(-2, -1))
        if not terms:  # value term only
            return q.new_zeros(1, 1, q.shape[2], q.shape[2])
        return sum(terms[1:], terms[0]).to(q.dtype)

    def gathered_bias(self, q: Tensor, coords: Coords) -> tuple[Tensor, Tensor] | None:
        """:meth:`bias` as ``(z, ids)``, ``bias[..., i, j] = sum_m z[..., i, ids[m, i, j]]``, when it has that form.

        Terms on keys only (contextual: ``z = s q @ k_table`` ``(B, H, N, buckets)``; bias mode:
        ``z = k_table`` ``(1, H', 1, buckets)``); ``None`` with a term on queries or values.
        On CPU :func:`mmpos.nn.attention` then keeps no ``(B, H, N, N)`` tensor for backward
        (``mmpos.nn._biased_sdpa``: fused flash forward, blocked backward summing the logit
        gradient per bucket).
        """
        if self.q_table is not None or self.v_table is not None:
            return None
        self._check(q, coords, "q")
        ids = self._ids(coords, q.device)  # (maps, N, N)
        if self.mode == "bias":
            return self.k_table.to(q.dtype)[None, :, None], ids
        return self._scores(q, self.k_table), ids

    def output(self, attn: Tensor, coords: Coords) -> Tensor:
        """``sum_j attn_ij v_table[b(i, j)]`` ``(B, H, N, D)`` from ``attn`` ``(B, H, N, N)``."""
        if self.v_table is None:
            raise ValueError(f"this irpe encoder has no value term (rpe_on={self.rpe_on!r})")
        b, h, n, _ = attn.shape
        coords.check_tokens(b, n, "attn")
        ids = self._ids(coords, attn.device)
        per_bucket = attn.new_zeros(b, h, n, self.v_table.shape[1])  # attention mass per bucket
        for ids_map in ids:
            per_bucket = per_bucket.scatter_add(-1, ids_map.expand(b, h, n, n), attn)
        return per_bucket @ self.v_table.to(attn.dtype)  # (B, H, N, buckets) @ (H', buckets, D)

    def extra_repr(self) -> str:
        return (
            f"method={self.method!r}, mode={self.mode!r}, ratio={self.ratio}, rpe_on={self.rpe_on!r}, "
            f"head_dim={self.head_dim}, shared_head={self.shared_head}, num_prefix_tokens={self.num_prefix_tokens}, "
            f"num_buckets={self.num_buckets}, grid_size={self.grid_size}"
        )


def _preset(name: str):
    config = PRESETS[name]

    def factory(
        dim: int | None = None,
        num_heads: int | None = None,
        head_dim: int | None = None,
        shared_head: bool = True,
        num_prefix_tokens: int = 1,
        grid_size: Sequence[int] | None = None,
    ) -> IRPE:
        return IRPE(
            dim,
            num_heads,
            head_dim,
            shared_head=shared_head,
            num_prefix_tokens=num_prefix_tokens,
            grid_size=grid_size,
            **config,
        )

    factory.__name__ = f"irpe_{name.replace('-', '_')}"
    factory.__doc__ = f"iRPE preset ``{name}``: {config}, shared head, one prefix bucket."
    return factory


for _name in PRESETS:
    register_encoder(f"irpe-{_name}", paper=_PAPER, reference=_REFERENCE, static_grid=_STATIC_GRID)(_preset(_name))
