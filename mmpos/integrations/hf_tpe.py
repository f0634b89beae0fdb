"""2D-TPE attention installed on a Hugging Face Llama- or Qwen2-style text model instance.

:func:`install_tpe` ``(model, orders=2)`` gives every decoder layer's
``self_attn`` a :class:`~mmpos.nn.multi_order.TPERouter` (``self_attn.tpe_router``, part of
the state dict) and replaces that module's ``forward`` on the *instance* (nothing
module-level is patched; :func:`uninstall_tpe` restores it). The new forward keeps the
model's own projections, its ``rotary_emb`` (called once per order with that order's
positions, so RoPE scaling and ``rope_theta`` are the model's) and its
``apply_rotary_pos_emb`` (looked up in the attention class's module), then attends under
each order with :func:`~mmpos.nn.multi_order.multi_order_sdpa` and mixes the orders with the
router, as 2D-TPE does (Li et al. 2024, arXiv:2409.19700; JinaLeejnl/2D-TPE
``TPE-Llama/modeling_llama.py``).

Call the model with two extra keyword arguments, which transformers hands down to every
attention layer (``**kwargs``, in 4.57 and 5.x alike):

* ``tpe_positions``: each token's position under each order, either the order coordinates
  themselves (:attr:`mmpos.table.TableLayout.order_coords`, axes ``("row_order", "col_order")``;
  a ``Coords`` whose axes are not order axes, such as ``grid_coords``, is a ``ValueError``) or
  ``(K, B, L)`` int64 (``order_coords.pos.permute(2, 0, 1).long()``);
* ``tpe_mask`` ``(B, T)`` bool, ``True`` on real tokens, ``T`` = cached + new tokens
  (optional; no padding when absent).

Decoding: with a cache (``use_cache=True`` / ``past_key_values``) the layer stores the keys
of all ``K`` orders side by side in the cache's key tensor (``(B, Hk, T, K * D)``; the cache
grows by ``(K + 1) / 2``), and tokens after the first forward attend to every cached token
and causally to each other -- the reference's decoding rule (new tokens follow the table in
every order, at positions ``next_position + i`` for every order). transformers' default
``DynamicCache`` concatenates every cached key at every step (``O(T)`` copying a token);
:class:`PreallocatedCache` ``(capacity=)`` writes into buffers that double when full (the growth
rule of :class:`mmpos.nn.MultiOrderCache`), and a transformers ``StaticCache`` whose layers size
keys and values apart (5.x) works as well: the layer reads the first ``T`` slots of what the
cache returns.

Feature detection, not version strings: the cache argument is read as ``cache`` (5.x) or
``past_key_values`` (4.x); ``cache.update`` is called with its three positional arguments and
the ``cache_position`` the model passed (the 4.x static layers write there; 5.x counts itself).
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from .._extras import requires
from .._validate import check_int, check_ints
from ..coords import Coords
from ..nn.multi_order import TPERouter, mix_orders, multi_order_sdpa
from ..table import ORDER_SUFFIX

with requires("hf"):  # one line naming the package and the extra when it is missing
    from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

__all__ = ["PreallocatedCache", "decoder_layers", "install_tpe", "uninstall_tpe"]


class _PreallocatedLayer(DynamicLayer):
    """A ``DynamicLayer`` whose ``keys`` / ``values`` are views of the first ``T`` slots of buffers that double.

    Every other method of ``DynamicLayer`` (``get_seq_length``, ``crop``, ``batch_select_indices``, ...)
    reads or reassigns ``keys`` / ``values``; an update writes after ``keys`` when they are still a
    prefix view of the buffers, else (reassigned to a new tensor, e.g. by beam reordering) it
    copies them into new buffers first.
    """

    def __init__(self, capacity: int | None = None) -> None:
        super().__init__()
        self.capacity = capacity
        self._key_buffer: Tensor | None = None
        self._value_buffer: Tensor | None = None

    def _views(self, t: int) -> tuple[Tensor, Tensor]:
        return self._key_buffer[:, :, :t], self._value_buffer[:, :, :t]

    def _holds(self, t: int) -> bool:
        """``keys`` / ``values`` are the first ``t`` slots of the buffers (not a copy, not cut inside)."""
        if self._key_buffer is None or self.keys is None or self.keys.dim() != 4:
            return False
        want_k, want_v = self._views(t)
        return all(
            a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride()
            for a, b in ((self.keys, want_k), (self.values, want_v))
        )

    def update(self, key_states: Tensor, value_states: Tensor, *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor]:
        # key_states (B, Hk, n, Dk), value_states (B, Hk, n, Dv); the buffers (B, Hk, capacity, Dk / Dv)
        n = key_states.shape[-2]
        initialized = getattr(self, "is_initialized", False) and self.keys is not None and self.keys.dim() == 4
        t = self.keys.shape[-2] if initialized else 0
        have = 0 if self._key_buffer is None else self._key_buffer.shape[-2]
        if not self._holds(t) or t + n > have:
            size = max(t + n, 2 * have if have and self._holds(t) else (self.capacity or 0))
            old_k, old_v = (self.keys, self.values) if t else (None, None)
            self._key_buffer = key_states.new_empty((*key_states.shape[:2], size, key_states.shape[-1]))
            self._value_buffer = value_states.new_empty((*value_states.shape[:2], size, value_states.shape[-1]))
            if t:
                self._key_buffer[:, :, :t] = old_k
                self._value_buffer[:, :, :t] = old_v
        self._key_buffer[:, :, t : t + n] = key_states
        self._value_buffer[:, :, t : t + n] = value_states
        self.dtype, self.device, self.is_initialized = key_states.dtype, key_states.device, True
        self.keys, self.values = self._views(t + n)
        return self.keys, self.values


class PreallocatedCache(DynamicCache):
    """A transformers ``DynamicCache`` whose layers write into preallocated buffers that double when full.

    For decoding through :func:`install_tpe` (keys ``(B, Hk, T, K * D)``, values ``(B, Hk, T, D)``) or
    any model: an update writes the new tokens (amortised ``O(new tokens)`` copying) where the default
    ``DynamicCache`` concatenates every cached key (``O(T)`` a step). Results are the same.

    Args:
        capacity: tokens each layer allocates room for at its first update (``None``: that update's
            length); the buffers double when full.

    ``model(ids, ..., use_cache=True, past_key_values=PreallocatedCache(capacity=L + new_tokens))``.
    """

    def __init__(self, capacity: int | None = None) -> None:
        capacity = check_int(capacity, "capacity", none_ok=True)
        Cache.__init__(self, layer_class_to_replicate=functools.partial(_PreallocatedLayer, capacity))
        self.capacity = capacity


def decoder_layers(model: nn.Module) -> tuple[nn.Module, Sequence[nn.Module]]:
    """``(text model, its decoder layers)`` of a ``*ForCausalLM`` or a bare text model."""
    base = getattr(model, "model", model)
    layers = getattr(base, "layers", None)
    if layers is None or not hasattr(base, "rotary_emb"):
        raise TypeError(
            f"model must be a Llama- or Qwen2-style text model (a .layers list and a .rotary_emb), got {type(model).__name__}"
        )
    return base, layers


def _tpe_forward(
    attn: nn.Module,
    rotary: nn.Module,
    rotate: Any,
    orders: int,
    sequential: tuple[bool, ...],
    hidden_states: Tensor,
    position_embeddings: Any = None,
    attention_mask: Tensor | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    positions = kwargs.get("tpe_positions")
    if positions is None:
        raise ValueError("a model with 2D-TPE attention needs tpe_positions=(K, B, L) positions per order")
    key_mask = kwargs.get("tpe_mask")
    cache = kwargs.get("cache", kwargs.get("past_key_values"))
    b, n, _ = hidden_states.shape
    positions = _order_positions(positions, orders, b, n)
    d = attn.head_dim
    q = attn.q_proj(hidden_states).view(b, n, -1, d).transpose(1, 2)
    k = attn.k_proj(hidden_states).view(b, n, -1, d).transpose(1, 2)
    v = attn.v_proj(hidden_states).view(b, n, -1, d).transpose(1, 2)
    qs, ks = [], []
    for i in range(orders):
        cos, sin = rotary(v, positions[i])
        qi, ki = rotate(q, k, cos, sin)
        qs.append(qi)
        ks.append(ki)
    past = 0 if cache is None else int(cache.get_seq_length(attn.layer_idx))
    if cache is not None:  # keys (B, Hk, T, K * D); a static cache returns all its slots: the first T are ours
        where = kwargs.get("cache_position")
        extra = () if where is None else ({"cache_position": where},)
        try:
            keys, v = cache.update(torch.cat(ks, dim=-1), v, attn.layer_idx, *extra)
        except RuntimeError as e:
            if orders == 1:
                raise
            raise ValueError(
                f"{type(cache).__name__} could not store 2D-TPE keys (B, Hk, T, {orders} * {d}) beside values "
                f"(B, Hk, T, {d}); a cache whose layers allocate values as wide as keys (transformers' StaticCache "
                "before 5) cannot hold them: use mmpos.integrations.hf_tpe.PreallocatedCache(capacity=...)"
            ) from e
        keys, v = keys[:, :, : past + n], v[:, :, : past + n]
        ks = list(keys.split(d, dim=-1))
    if past == 0:
        mask = None if key_mask is None else key_mask.bool()
        out = multi_order_sdpa(qs, ks, v, positions, mask, True, sequential)
    else:  # every cached token, then causal among the new ones (they follow everything in every order)
        t = past + n
        allowed = None  # one new token and no padding: it sees every key (no mask: SDPA's fast path)
        if n > 1 or key_mask is not None:
            allowed = torch.ones(n, t, dtype=torch.bool, device=q.device).tril(past)
            allowed = (allowed if key_mask is None else allowed & key_mask.bool()[:, None, :]).unsqueeze(-3)
        gqa = q.shape[1] != v.shape[1]
        out = torch.stack(
            [
                torch.nn.functional.scaled_dot_product_attention(qi, ki, v, attn_mask=allowed, enable_gqa=gqa)
                for qi, ki in zip(qs, ks)
            ]
        )
    out = mix_orders(out, attn.tpe_router(hidden_states))
    return attn.o_proj(out.transpose(1, 2).reshape(b, n, -1)), None


def _order_positions(positions: Any, orders: int, batch: int, tokens: int) -> Tensor:
    """``tpe_positions`` as ``(K, B, L)`` int64, checked by shape and, for a ``Coords``, by its axes (static)."""
    if isinstance(positions, Coords):
        plain = [a for a in positions.axes if not a.endswith(ORDER_SUFFIX)]
        if plain or positions.num_axes != orders:
            raise ValueError(
                f"tpe_positions must hold {orders} order axes '<traversal>{ORDER_SUFFIX}' "
                f"(mmpos.table.TableLayout.order_coords), got a Coords with axes {positions.axes}"
                + ("; grid coordinates (TableLayout.grid_coords) are not order positions" if plain else "")
            )
        positions = positions.pos.permute(2, 0, 1).long()  # (B, L, K) -> (K, B, L)
    if not isinstance(positions, Tensor) or positions.dim() != 3 or positions.shape[0] != orders:
        shape = tuple(positions.shape) if isinstance(positions, Tensor) else type(positions).__name__
        raise ValueError(f"tpe_positions must be a (K={orders}, B, L) tensor or an order Coords, got {shape}")
    if positions.shape[1] not in (1, batch) or positions.shape[2] != tokens:
        raise ValueError(
            f"tpe_positions {tuple(positions.shape)} must be (K, B, L) for the {batch} x {tokens} new tokens"
        )
    return positions


class _TPEForward:
    """The patched ``self_attn.forward`` (a plain object, not a closure, so patched models pickle)."""

    def __init__(self, attn: nn.Module, rotary: nn.Module, rotate: Any, orders: int, sequential: tuple[bool, ...]):
        self.attn, self.rotary, self.rotate, self.orders, self.sequential = attn, rotary, rotate, orders, sequential

    def __call__(self, *args: Any, **kwargs: Any) -> tuple[Tensor, None]:
        return _tpe_forward(self.attn, self.rotary, self.rotate, self.orders, self.sequential, *args, **kwargs)


def _router_act(config: Any) -> nn.Module:
    """The config's ``hidden_act`` (transformers' ``ACT2FN``), as the reference's router uses; SiLU without one."""
    name = getattr(config, "hidden_act", None)
    if name is None:
        return nn.SiLU()
    from transformers.activations import ACT2FN

    if name not in ACT2FN:
        raise ValueError(f"config.hidden_act={name!r} is not an activation transformers knows")
    return ACT2FN[name]


