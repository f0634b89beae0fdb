"""Multi-order attention -- the fifth hook point -- and 2D-TPE, its first user.

Every head attends once under each of ``K`` token *orders* (1-D positions per token, e.g. the
row-major and column-major traversals of a table from :func:`mmpos.table.build`), with RoPE
at that order's positions; in causal mode the causal order is the traversal order (the
tokens are permuted into it, attended with ``scaled_dot_product_attention`` and put back with
the exact inverse permutation). A learned router gives, per head and token, softmax weights
over the orders that mix the ``K`` outputs.

2D-TPE: Li et al., "2D-TPE: Two-Dimensional Positional Encoding Enhances Table Understanding
for Large Language Models", 2024, https://arxiv.org/abs/2409.19700. Reference: JinaLeejnl/2D-TPE
``TPE-Llama/modeling_llama.py`` (``LlamaFlashAttention2Ours``), with the router of
zyx-hfut/2D-TPE commit 68c741a (``gate_1``, ``gate_2``: ``Linear(head_dim, 4 head_dim)``,
``gate_3``: ``Linear(4 head_dim, 2)``, all with bias, shared by the heads, ``act_fn`` = SiLU).
Differences from the reference, on purpose: the inverse permutation is computed
(``scatter`` of ``arange``), where the reference gathers with the column positions themselves
(exact only when they are a permutation of ``0 .. L-1``); padding and tables of different
shapes in one batch are supported; more than two orders; the router entropy is averaged per
sample over its table tokens (the reference slices them with ``pos_A + 4 : pos_B``).

Shapes: ``x`` ``(B, N, dim)``; order positions ``(K, B, N)`` (a :class:`~mmpos.coords.Coords`
with ``K`` axes, one per order, named ``"<traversal>_order"`` as :func:`mmpos.table.order_axes`
names them, so grid coordinates (axes ``"row"`` / ``"col"``) are refused); router weights ``(B, N, H, K)``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._validate import check_bool, check_float, check_int
from ..coords import Coords
from ..rotary import CONVENTIONS, apply_rotary, rope_frequencies
from ..table import ORDER_SUFFIX

__all__ = [
    "MultiOrderAttention",
    "MultiOrderCache",
    "TPEAttention",
    "TPERouter",
    "mix_orders",
    "multi_order_sdpa",
    "order_permutation",
    "router_entropy",
    "router_entropy_loss",
    "static_slots",
]


def order_permutation(pos: Tensor, key_mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Permutation into traversal order and its exact inverse, both ``(B, N)`` int64.

    ``pos`` ``(B, N)``: each token's position in the order; ties keep sequence order; padding
    (``key_mask`` False) goes last. ``x.gather(1, perm)`` is in traversal order and
    ``y.gather(1, inv)`` undoes it exactly.
    """
    if key_mask is not None:
        last = float("inf") if pos.is_floating_point() else torch.iinfo(pos.dtype).max
        pos = pos.masked_fill(~key_mask, last)
    perm = torch.sort(pos, dim=-1, stable=True).indices
    arange = torch.arange(pos.shape[-1], device=pos.device).expand_as(perm)
    return perm, torch.empty_like(perm).scatter_(-1, perm, arange)


def _causal_mask(key_mask: Tensor) -> Tensor:
    """``(B, 1, N, N)`` bool: causal & real keys; padding queries see themselves (no empty row)."""
    n = key_mask.shape[-1]
    tril = torch.ones(n, n, dtype=torch.bool, device=key_mask.device).tril()
    eye = torch.eye(n, dtype=torch.bool, device=key_mask.device)
    return (tril & key_mask[:, None, None, :]) | (eye & ~key_mask[:, None, :, None])