def install_tpe(model: nn.Module, orders: int = 2, sequential_orders: Sequence[int] = (0,)) -> nn.Module:
    """Install 2D-TPE attention with ``orders`` orders on every decoder layer of ``model`` (in place).

    Args:
        model: a transformers ``LlamaForCausalLM`` / ``Qwen2ForCausalLM`` (or its ``.model``).
        orders: number of orders ``K`` (2 in 2D-TPE: row-major, column-major).
        sequential_orders: indices of orders whose positions follow the token sequence (the
            row-major order of a serialised table), attended without a permutation.

    Returns ``model``. The routers are new parameters (SwiGLU-style gates), in the dtype and on
    the device of each layer's ``q_proj``, initialised as the reference's ``from_pretrained``
    leaves them (transformers' ``_init_weights``: weights ``normal(0, config.initializer_range)``,
    0.02 by default, biases zero; the mix starts near ``1 / K``), with the config's
    ``hidden_act`` as the gate activation.
    """
    base, layers = decoder_layers(model)
    orders = check_int(orders, "orders")
    sequential_orders = check_ints(
        sequential_orders, "sequential_orders", 0, (0, math.inf), orders - 1, "order indices"
    )
    sequential = tuple(i in sequential_orders for i in range(orders))
    config = getattr(model, "config", getattr(base, "config", None))
    std = float(getattr(config, "initializer_range", 0.02))
    for layer in layers:
        attn = layer.self_attn
        for name in ("q_proj", "k_proj", "v_proj", "o_proj", "head_dim", "layer_idx"):
            if not hasattr(attn, name):
                raise TypeError(f"{type(attn).__name__} has no {name!r}: not a Llama- or Qwen2-style attention")
        heads = attn.q_proj.out_features // attn.head_dim
        if attn.q_proj.in_features != heads * attn.head_dim:
            raise ValueError(
                f"the 2D-TPE router reads head-sized slices of the hidden state: hidden_size "
                f"{attn.q_proj.in_features} must equal num_heads * head_dim = {heads} * {attn.head_dim}"
            )
        rotate = getattr(sys.modules[type(attn).__module__], "apply_rotary_pos_emb", None)
        if rotate is None:
            raise TypeError(f"the module of {type(attn).__name__} defines no apply_rotary_pos_emb")
        weight = attn.q_proj.weight
        router = TPERouter(attn.head_dim, orders, act=_router_act(config))
        with torch.no_grad():
            for lin in (router.gate_1, router.gate_2, router.gate_3):
                lin.weight.normal_(0.0, std)
                lin.bias.zero_()
        attn.tpe_router = router.to(device=weight.device, dtype=weight.dtype)
        attn.forward = _TPEForward(attn, base.rotary_emb, rotate, orders, sequential)
    return model


def uninstall_tpe(model: nn.Module) -> nn.Module:
    """Remove what :func:`install_tpe` added (routers and forwards); returns ``model``."""
    _, layers = decoder_layers(model)
    for layer in layers:
        attn = layer.self_attn
        attn.__dict__.pop("forward", None)
        if "tpe_router" in attn._modules:
            del attn._modules["tpe_router"]
    return model