def multi_order_sdpa(
    q: Sequence[Tensor],
    k: Sequence[Tensor],
    v: Tensor,
    pos: Tensor,
    key_mask: Tensor | None = None,
    causal: bool = True,
    sequential: Sequence[bool] | None = None,
    dropout_p: float = 0.0,
) -> Tensor:
    """Attention under each order: ``(K, B, Hq, N, D)``.

    Args:
        q, k: per order, rotated queries ``(B, Hq, N, D)`` and keys ``(B, Hk, N, D)``.
        v: values ``(B, Hk, N, D)`` (shared by the orders).
        pos: ``(K, B, N)`` positions per order (used for the causal traversal).
        key_mask: ``(B, N)`` bool, ``True`` on real tokens.
        causal: causal in each order's traversal; otherwise full attention over real keys.
        sequential: per order, ``True`` if its positions increase along the sequence (as the
            row-major order of a serialised table): such an order is attended without a
            permutation, as the reference does for its row order.
        dropout_p: attention dropout.
    """
    num = len(q)
    if key_mask is not None and not torch.compiler.is_compiling() and bool(key_mask.all()):
        key_mask = None  # no padding: causal orders run through is_causal (no (B, 1, N, N) mask); eager only
    if len(k) != num or pos.shape[0] != num:
        raise ValueError(f"q, k and pos must hold one entry per order, got {len(q)}, {len(k)}, {pos.shape[0]}")
    sequential = [False] * num if sequential is None else list(sequential)
    gqa = q[0].shape[1] != v.shape[1]
    outs = []
    for i in range(num):
        qi, ki = q[i], k[i]
        if not causal:
            mask = None if key_mask is None else key_mask[:, None, None, :]
            outs.append(F.scaled_dot_product_attention(qi, ki, v, attn_mask=mask, dropout_p=dropout_p, enable_gqa=gqa))
            continue
        if sequential[i]:
            vi, inv, mask = v, None, None if key_mask is None else _causal_mask(key_mask)
        else:
            perm, inv = order_permutation(pos[i], key_mask)
            idx = perm[:, None, :, None]
            qi = qi.gather(2, idx.expand(-1, qi.shape[1], -1, qi.shape[3]))
            ki = ki.gather(2, idx.expand(-1, ki.shape[1], -1, ki.shape[3]))
            vi = v.gather(2, idx.expand(-1, v.shape[1], -1, v.shape[3]))
            mask = None if key_mask is None else _causal_mask(key_mask.gather(1, perm))
        out = F.scaled_dot_product_attention(
            qi, ki, vi, attn_mask=mask, dropout_p=dropout_p, is_causal=mask is None, enable_gqa=gqa
        )
        if inv is not None:
            out = out.gather(2, inv[:, None, :, None].expand(-1, out.shape[1], -1, out.shape[3]))
        outs.append(out)
    return torch.stack(outs)


def mix_orders(outputs: Tensor, weights: Tensor) -> Tensor:
    """``sum_k weights[..., k] * outputs[k]``: outputs ``(K, B, H, N, D)``, weights ``(B, N, H, K)`` -> ``(B, H, N, D)``."""
    w = weights.permute(3, 0, 2, 1).unsqueeze(-1).to(outputs.dtype)  # (K, B, H, N, 1)
    return (w * outputs).sum(0)


def router_entropy(weights: Tensor, token_mask: Tensor | None = None, eps: float = 1e-10) -> Tensor:
    """The 2D-TPE auxiliary loss: entropy ``-sum_k r_k log r_k`` of the router, averaged over heads
    and the tokens of ``token_mask`` ``(B, N)`` (e.g. the table tokens) of each sample, then over
    the samples that have such tokens. ``weights`` ``(B, N, H, K)``; returns a scalar."""
    r = weights.float().clamp(min=eps, max=1.0)
    ent = -(r * r.log()).sum(-1).mean(-1)  # (B, N)
    if token_mask is None:
        return ent.mean()
    m = token_mask.to(ent.dtype)
    per_sample = (ent * m).sum(1) / m.sum(1).clamp(min=1)
    has = (m.sum(1) > 0).to(ent.dtype)
    return (per_sample * has).sum() / has.sum().clamp(min=1)


def router_entropy_loss(model: nn.Module, token_mask: Tensor | None = None) -> Tensor:
    """Mean :func:`router_entropy` of every :class:`MultiOrderAttention` of ``model`` after its last forward."""
    values = [
        router_entropy(m.router_weights, token_mask)
        for m in model.modules()
        if isinstance(m, MultiOrderAttention) and m.router_weights is not None
    ]
    if not values:
        raise ValueError("model holds no MultiOrderAttention that ran a forward pass")
    return torch.stack(values).mean()


def static_slots(length: Tensor, n: int, capacity: int, cache: str, known: int | None = None) -> Tensor:
    """The slots ``(n,)`` int64, ``length .. length + n - 1``, that ``n`` new tokens take in a static cache.

    ``length`` is the cache's 0-d int64 counter of filled slots (a tensor, so a compiled step does
    not specialise on it), ``capacity`` its fixed number of slots, ``cache`` its name for the error;
    ``known``: the same count kept on the host by an eager caller (``None``: not known, e.g. after a
    compiled update). ``n`` tokens that do not fit are refused before anything is written, with no
    host sync: a ``ValueError`` when the count is known on the host (eager, any device) or the
    counter lies in host memory (CPU, eager), else ``torch._assert_async`` (under ``torch.compile``
    on CPU a ``RuntimeError`` with the same message, or inductor's own "index out of bounds" when its
    kernel checks first; on a GPU a device-side assert, reported at a later synchronisation). On
    overflow the returned slots all lie past the end, so no kernel writes part of the update.
    """
    msg = f"{cache} is full: {n} more token(s) do not fit in its {capacity} slots (crop it, or give it more capacity)"
    if known is not None and not torch.compiler.is_compiling():  # the host's count: nothing read from the device
        if known + n > capacity:
            raise ValueError(msg)
        return torch.arange(known, known + n, device=length.device)
    over = length + n > capacity  # 0-d bool on the counter's device
    if over.device.type == "cpu" and not torch.compiler.is_compiling():
        if bool(over):  # host memory: reading it syncs nothing
            raise ValueError(msg)
    else:
        torch._assert_async(~over, msg)
    # an overflow also moves every slot past the end: a compiled kernel's own bounds check (inductor's, which may
    # fire before the assertion) then refuses the whole write, never a part of it
    return length + torch.arange(n, device=length.device) + over.long() * capacity


class MultiOrderCache:
    """Keys under every order, values, positions and padding of the tokens seen so far (one per layer).

    ``keys`` ``(K, B, Hk, S, D)`` (rotated per order), ``values`` ``(B, Hk, S, D)``,
    ``pos`` ``(K, B, S)``, ``mask`` ``(B, S)``. Keys cost ``K`` times a 1-D cache's keys, so the
    cache is ``(K + 1) / 2`` times a plain KV cache (1.5x for two orders, as in the paper).

    Two modes:

    * dynamic (default): ``S`` = :attr:`length` ``T``, the tokens held (an ``int``); the tensors
      are views of the first ``T`` slots of preallocated buffers. A buffer holds ``capacity``
      tokens (given up front, or the first update's length) and doubles when full, so an update
      is a write into the buffer (``O(1)`` allocations, amortised ``O(new tokens)`` copying), not a
      copy of every cached key. Every step has new shapes (under ``torch.compile``: a new graph).
    * ``static=True`` (for ``torch.compile``, as transformers' ``StaticCache``): the buffers hold
      ``capacity`` tokens, allocated at the first update and never reallocated; :attr:`length`
      is a 0-d int64 tensor on the buffers' device, incremented in place; ``S`` = ``capacity``:
      the tensors are the whole buffers, ``mask`` ``False`` on the slots not filled. An update
      writes at slots ``length .. length + n - 1`` (``index_copy_``), and
      :class:`MultiOrderAttention` attends over all ``S`` slots with a mask built from tensors, so
      every decode step has the same shapes and no host sync (one graph for every step). Eagerly
      (``torch.compiler.is_compiling()`` false) the cache also keeps the count on the host, as a
      Python ``int`` its eager updates advance (nothing is read from the device), and the layer
      attends over the ``T`` filled slots only, as with the dynamic cache (same outputs, no mask
      over unfilled slots); a compiled update leaves that host count unknown until :meth:`crop`,
      so later eager steps attend over all slots, masked, as compiled ones do. A first
      update longer than ``capacity`` is a ``ValueError`` before allocating; an update that would
      overflow is refused before it writes (:func:`static_slots`: a ``ValueError`` in eager mode
      when the host count is known or on CPU, else ``torch._assert_async``, no host sync).
      :meth:`crop` reads the counter once.

    Args:
        capacity: tokens to allocate room for at the first update (``None``: that update's
            length; required with ``static=True``, where it is the fixed size).
        static: fixed size and a tensor counter (see above).
    """

    def __init__(self, capacity: int | None = None, static: bool = False) -> None:
        self.capacity = check_int(capacity, "capacity", none_ok=True)
        self.static = check_bool(static, "static")
        if self.static and self.capacity is None:
            raise ValueError("capacity must be a positive int with static=True (the cache's fixed size), got None")
        self.length: int | Tensor = torch.zeros((), dtype=torch.long) if self.static else 0
        self._seen: int | None = 0  # static: the count on the host, kept by eager updates (None: unknown)
        self._empty = True  # no token held: known on the host in both modes (the layer's prefill test)
        self._keys: Tensor | None = None
        self._values: Tensor | None = None
        self._pos: Tensor | None = None
        self._mask: Tensor | None = None

    def _held(self, buffer: Tensor | None, dim: int) -> Tensor | None:
        """The slots a step reads: the first ``T`` (dynamic) or all of them (static)."""
        if buffer is None or self.static:
            return buffer
        return buffer.narrow(dim, 0, self.length)

    @property
    def keys(self) -> Tensor | None:
        return self._held(self._keys, 3)

    @property
    def values(self) -> Tensor | None:
        return self._held(self._values, 2)

    @property
    def pos(self) -> Tensor | None:
        return self._held(self._pos, 2)

    @property
    def mask(self) -> Tensor | None:
        return self._held(self._mask, 1)

    def _step_view(self) -> tuple[Tensor, Tensor, Tensor, Tensor, int | Tensor]:
        """``(keys, values, pos, mask, length)`` a decode step attends over.

        The held tensors and :attr:`length`, except for a static cache in eager mode whose count is
        known on the host: then the views of its ``T`` filled slots and ``T`` (an ``int``), so an eager
        step costs what a dynamic cache's does (the unfilled slots are masked anyway: same outputs).
        """
        if self.static and self._seen is not None and not torch.compiler.is_compiling():
            t = self._seen
            return self._keys[:, :, :, :t], self._values[:, :, :t], self._pos[:, :, :t], self._mask[:, :t], t
        return self.keys, self.values, self.pos, self.mask, self.length

    def _grow(self, needed: int) -> None:
        have = self._values.shape[2]  # 0 before the first update: room for `capacity` tokens then
        size = max(needed, 2 * have if have else (self.capacity or 0))
        old = self._keys, self._values, self._pos, self._mask
        # static: every slot is read (masked), so the unfilled ones hold zeros, never uninitialised memory
        fresh = torch.Tensor.new_zeros if self.static else torch.Tensor.new_empty
        self._keys = fresh(old[0], (*old[0].shape[:3], size, old[0].shape[4]))
        self._values = fresh(old[1], (*old[1].shape[:2], size, old[1].shape[3]))
        self._pos = old[2].new_zeros((*old[2].shape[:2], size))
        self._mask = old[3].new_zeros((old[3].shape[0], size))
        t = 0 if self.static else self.length
        if t:
            self._keys[:, :, :, :t] = old[0][:, :, :, :t]
            self._values[:, :, :t] = old[1][:, :, :t]
            self._pos[:, :, :t] = old[2][:, :, :t]
            self._mask[:, :t] = old[3][:, :t]

    def _allocate_static(self, device: torch.device) -> None:
        """The static buffers (``capacity`` slots) and the counter on their device, at the first update."""
        self._grow(self.capacity)
        self.length = self.length.to(device)
        if not torch.compiler.is_compiling():  # fixed addresses for CUDA graphs, as transformers' StaticLayer
            for t in (self._keys, self._values, self._pos, self._mask, self.length):
                torch._dynamo.mark_static_address(t)

    def update(self, keys: Tensor, values: Tensor, pos: Tensor, mask: Tensor) -> None:
        """Append ``n`` tokens: ``keys`` ``(K, B, Hk, n, D)``, ``values`` ``(B, Hk, n, D)``, ``pos`` ``(K, B, n)``, ``mask`` ``(B, n)``."""
        n = values.shape[2]
        if self._values is None and self.static and n > self.capacity:  # before allocating anything
            raise ValueError(
                f"MultiOrderCache(capacity={self.capacity}, static=True) cannot hold the {n} tokens of its first "
                f"update: build it with capacity >= {n} (the prompt plus the tokens to generate)"
            )
        if self._values is None:  # the first update fixes the shapes and dtypes of the buffers
            self._keys, self._values, self._pos, self._mask = (
                keys[:, :, :, :0],
                values[:, :, :0],
                pos[:, :, :0],
                mask[:, :0],
            )
            if self.static:
                self._allocate_static(values.device)
            else:
                self._grow(n)
        elif keys.shape[:3] != self._keys.shape[:3] or values.shape[:2] != self._values.shape[:2]:
            raise ValueError(
                f"keys {tuple(keys.shape)} / values {tuple(values.shape)} do not match the cache's "
                f"(K, B, Hk) = {tuple(self._keys.shape[:3])}"
            )
        elif not self.static and self.length + n > self._values.shape[2]:
            self._grow(self.length + n)
        if self.static:  # slots length .. length + n - 1, the counter incremented in place
            known = None if torch.compiler.is_compiling() else self._seen
            slots = static_slots(
                self.length, n, self.capacity, f"MultiOrderCache(capacity={self.capacity}, static=True)", known
            )
            self._keys.index_copy_(3, slots, keys.to(self._keys.dtype))
            self._values.index_copy_(2, slots, values.to(self._values.dtype))
            self._pos.index_copy_(2, slots, pos.to(self._pos.dtype))
            self._mask.index_copy_(1, slots, mask.to(self._mask.dtype))
            self.length.add_(n)
            self._seen = None if known is None else known + n  # a compiled update: unknown on the host until crop
        else:
            t = self.length
            self._keys[:, :, :, t : t + n] = keys
            self._values[:, :, t : t + n] = values
            self._pos[:, :, t : t + n] = pos
            self._mask[:, t : t + n] = mask
            self.length = t + n
        self._empty = False

    def crop(self, length: int) -> None:
        """Keep the first ``length`` tokens (as transformers' ``DynamicCache.crop``; the buffers stay allocated).

        Static: the counter is set in place and the later slots' ``mask`` cleared; checking ``length``
        reads the counter once (a host sync on a GPU; ``crop`` runs between forwards, not in one).
        """
        if self.static:
            length = check_int(length, "length", 0, int(self.length))
            self.length.fill_(length)
            self._seen = length
            if self._mask is not None:
                self._mask[:, length:] = False
        else:
            self.length = length = check_int(length, "length", 0, self.length)
        self._empty = length == 0


class MultiOrderAttention(nn.Module):
    """Base class of the multi-order hook point: attention under several orders, mixed per head and token.

    Subclasses define :meth:`mix_weights` (``x`` ``(B, N, dim)`` -> ``(B, N, H, K)``, rows sum to 1).

    Args:
        dim: model width; ``head_dim = dim // num_heads``.
        num_heads: query heads.
        orders: the order axes read from ``coords``, each named ``"<traversal>_order"``
            (default ``("row_order", "col_order")``, the axes of :attr:`mmpos.table.TableLayout.order_coords`
            built with ``orders=("row", "col")``; see :func:`mmpos.table.order_axes`). The suffix keeps
            order positions apart from grid coordinates (axes ``("row", "col")``), which are refused.
        num_kv_heads: key/value heads (GQA); defaults to ``num_heads``.
        causal: causal attention in every order's traversal.
        sequential_orders: orders whose positions follow the token sequence (default ``("row_order",)``,
            the serialisation order of :mod:`mmpos.table`): attended without a permutation.
        theta: RoPE base; ``convention``: ``"half"`` (Llama) or ``"interleaved"``.
        qkv_bias, proj_bias: biases of the projections.
        attn_drop: attention dropout.

    ``forward(x (B, N, dim), coords, attn_mask=None, rotations=(), cache=None) -> (B, N, dim)``
    (the signature of :class:`mmpos.nn.Attention`, so :class:`mmpos.nn.Block` takes it); ``coords``
    has the order axes among its axes (:attr:`mmpos.table.TableLayout.order_coords`; a ``ValueError``
    naming ``coords`` and the expected axes otherwise, e.g. for ``grid_coords``), and its
    ``mask`` marks padding. With a :class:`MultiOrderCache` the new tokens are appended to it;
    a token may attend to every cached or new token whose position is not larger than its own,
    in each order (when the cache is empty the causal permuted path runs and fills it). With a
    static cache (``MultiOrderCache(capacity, static=True)``) a step reads nothing from the device:
    under ``torch.compile(fullgraph=True)`` it attends over all the slots, masked, and every decode
    step runs one graph; eagerly it attends over the filled slots, whose count the cache keeps on
    the host (as a dynamic cache does).
    The router weights of the last forward are kept in :attr:`router_weights` (for
    :func:`router_entropy_loss`).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        orders: Sequence[str] = ("row_order", "col_order"),
        num_kv_heads: int | None = None,
        causal: bool = True,
        sequential_orders: Sequence[str] = ("row_order",),
        theta: float = 10000.0,
        convention: str = "half",
        qkv_bias: bool = False,
        proj_bias: bool = False,
        attn_drop: float = 0.0,
    ) -> None:
        super().__init__()
        if type(self).mix_weights is MultiOrderAttention.mix_weights:
            raise TypeError(
                f"{type(self).__name__} does not define mix_weights(x) -> (B, N, H, K): MultiOrderAttention is a "
                "base class; use TPEAttention or subclass it with a mix_weights method"
            )
        dim, num_heads = check_int(dim, "dim"), check_int(num_heads, "num_heads")
        if dim % num_heads:
            raise ValueError(f"dim={dim} must be divisible by num_heads={num_heads}")
        num_kv_heads = num_heads if num_kv_heads is None else check_int(num_kv_heads, "num_kv_heads")
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads={num_heads} must be a multiple of num_kv_heads={num_kv_heads}")
        causal, qkv_bias, proj_bias = (
            check_bool(v, n) for v, n in ((causal, "causal"), (qkv_bias, "qkv_bias"), (proj_bias, "proj_bias"))
        )
        theta = check_float(theta, "theta")
        attn_drop = check_float(attn_drop, "attn_drop", 0.0, strict=False, high=1.0)
        orders = tuple(orders)
        if not orders or len(set(orders)) != len(orders) or not all(isinstance(o, str) for o in orders):
            raise ValueError(f"orders must be distinct axis names, at least one, got {orders!r}")
        plain = [o for o in orders if not o.endswith(ORDER_SUFFIX) or o == ORDER_SUFFIX]
        if plain:
            raise ValueError(
                f"orders must name order axes '<traversal>{ORDER_SUFFIX}' (mmpos.table.order_axes, e.g. "
                f"('row{ORDER_SUFFIX}', 'col{ORDER_SUFFIX}')), got {orders!r}: {plain} would read grid or other coordinates"
            )
        unknown = set(sequential_orders) - set(orders)
        if unknown:
            raise ValueError(f"sequential_orders {sorted(unknown)} are not among orders={orders}")
        if convention not in CONVENTIONS:
            raise ValueError(f"convention must be one of {CONVENTIONS}, got {convention!r}")
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, dim // num_heads
        if self.head_dim % 2:
            raise ValueError(f"head_dim = dim // num_heads must be even for RoPE, got {self.head_dim}")
        self.orders, self.causal, self.convention, self.attn_drop = orders, causal, convention, attn_drop
        self.sequential = tuple(o in sequential_orders for o in orders)
        self.q = nn.Linear(dim, dim, bias=qkv_bias)
        self.kv = nn.Linear(dim, 2 * num_kv_heads * self.head_dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim, bias=proj_bias)
        self.register_buffer("inv_freq", rope_frequencies(self.head_dim // 2, theta), persistent=False)
        self.router_weights: Tensor | None = None

    @property
    def num_orders(self) -> int:
        return len(self.orders)

    def _apply(self, fn, recurse=True):
        # keep the RoPE spectrum in float32 under model.to(torch.bfloat16) (as RotaryEncoder does)
        fixed = self._buffers.get("inv_freq")
        super()._apply(fn, recurse)
        if fixed is not None and self._buffers["inv_freq"].dtype != fixed.dtype:
            self._buffers["inv_freq"] = fixed.to(self._buffers["inv_freq"].device)
        return self

    def mix_weights(self, x: Tensor) -> Tensor:
        """``(B, N, H, K)`` weights over the orders per head and token (subclasses define it)."""
        raise TypeError(
            f"{type(self).__name__} does not define mix_weights(x) -> (B, N, H, K); MultiOrderAttention is a base "
            "class: use TPEAttention or a subclass that defines it"
        )

    def _rotate(self, q: Tensor, k: Tensor, pos: Tensor) -> tuple[list[Tensor], list[Tensor]]:
        angles = pos.unsqueeze(-1).float() * self.inv_freq  # (K, B, N, P)
        cos, sin = angles.cos(), angles.sin()
        qs = [apply_rotary(q, cos[i], sin[i], self.convention) for i in range(pos.shape[0])]
        ks = [apply_rotary(k, cos[i], sin[i], self.convention) for i in range(pos.shape[0])]
        return qs, ks

    def forward(
        self,
        x: Tensor,
        coords: Coords,
        attn_mask: Tensor | None = None,
        rotations: Sequence = (),
        cache: MultiOrderCache | None = None,
    ) -> Tensor:
        if attn_mask is not None:
            raise ValueError("multi-order attention builds its masks from coords (order positions and mask)")
        if rotations:
            raise ValueError("multi-order attention applies RoPE per order itself: use it without rotary encoders")
        if not isinstance(coords, Coords):
            raise TypeError(f"coords must be a Coords holding the order positions {self.orders}, got {coords!r}")
        b, n, _ = x.shape
        coords.check_tokens(b, n)
        if cache is not None and not self.causal:
            raise ValueError("a MultiOrderCache needs causal=True")
        missing = [o for o in self.orders if o not in coords.axes]
        if missing:  # axes are static metadata: no data-dependent check
            grid = all(o[: -len(ORDER_SUFFIX)] in coords.axes for o in self.orders)
            raise ValueError(
                f"coords must hold the order axes {self.orders} (mmpos.table.TableLayout.order_coords), got axes "
                f"{coords.axes}"
                + ("; these look like grid coordinates (TableLayout.grid_coords), not order positions" if grid else "")
            )
        c = coords if coords.axes == self.orders else coords.select(*self.orders)
        pos = c.pos.expand(b, -1, -1).permute(2, 0, 1)  # (K, B, N)
        key_mask = None if c.mask is None else c.mask.expand(b, -1)
        q = self.q(x).view(b, n, self.num_heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(x).view(b, n, 2, self.num_kv_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        qs, ks = self._rotate(q, k, pos)
        drop = self.attn_drop if self.training else 0.0
        if cache is None or cache._empty:  # a host flag in both modes: no read of a static cache's counter
            out = multi_order_sdpa(qs, ks, v, pos, key_mask, self.causal, self.sequential, drop)
            if cache is not None:
                real = x.new_ones(b, n, dtype=torch.bool) if key_mask is None else key_mask
                cache.update(torch.stack(ks), v, pos, real)
        else:
            real = x.new_ones(b, n, dtype=torch.bool) if key_mask is None else key_mask
            cache.update(torch.stack(ks), v, pos, real)
            if drop == 0.0:  # decoding: mix the attention weights, then one product with the values
                w = self.mix_weights(x)
                self.router_weights = w
                out = self._cached_mixed(qs, cache, pos, key_mask, w)
                return self.proj(out.transpose(1, 2).reshape(b, n, -1))
            out = self._cached(qs, cache, pos, real, drop)
        w = self.mix_weights(x)
        self.router_weights = w
        out = mix_orders(out, w)
        return self.proj(out.transpose(1, 2).reshape(b, n, -1))

    def _cached_mixed(
        self, qs: list[Tensor], cache: MultiOrderCache, pos: Tensor, key_mask: Tensor | None, w: Tensor
    ) -> Tensor:
        """``sum_k w_k softmax(q_k K_k^T / sqrt(D) + mask_k) V`` as ``(sum_k w_k P_k) V``: the values read once.

        ``qs`` ``K x (B, H, n, D)``, ``key_mask`` ``(B, n)`` of the new tokens (``None``: all real),
        ``w`` ``(B, n, H, K)`` -> ``(B, H, n, D)``; equal to :meth:`_cached` followed by
        :func:`mix_orders` (the mix is linear). The cache (updated with the new tokens) gives ``S``
        slots: ``T`` (dynamic, and static in eager mode while its host count is known) or all its
        ``capacity`` (static; the unfilled ones have ``mask`` False).
        """
        b, h, n, d = qs[0].shape
        keys, values, held_pos, held_mask, length = cache._step_view()
        hk, s = self.num_kv_heads, values.shape[2]
        g, k = h // hk, len(qs)
        blocked = (held_pos[:, :, None, :] > pos[:, :, :, None]) | ~held_mask[:, None, :]  # (K, B, n, S)
        if key_mask is not None:  # padding queries see themselves (no empty row)
            blocked = blocked & ~(_new_slots(length, n, s, values.device) & ~key_mask[:, :, None])
        q = torch.stack(qs).reshape(k, b, hk, g * n, d) * (d**-0.5)
        scores = (q @ keys.transpose(-1, -2)).view(k, b, h, n, s)  # (K, B, H, n, S)
        probs = scores.masked_fill_(blocked[:, :, None], float("-inf")).softmax(-1)
        mixed = (probs * w.permute(3, 0, 2, 1).unsqueeze(-1).to(probs.dtype)).sum(0)  # (B, H, n, S)
        return (mixed.view(b, hk, g * n, s) @ values).view(b, h, n, d)

    def _cached(self, qs: list[Tensor], cache: MultiOrderCache, pos: Tensor, real: Tensor, drop: float) -> Tensor:
        keys, values, held_pos, held_mask, length = cache._step_view()
        n, s = pos.shape[-1], values.shape[2]
        gqa = self.num_heads != self.num_kv_heads
        own = _new_slots(length, n, s, values.device)  # padding queries see themselves
        outs = []
        for i, qi in enumerate(qs):
            mask = (held_pos[i][:, None, :] <= pos[i][:, :, None]) & held_mask[:, None, :]  # (B, n, S)
            mask = mask | (own & ~real[:, :, None])
            outs.append(
                F.scaled_dot_product_attention(
                    qi, keys[i], values, attn_mask=mask[:, None], dropout_p=drop, enable_gqa=gqa
                )
            )
        return torch.stack(outs)


def _new_slots(length: int | Tensor, n: int, slots: int, device: torch.device) -> Tensor:
    """``(n, S)`` bool: the slot of each of the ``n`` tokens the last update wrote (``length - n + i``).

    Built from the cache's ``length`` as it is, an ``int`` or a static cache's counter tensor (no host sync).
    """
    rel = torch.arange(slots, device=device) - (length - n)  # (S,): slot index relative to the first new token
    return rel == torch.arange(n, device=device)[:, None]


class TPERouter(nn.Module):
    """The 2D-TPE router: ``softmax(gate_3(act(gate_1(h)) * gate_2(h)))`` on each head-sized slice ``h``.

    ``forward(x (B, N, H * head_dim)) -> (B, N, H, K)``; the gates are shared by the heads.
    ``act`` defaults to SiLU; the reference uses its model config's ``hidden_act``
    (:func:`mmpos.integrations.hf_tpe.install_tpe` passes it).
    """

    def __init__(
        self, head_dim: int, num_orders: int = 2, hidden: int | None = None, act: nn.Module | None = None
    ) -> None:
        super().__init__()
        head_dim, num_orders = check_int(head_dim, "head_dim"), check_int(num_orders, "num_orders")
        hidden = 4 * head_dim if hidden is None else check_int(hidden, "hidden")
        self.head_dim = head_dim
        self.act = nn.SiLU() if act is None else act
        self.gate_1 = nn.Linear(head_dim, hidden)
        self.gate_2 = nn.Linear(head_dim, hidden)
        self.gate_3 = nn.Linear(hidden, num_orders)

    def forward(self, x: Tensor) -> Tensor:
        h = x.unflatten(-1, (-1, self.head_dim))  # (B, N, H, head_dim)
        logits = self.gate_3(self.act(self.gate_1(h)) * self.gate_2(h))
        return logits.float().softmax(-1).to(x.dtype)


class TPEAttention(MultiOrderAttention):
    """2D-TPE attention: :class:`MultiOrderAttention` mixed by a :class:`TPERouter`.

    Same arguments as :class:`MultiOrderAttention`, plus ``router_hidden`` (default ``4 * head_dim``).
    """

    def __init__(
        self, dim: int, num_heads: int, orders: Sequence[str] = ("row_order", "col_order"), router_hidden=None, **kwargs
    ):
        super().__init__(dim, num_heads, orders, **kwargs)
        self.router = TPERouter(self.head_dim, self.num_orders, router_hidden)

    def mix_weights(self, x: Tensor) -> Tensor:
        return self.router(x)
