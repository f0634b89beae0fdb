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
rule of :class:`mmpos.nn.MultiOrderCache`). Static caches: ``PreallocatedCache(capacity,
static=True)`` (4.57 and 5.x) and a transformers ``StaticCache`` whose layers size keys and values
apart (5.x only).

``torch.compile``: the forward without a cache and, with a static cache, every decode step are
one graph each (no graph break; decode steps do not recompile). A static layer counts its tokens
with a tensor; the layer never reads it on the host (eager or compiled: no sync). Compiled, it
attends over all ``S`` slots the cache returns with a ``(B, 1, n, S)`` mask built from tensors, so
every step has the same shapes (``tpe_mask`` ``(B, S)``, as ``generate`` pads it). Eagerly, a
``PreallocatedCache(static=True)`` layer also keeps its count on the host (a Python ``int`` its eager
updates advance), and the layer attends over the ``T`` filled slots only, as with a dynamic cache
(the same outputs; ``tpe_mask`` ``(B, T)`` or ``(B, S)``); after a compiled update that count is
unknown until ``crop`` / ``reset``, and eager steps attend over all slots, as transformers'
``StaticCache`` layers always do (eagerly a ``(B, T)`` mask then costs one read of the count).
On 4.57 a model called by hand under ``torch.compile`` needs ``cache_position`` (it computes it
from the cache's count otherwise; ``generate`` passes it). Dynamic caches (``DynamicCache``,
:class:`PreallocatedCache`) return ``T`` slots, a new shape each step.

``model.generate(input_ids, tpe_positions=..., tpe_mask=..., max_new_tokens=...)``: on a
``*ForCausalLM``, :func:`install_tpe` also replaces the instance's ``prepare_inputs_for_generation``
(and ``_expand_inputs_for_generation``). ``tpe_positions`` ``(K, B | 1, L)`` / ``tpe_mask``
``(B, L)`` cover the prompt's ``L`` tokens, checked once per call (a ``ValueError`` naming the
argument); each step gets the positions of its own tokens -- the prompt's, then generated token
``j`` at ``next_k + j`` under order ``k``, ``next_k`` = the largest position of a real prompt
token under that order plus one (the reference's ``tx[-1] + 1`` / ``ty[-1] + 1`` of
``src/inference.py``; for a :func:`mmpos.table.build` layout, ``next_position`` in every order)
-- and the mask of every token so far (generated tokens real). Without ``tpe_mask``, the padding
is read from the ``attention_mask`` that ``generate`` keeps. With a static cache, the decode steps
take their positions and ``(B, S)`` mask from the cache's count tensor (no host read; only the
prefill step reads the count, once per call). ``num_return_sequences`` and beams
repeat ``tpe_positions`` along its batch axis (dim 1). A cache passed to ``generate`` that holds
part of the prompt is accepted when the rest follows it in every order (a continuation after
text), and refused when it ends inside a table (chunked prefill).

Feature detection, not version strings: the cache argument is read as ``cache`` (5.x) or
``past_key_values`` (4.x); ``cache.update`` is called with its three positional arguments and
the ``cache_position`` the model passed (the 4.x static layers write there; 5.x counts itself);
``generate``'s hooks are patched where the instance has them, and the step's cache and tokens
are read from whichever keys its ``prepare_inputs_for_generation`` returned.
"""

from __future__ import annotations

import functools
import inspect
import math
import sys
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._extras import requires
from .._validate import check_bool, check_int, check_ints
from ..coords import Coords
from ..nn.multi_order import TPERouter, mix_orders, multi_order_sdpa, order_permutation, static_slots
from ..table import ORDER_SUFFIX

with requires("hf"):  # one line naming the package and the extra when it is missing
    from transformers.cache_utils import Cache, CacheLayerMixin, DynamicCache, DynamicLayer

__all__ = ["PreallocatedCache", "decoder_layers", "install_tpe", "uninstall_tpe"]


class _PreallocatedLayer(DynamicLayer):
    """A ``DynamicLayer`` whose ``keys`` / ``values`` are views of the first ``T`` slots of buffers that double.

    Every other method of ``DynamicLayer`` (``get_seq_length``, ``crop``, ``batch_select_indices``, ...)
    reads or reassigns ``keys`` / ``values``; an update writes after ``keys`` when they are still the
    views it returned (object identity: no ``data_ptr``, so ``torch.compile`` traces it), else
    (reassigned, e.g. by beam reordering or ``crop``) it copies them into new buffers first.
    """

    def __init__(self, capacity: int | None = None) -> None:
        super().__init__()
        self.capacity = capacity
        self._key_buffer: Tensor | None = None
        self._value_buffer: Tensor | None = None
        self._returned: tuple[Tensor, Tensor] | None = None  # the views the last update returned

    def _holds(self) -> bool:
        """``keys`` / ``values`` are the views of the buffers the last update returned (not a copy, not cut)."""
        return self._returned is not None and self.keys is self._returned[0] and self.values is self._returned[1]

    def update(self, key_states: Tensor, value_states: Tensor, *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor]:
        # key_states (B, Hk, n, Dk), value_states (B, Hk, n, Dv); the buffers (B, Hk, capacity, Dk / Dv)
        n = key_states.shape[-2]
        initialized = getattr(self, "is_initialized", False) and self.keys is not None and self.keys.dim() == 4
        t = self.keys.shape[-2] if initialized else 0
        have = 0 if self._key_buffer is None else self._key_buffer.shape[-2]
        holds = self._holds()
        if not holds or t + n > have:
            size = max(t + n, 2 * have if have and holds else (self.capacity or 0))
            old_k, old_v = (self.keys, self.values) if t else (None, None)
            self._key_buffer = key_states.new_empty((*key_states.shape[:2], size, key_states.shape[-1]))
            self._value_buffer = value_states.new_empty((*value_states.shape[:2], size, value_states.shape[-1]))
            if t:
                self._key_buffer[:, :, :t] = old_k
                self._value_buffer[:, :, :t] = old_v
        self._key_buffer[:, :, t : t + n] = key_states
        self._value_buffer[:, :, t : t + n] = value_states
        self.dtype, self.device, self.is_initialized = key_states.dtype, key_states.device, True
        self.keys, self.values = self._key_buffer[:, :, : t + n], self._value_buffer[:, :, : t + n]
        self._returned = (self.keys, self.values)
        return self.keys, self.values


class _StaticLayer(CacheLayerMixin):
    """A static layer that sizes keys and values apart: ``(B, Hk, S, Dk)`` and ``(B, Hk, S, Dv)``, ``S`` = ``capacity``.

    As transformers 5's ``StaticLayer`` (4.57's sizes values like keys, so it cannot hold 2D-TPE keys
    ``K * D`` wide): the buffers are allocated at the first update and written in place at slots
    ``n_seen .. n_seen + n - 1`` (``index_copy_``, :func:`~mmpos.nn.multi_order.static_slots`),
    ``n_seen`` is a 0-d int64 tensor incremented in place (``get_seq_length()``; 0 before the first
    update), and ``update`` returns every slot, so every step has the same shapes. Eager updates
    (``torch.compiler.is_compiling()`` false) also keep the count on the host (``_seen``, an ``int``;
    nothing is read from the device), which the 2D-TPE layer reads in eager mode to attend over the
    ``T`` filled slots only; a compiled update leaves it unknown (``None``) until ``crop`` / ``reset``.
    It has the layer methods of 4.57 and 5.x (``get_mask_sizes``, ``get_max_cache_shape`` /
    ``get_max_length``, ``crop`` with either release's argument, beams reordered in place).
    """

    is_compileable = True
    is_sliding = False
    is_croppable = True
    supports_early_init = False  # 5.x's early_initialization would size the keys like the values

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = self.max_cache_len = capacity
        self.n_seen = torch.zeros((), dtype=torch.long)
        self._seen: int | None = 0  # the count on the host, kept by eager updates (None: unknown)

    def lazy_initialization(self, key_states: Tensor, value_states: Tensor | None = None) -> None:
        value_states = key_states if value_states is None else value_states
        n = key_states.shape[-2]
        if n > self.capacity:
            raise ValueError(
                f"PreallocatedCache(capacity={self.capacity}, static=True) cannot hold the {n} tokens of its first "
                f"update: give it capacity >= {n} (the prompt plus the tokens to generate)"
            )
        self.dtype, self.device = key_states.dtype, key_states.device
        self.max_batch_size = self.batch_size = key_states.shape[0]
        self.num_heads = key_states.shape[1]
        self.keys = key_states.new_zeros((*key_states.shape[:2], self.capacity, key_states.shape[-1]))
        self.values = value_states.new_zeros((*value_states.shape[:2], self.capacity, value_states.shape[-1]))
        self.n_seen = self.n_seen.to(self.device)
        if not torch.compiler.is_compiling():  # fixed addresses for CUDA graphs, as transformers' StaticLayer
            for t in (self.keys, self.values, self.n_seen):
                torch._dynamo.mark_static_address(t)
        self.is_initialized = True

    def update(self, key_states: Tensor, value_states: Tensor, *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor]:
        # key_states (B, Hk, n, Dk), value_states (B, Hk, n, Dv) -> all S slots (B, Hk, S, Dk / Dv)
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        for name, new, held in (("keys", key_states, self.keys), ("values", value_states, self.values)):
            if new.shape[:2] != held.shape[:2] or new.shape[-1] != held.shape[-1]:
                raise ValueError(
                    f"PreallocatedCache(static=True): new {name} {tuple(new.shape)} do not match the layer's "
                    f"(B, Hk, S, D) = {tuple(held.shape)}"
                )
        name = f"PreallocatedCache(capacity={self.capacity}, static=True)"
        n = key_states.shape[-2]
        known = None if torch.compiler.is_compiling() else self._seen
        slots = static_slots(self.n_seen, n, self.capacity, name, known)
        self.keys.index_copy_(2, slots, key_states.to(self.keys.dtype))
        self.values.index_copy_(2, slots, value_states.to(self.values.dtype))
        self.n_seen.add_(n)
        self._seen = None if known is None else known + n  # a compiled update: unknown on the host until crop
        return self.keys, self.values

    def get_mask_sizes(self, *args: Any) -> tuple[int, int]:  # (cache_position) in 4.57, (query_length) in 5.x
        return self.capacity, 0

    def get_seq_length(self) -> int | Tensor:
        return self.n_seen if self.is_initialized else 0

    def get_max_cache_shape(self) -> int:  # 4.57
        return self.capacity

    def get_max_length(self) -> int:  # 5.x
        return self.capacity

    def reset(self) -> None:
        if self.is_initialized:
            self.keys.zero_()
            self.values.zero_()
        self.n_seen.zero_()  # in place: compiled steps hold its address
        self._seen = 0

    def crop(self, length: int) -> None:
        """Keep ``length`` tokens (4.57's ``max_length``), or drop ``-length`` (5.x's ``tokens_to_remove`` < 0).

        Reads the count once (a host sync on a GPU; ``crop`` runs between forwards).
        """
        if self.is_initialized:
            held = int(self.n_seen)
            self._seen = max(0, held + length) if length < 0 else min(length, held)
            self.n_seen.fill_(self._seen)

    def reorder_cache(self, beam_idx: Tensor) -> None:
        if self.is_initialized:  # in place: the buffers keep their addresses
            self.keys.copy_(self.keys.index_select(0, beam_idx.to(self.device)))
            self.values.copy_(self.values.index_select(0, beam_idx.to(self.device)))

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.is_initialized:
            self.keys = self.keys.repeat_interleave(repeats, dim=0)
            self.values = self.values.repeat_interleave(repeats, dim=0)
            self.max_batch_size = self.batch_size = self.keys.shape[0]

    def batch_select_indices(self, indices: Tensor) -> None:
        if self.is_initialized:
            self.keys, self.values = self.keys[indices, ...], self.values[indices, ...]
            self.max_batch_size = self.batch_size = self.keys.shape[0]


class PreallocatedCache(DynamicCache):
    """A transformers ``DynamicCache`` whose layers write into preallocated buffers (doubling, or static).

    For decoding through :func:`install_tpe` (keys ``(B, Hk, T, K * D)``, values ``(B, Hk, T, D)``) or
    any model: an update writes the new tokens (amortised ``O(new tokens)`` copying) where the default
    ``DynamicCache`` concatenates every cached key (``O(T)`` a step). Results are the same.

    Args:
        capacity: tokens each layer allocates room for at its first update (``None``: that update's
            length); the buffers double when full. Required with ``static=True``.
        static: fixed size for ``torch.compile`` (transformers 4.57 and 5.x): each layer holds
            ``capacity`` slots, keys and values sized apart, counts its tokens with a 0-d tensor and
            returns all slots from ``update``, so a decode step has the same shapes every time (one
            graph); ``is_compileable`` is ``True`` (``generate`` compiles its decode steps on a GPU,
            or where ``compile_config`` asks). An update that does not fit is refused
            (:func:`~mmpos.nn.multi_order.static_slots`); ``generate`` checks each step first.

    ``model(ids, ..., use_cache=True, past_key_values=PreallocatedCache(capacity=L + new_tokens))``
    (``cache=`` on transformers 5).
    """

    def __init__(self, capacity: int | None = None, static: bool = False) -> None:
        capacity = check_int(capacity, "capacity", none_ok=True)
        static = check_bool(static, "static")
        if static and capacity is None:
            raise ValueError("capacity must be a positive int with static=True (each layer's fixed size), got None")
        layer = _StaticLayer if static else _PreallocatedLayer
        Cache.__init__(self, layer_class_to_replicate=functools.partial(layer, capacity))
        self.capacity, self.static = capacity, static

    @property
    def is_compileable(self) -> bool:
        # static: True before the first update too (generate decides before its prefill creates the layers); the
        # doubling layers never are. A plain attribute read (dynamo cannot trace a property through super())
        return self.static


def decoder_layers(model: nn.Module) -> tuple[nn.Module, Sequence[nn.Module]]:
    """``(text model, its decoder layers)`` of a ``*ForCausalLM`` or a bare text model."""
    base = getattr(model, "model", model)
    layers = getattr(base, "layers", None)
    if layers is None or not hasattr(base, "rotary_emb"):
        raise TypeError(
            f"model must be a Llama- or Qwen2-style text model (a .layers list and a .rotary_emb), got {type(model).__name__}"
        )
    return base, layers


def _slot_count(cache: Any, layer_idx: int) -> int | None:
    """Key slots of ``cache``'s layer ``layer_idx`` when it is a static layer holding tokens, else ``None``.

    Feature detection: a static layer (transformers' ``StaticLayer``) counts its tokens with a tensor
    (``get_seq_length()`` is a tensor, so counting needs no host sync) and returns all ``S``
    preallocated slots from ``update``; a dynamic layer counts with an int and returns the ``T`` it holds.
    """
    layers = getattr(cache, "layers", None)
    if layers is None or layer_idx >= len(layers):
        return None
    layer = layers[layer_idx]
    if not getattr(layer, "is_initialized", False) or not isinstance(layer.get_seq_length(), Tensor):
        return None
    return layer.keys.shape[-2]


def _host_count(cache: Any, layer_idx: int) -> int | None:
    """The tokens a :class:`PreallocatedCache` ``static=True`` layer holds, as its eager updates counted them
    on the host (``None``: another cache, under ``torch.compile``, or unknown after a compiled update)."""
    layers = getattr(cache, "layers", None)
    if torch.compiler.is_compiling() or layers is None or layer_idx >= len(layers):
        return None
    layer = layers[layer_idx]
    return layer._seen if isinstance(layer, _StaticLayer) else None


def _order_ranks(pos: Tensor, real: Tensor, sequential: bool) -> Tensor:
    """Each token's rank ``(B, n)`` in its order's causal traversal: sequence order for a sequential
    order, else the stable sort of ``pos`` ``(B, n)`` with padding (``real`` False) last -- the
    traversal :func:`~mmpos.nn.multi_order.multi_order_sdpa` attends in."""
    if sequential:
        return torch.arange(pos.shape[-1], device=pos.device).expand_as(pos)
    return order_permutation(pos, real)[1]


def _cached_attention(
    qs: list[Tensor],
    ks: list[Tensor],
    v: Tensor,
    positions: Tensor,
    key_mask: Tensor | None,
    past: int | Tensor,
    sequential: tuple[bool, ...],
) -> Tensor:
    """Attention of ``n`` new tokens over the ``S`` key slots a cache returned: ``(K, B, Hq, n, D)``.

    ``qs`` ``K x (B, Hq, n, D)``, ``ks`` ``K x (B, Hk, S, D)``, ``v`` ``(B, Hk, S, D)``: slots
    ``0 .. past - 1`` are cached tokens, ``past .. past + n - 1`` the new ones, the rest (a static
    cache's unused slots) are never attended. ``key_mask`` ``(B, S)`` bool (``True`` on real tokens,
    ``None``: all real), ``past`` an int or a 0-d tensor (a static cache's counter: no host sync,
    one graph for every decode step). A new token attends to every real cached token (new tokens
    follow the cached ones in every order) and, under order ``k``, to the new tokens before it in
    that order's traversal (generated tokens: causal; a prompt fed after an empty cache: the
    prefill rule of :func:`~mmpos.nn.multi_order.multi_order_sdpa`, padding queries seeing
    themselves). The mask is ``(B, 1, n, S)`` of fixed size, built from tensors only.
    """
    b, _, n, _ = qs[0].shape
    slots, dev = v.shape[-2], v.device
    gqa = qs[0].shape[1] != v.shape[1]
    if isinstance(past, int) and key_mask is None and n == 1 and slots == past + 1:  # sees every key: SDPA fast path
        return torch.stack([F.scaled_dot_product_attention(qi, ki, v, enable_gqa=gqa) for qi, ki in zip(qs, ks)])
    rel = torch.arange(slots, device=dev) - past  # (S,): slot index relative to the first new token
    if n == 1:  # one new token: the real cached ones and itself, in every order (no traversal to rank)
        allowed = rel <= 0 if key_mask is None else ((rel < 0) & key_mask) | (rel == 0)  # (S,) / (B, S)
        allowed = allowed.expand(b, slots)[:, None, None, :]  # (B, 1, 1, S), shared by the orders
        return torch.stack(
            [F.scaled_dot_product_attention(qi, ki, v, attn_mask=allowed, enable_gqa=gqa) for qi, ki in zip(qs, ks)]
        )
    new_slot = (rel >= 0) & (rel < n)
    pick = rel.clamp(0, n - 1).expand(b, n, slots)  # (B, n, S): the new token each slot holds
    if key_mask is None:
        real = torch.ones(b, n, dtype=torch.bool, device=dev)
        cached = (rel < 0).expand(b, n, slots)
    else:
        real = key_mask.gather(1, (torch.arange(n, device=dev) + past).expand(b, n))  # (B, n): the new tokens
        cached = (rel < 0) & key_mask[:, None, :]  # (B, 1, S)
    own = torch.eye(n, dtype=torch.bool, device=dev) & ~real[:, :, None]  # (B, n, n): padding queries see themselves
    outs = []
    for i, (qi, ki) in enumerate(zip(qs, ks)):
        rank = _order_ranks(positions[i].expand(b, n), real, sequential[i])  # (B, n)
        among = ((rank[:, None, :] <= rank[:, :, None]) & real[:, None, :]) | own  # (B, n query, n key)
        allowed = torch.where(new_slot, among.gather(2, pick), cached)  # (B, n, S)
        outs.append(F.scaled_dot_product_attention(qi, ki, v, attn_mask=allowed[:, None], enable_gqa=gqa))
    return torch.stack(outs)


def _step_mask(key_mask: Any, b: int, n: int, past: int | Tensor, slots: int | None) -> Tensor | None:
    """``tpe_mask`` checked: ``(B, T)`` (``T`` = cached + new tokens) or, with a static cache, ``(B, S)``.

    Returns it as bool ``(B, S)`` for a static cache (padded with ``True``: the slots after the new
    tokens are never attended), else ``(B, T)``. Under ``torch.compile`` a static cache's count is a
    tensor and only ``(B, S)`` (fixed for every step, as ``generate`` passes it) can be checked;
    eagerly a ``(B, T)`` mask is checked from the host count (``past`` an ``int``: a
    :class:`PreallocatedCache` static layer's), else with one read of the count (``(B, S)`` needs none).
    """
    if key_mask is None:
        return None
    if not isinstance(past, int) and not torch.compiler.is_compiling():
        width = key_mask.shape[-1] if isinstance(key_mask, Tensor) and key_mask.dim() == 2 else None
        if width != slots:  # eager, not (B, S): checking (B, T) reads the count once ((B, S) needs no read)
            past = int(past)
    traced = not isinstance(past, int)
    want = [] if traced else [past + n]
    want += [] if slots is None or slots in want else [slots]
    if (
        not isinstance(key_mask, Tensor)
        or key_mask.dim() != 2
        or key_mask.shape[0] != b
        or key_mask.shape[1] not in want
    ):
        shape = tuple(key_mask.shape) if isinstance(key_mask, Tensor) else type(key_mask).__name__
        expected = " or ".join(f"({b}, {w})" for w in want)
        what = "cached plus new tokens" + (", or the static cache's slots" if slots is not None else "")
        name = "(B, T)"
        if traced:
            name, what = "(B, S)", "the static cache's slots: under torch.compile its token count is a tensor"
        raise ValueError(f"tpe_mask must be {name} = {expected} bool ({what}), got {shape}")
    key_mask = key_mask.bool()
    if slots is not None and key_mask.shape[1] != slots:
        key_mask = torch.cat([key_mask, key_mask.new_ones(b, slots - key_mask.shape[1])], dim=1)
    return key_mask


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
    cache = kwargs.get("cache", kwargs.get("past_key_values"))
    b, n, _ = hidden_states.shape
    positions = _order_positions(positions, orders, b, n)
    past = 0 if cache is None else cache.get_seq_length(attn.layer_idx)  # an int, or a static layer's tensor
    live = None  # eager, a PreallocatedCache static layer's count on the host: attend over its T filled slots
    if isinstance(past, Tensor):  # the layer's counter itself, which its update increments in place: a copy,
        live = _host_count(cache, attn.layer_idx)  # never read on the host (eager or compiled: no sync;
        past = past.clone() if live is None else live  # compiled: one graph every step)
    slots = None if cache is None else _slot_count(cache, attn.layer_idx)
    key_mask = _step_mask(kwargs.get("tpe_mask"), b, n, past, slots)
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
    prefill = isinstance(past, int) and past == 0
    if cache is not None:  # keys (B, Hk, S, K * D): S = T (dynamic layers) or all the slots of a static layer
        where = kwargs.get("cache_position")
        extra = () if where is None else ({"cache_position": where},)
        try:
            keys, values = cache.update(torch.cat(ks, dim=-1), v, attn.layer_idx, *extra)
        except RuntimeError as e:
            if orders == 1:
                raise
            raise ValueError(
                f"{type(cache).__name__} could not store 2D-TPE keys (B, Hk, T, {orders} * {d}) beside values "
                f"(B, Hk, T, {d}); a cache whose layers allocate values as wide as keys (transformers' StaticCache "
                "before 5) cannot hold them: use mmpos.integrations.hf_tpe.PreallocatedCache(capacity=...)"
            ) from e
        if live is not None:  # eager: the filled slots only (the others are never attended; same outputs)
            keys, values = keys[:, :, : live + n], values[:, :, : live + n]
            key_mask = None if key_mask is None else key_mask[:, : live + n]
        if not prefill:
            ks, v = list(keys.split(d, dim=-1)), values
    if prefill:  # the new tokens alone, in each order's traversal (also what a static cache's first update holds)
        mask = None if key_mask is None else key_mask[:, :n]
        out = multi_order_sdpa(qs, ks, v, positions, mask, True, sequential)
    else:
        out = _cached_attention(qs, ks, v, positions, key_mask, past, sequential)
    out = mix_orders(out, attn.tpe_router(hidden_states))
    return attn.o_proj(out.transpose(1, 2).reshape(b, n, -1)), None


def _as_positions(positions: Any, orders: int) -> Tensor:
    """``tpe_positions`` as a ``(K, B, L)`` tensor (a ``Coords`` converted), checked by its order count and axes."""
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
    return positions


def _order_positions(positions: Any, orders: int, batch: int, tokens: int) -> Tensor:
    """``tpe_positions`` as ``(K, B, L)`` int64, checked by shape and, for a ``Coords``, by its axes (static)."""
    positions = _as_positions(positions, orders)
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


def _generation_positions(
    positions: Any, mask: Any, attention_mask: Any, orders: int, batch: int, past: int, tokens: int
) -> tuple[Tensor, Tensor | None]:
    """``(tpe_positions, tpe_mask)`` of one ``generate`` step, from those given for the prompt.

    ``positions`` ``(K, B | 1, L0)`` (or an order ``Coords``) and ``mask`` ``(B, L0)`` cover the
    ``L0`` tokens of the prompt; the step feeds ``tokens`` new tokens after ``past`` cached ones
    (``T = past + tokens``). Generated token ``j`` (sequence index ``L0 + j``) sits at
    ``next_k + j`` under order ``k``, ``next_k`` = the largest position of a real prompt token
    under that order plus one (the reference's ``tx[-1] + 1``, ``ty[-1] + 1``; for a
    :func:`mmpos.table.build` layout, ``next_position`` in every order). Returns the positions
    ``(K, B | 1, tokens)`` of this step's tokens and the mask ``(B, T)`` (``None``: no padding).
    Without ``mask``, the ``(B, T)`` ``attention_mask`` that ``generate`` keeps marks the padding.
    """
    if positions is None:
        raise ValueError(
            "generate on a model with 2D-TPE attention needs tpe_positions=(K, B, L): the positions of the "
            "prompt's L tokens under each order (mmpos.table.TableLayout.order_coords or its (K, B, L) tensor)"
        )
    positions = _as_positions(positions, orders)  # (K, B0, L0)
    _, b0, l0 = positions.shape
    t = past + tokens
    if b0 not in (1, batch) or l0 > t:
        raise ValueError(
            f"tpe_positions {tuple(positions.shape)} must be (K={orders}, B, L) for the prompt of generate, "
            f"B = 1 or {batch}, L <= the {t} tokens so far"
        )
    if mask is not None:
        mask = _prompt_mask(mask, batch, l0)
        real = positions.masked_fill(~mask, -1)  # (K, B, L0): padding never sets the next position
        mask = torch.cat([mask, mask.new_ones(batch, t - l0)], dim=1)  # generated tokens are real
    else:
        real = positions
        marks = isinstance(attention_mask, Tensor) and tuple(attention_mask.shape) == (batch, t)
        if marks and not bool(attention_mask.all()):  # padding marked by generate's attention_mask (eager, per step)
            mask = attention_mask.bool()
            real = positions.masked_fill(~mask[:, :l0], -1)
    if 0 < past < l0:  # a cache holding part of the prompt (a continuation): the rest must follow it in every order
        _check_follows(positions, real, past, min(t, l0))
    pieces = [positions[..., past : min(t, l0)]] if past < l0 else []
    if t > l0:  # generated tokens: next_k + j, j = sequence index - L0
        steps = torch.arange(max(past, l0) - l0, t - l0, device=positions.device, dtype=positions.dtype)
        pieces.append(real.amax(-1, keepdim=True) + 1 + steps)
    if len(pieces) == 2 and pieces[0].shape[1] != pieces[1].shape[1]:
        pieces[0] = pieces[0].expand(-1, pieces[1].shape[1], -1)
    return torch.cat(pieces, dim=-1), mask


def _prompt_mask(mask: Any, batch: int, l0: int) -> Tensor:
    """``tpe_mask`` of the prompt of ``generate``, checked: ``(B, L0)`` bool."""
    if not isinstance(mask, Tensor) or tuple(mask.shape) != (batch, l0):
        shape = tuple(mask.shape) if isinstance(mask, Tensor) else type(mask).__name__
        raise ValueError(
            f"tpe_mask must be ({batch}, {l0}) bool for the prompt of generate (as tpe_positions), got {shape}"
        )
    return mask.bool()


def _static_step_positions(
    positions: Any, mask: Any, attention_mask: Any, orders: int, batch: int, past: Tensor, tokens: int, slots: int
) -> tuple[Tensor, Tensor | None]:
    """``(tpe_positions, tpe_mask)`` of a ``generate`` decode step on a static cache, from tensors only.

    As :func:`_generation_positions` for a step whose cached ``past`` tokens (a 0-d tensor, the
    static layer's count: never read on the host) hold the whole prompt: the step's ``tokens``
    generated tokens ``j = past - L0 + i`` sit at ``next_k + j``; returns their positions
    ``(K, B | 1, tokens)`` and the mask ``(B, S)`` of the cache's ``slots`` (the prompt's padding,
    then ``True``: generated tokens are real, the slots after the new tokens are never attended),
    ``None`` without padding information. Without ``mask``, the prompt's padding is read from
    ``generate``'s ``attention_mask`` ``(B, T)`` (its first ``L0`` columns) and always passed on:
    whether it holds padding is not checked on the host.
    """
    positions = _as_positions(positions, orders)  # (K, B0, L0)
    _, b0, l0 = positions.shape
    if b0 not in (1, batch) or l0 > slots:
        raise ValueError(
            f"tpe_positions {tuple(positions.shape)} must be (K={orders}, B, L) for the prompt of generate, "
            f"B = 1 or {batch}, L <= the {slots} slots of the static cache"
        )
    if mask is not None:
        mask = _prompt_mask(mask, batch, l0)
    elif isinstance(attention_mask, Tensor) and attention_mask.dim() == 2 and attention_mask.shape[0] == batch:
        mask = attention_mask[:, :l0].bool() if attention_mask.shape[1] >= l0 else None
    real = positions if mask is None else positions.masked_fill(~mask, -1)  # padding never sets the next position
    steps = (past - l0).to(positions.device) + torch.arange(tokens, device=positions.device)  # (tokens,): j
    new = real.amax(-1, keepdim=True) + 1 + steps  # (K, B0, tokens)
    if mask is not None:
        mask = torch.cat([mask, mask.new_ones(batch, slots - l0)], dim=1)  # (B, S)
    return new, mask


def _check_follows(positions: Tensor, real: Tensor, past: int, stop: int) -> None:
    """Prompt tokens ``past:stop`` fed after ``past`` cached ones follow every cached real token in every order.

    The layer lets tokens after a cached prefix attend to the whole prefix (they follow it in
    every order); a prefix that ends inside a table (chunked prefill) breaks that rule, so it is
    refused rather than computed wrong. ``real``: ``positions`` with padding at -1.
    """
    cached = real[..., :past].amax(-1)  # (K, B)
    new = positions[..., past:stop].masked_fill(real[..., past:stop] < 0, positions.max() + 1)
    if bool((new.amin(-1) <= cached).any()):
        raise ValueError(
            f"tpe_positions: the cache holds {past} of the prompt's {positions.shape[-1]} tokens and the rest do not "
            "follow them in every order; 2D-TPE needs the part of the prompt that is not cached to come after the "
            "cached part under every order (prefill a table in one forward: no prefill_chunk_size)"
        )


def _check_prompt(positions: Any, mask: Any, orders: int, batch: int, tokens: int) -> None:
    """``tpe_positions`` ``(K, 1 | B, L)`` and ``tpe_mask`` ``(B, L)`` given to ``generate`` for a ``(B, L)`` prompt."""
    positions = _as_positions(positions, orders)
    if positions.shape[1] not in (1, batch) or positions.shape[2] != tokens:
        raise ValueError(
            f"tpe_positions {tuple(positions.shape)} must be (K={orders}, B, L) for the prompt of generate: "
            f"B = 1 or {batch}, L = its {tokens} tokens"
        )
    if mask is not None and (not isinstance(mask, Tensor) or tuple(mask.shape) != (batch, tokens)):
        shape = tuple(mask.shape) if isinstance(mask, Tensor) else type(mask).__name__
        raise ValueError(f"tpe_mask must be ({batch}, {tokens}) bool for the prompt of generate, got {shape}")


def _bound(model: nn.Module, name: str) -> Any:
    """``model``'s class attribute ``name`` bound to ``model`` (a method or a staticmethod alike), past instance patches."""
    return inspect.getattr_static(type(model), name).__get__(model, type(model))


class _TPEPrepareInputs:
    """The patched ``model.prepare_inputs_for_generation``: each step's ``tpe_positions`` / ``tpe_mask``.

    ``generate`` hands the prompt's ``tpe_positions`` / ``tpe_mask`` unchanged to every step; this
    calls the model's own ``prepare_inputs_for_generation`` and replaces them by the positions of
    the step's tokens and the mask of every token so far (:func:`_generation_positions`). The number
    of cached tokens is read from the cache the step uses (``cache`` in 5.x, ``past_key_values`` in
    4.x), the step's tokens from ``input_ids`` or ``inputs_embeds``. A static cache (its count a
    tensor) is not read on the host once the sequence ``generate`` holds is longer than the prompt
    (every prompt token cached): the step's positions are computed from the count tensor
    (:func:`_static_step_positions`), so a decode step syncs nothing; the prefill step still reads
    the count once (a continuation of a cache that holds part of the prompt is checked on the host).
    """

    def __init__(self, model: nn.Module, orders: int) -> None:
        self.model, self.orders = model, orders

    def __call__(
        self,
        input_ids: Tensor,
        *args: Any,
        tpe_positions: Any = None,
        tpe_mask: Any = None,
        inputs_embeds: Tensor | None = None,  # named so that generate accepts inputs_embeds
        **kwargs: Any,
    ) -> dict[str, Any]:
        if inputs_embeds is not None:
            kwargs["inputs_embeds"] = inputs_embeds
        inputs = _bound(self.model, "prepare_inputs_for_generation")(input_ids, *args, **kwargs)
        current = inputs.get("input_ids")
        current = inputs.get("inputs_embeds") if current is None else current
        cache = inputs.get("cache", inputs.get("past_key_values"))
        batch, tokens = current.shape[:2]
        slots = _slot_count(cache, 0)  # None before a static cache's first update (the prefill: (B, L) mask)
        room = cache.capacity if isinstance(cache, PreallocatedCache) and cache.static else slots
        prompt = _as_positions(tpe_positions, self.orders).shape[-1] if tpe_positions is not None else None
        if slots is not None and prompt is not None and input_ids.shape[1] > prompt:
            # a decode step on a static cache: input_ids holds the whole sequence (the prompt's ids, if any, and
            # every generated token), so every prompt token is cached; nothing is read from the device
            if input_ids.shape[1] > room:  # on the host: generate's sequence length (a lower bound for embeds)
                raise ValueError(
                    f"the static cache holds {room} tokens: {input_ids.shape[1] - tokens} cached and {tokens} new do "
                    "not fit (give it room for the prompt plus max_new_tokens)"
                )
            positions, mask = _static_step_positions(
                tpe_positions, tpe_mask, kwargs.get("attention_mask"), self.orders, batch, cache.get_seq_length(),
                tokens, slots,
            )  # fmt: skip
            inputs["tpe_positions"], inputs["tpe_mask"] = positions, mask
            return inputs
        past = int(cache.get_seq_length()) if isinstance(cache, Cache) else 0
        positions, mask = _generation_positions(
            tpe_positions, tpe_mask, kwargs.get("attention_mask"), self.orders, batch, past, tokens
        )
        if room is not None and past + tokens > room:  # on the host, before the forward (past is read above)
            raise ValueError(
                f"the static cache holds {room} tokens: {past} cached and {tokens} new do not fit (give it room for "
                "the prompt plus max_new_tokens)"
            )
        if mask is not None and slots is not None and slots > mask.shape[1]:  # one (B, S) mask shape every step
            mask = torch.cat([mask, mask.new_ones(batch, slots - mask.shape[1])], dim=1)
        inputs["tpe_positions"], inputs["tpe_mask"] = positions, mask
        return inputs


class _TPEExpandInputs:
    """The patched ``model._expand_inputs_for_generation`` (beams, ``num_return_sequences``).

    transformers repeats every tensor of the model kwargs along dim 0; ``tpe_positions``
    ``(K, B, L)`` has its batch in dim 1, so it is taken out and repeated there.
    """

    def __init__(self, model: nn.Module, orders: int) -> None:
        self.model, self.orders = model, orders

    def __call__(self, expand_size: int = 1, *args: Any, **kwargs: Any) -> Any:
        positions = kwargs.pop("tpe_positions", None)
        prompt = kwargs.get("inputs_embeds")
        prompt = kwargs.get("input_ids") if prompt is None else prompt
        if positions is not None and isinstance(prompt, Tensor):  # once per generate call: the prompt's shapes
            _check_prompt(positions, kwargs.get("tpe_mask"), self.orders, *prompt.shape[:2])
        input_ids, model_kwargs = _bound(self.model, "_expand_inputs_for_generation")(expand_size, *args, **kwargs)
        if positions is not None:
            positions = _as_positions(positions, self.orders)  # (K, B, L), B = 1 broadcasts
            if positions.shape[1] != 1:  # sample b's copies at rows b * expand_size + j, as input_ids
                positions = positions.repeat_interleave(expand_size, dim=1)
            model_kwargs["tpe_positions"] = positions
        return input_ids, model_kwargs


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
    ``hidden_act`` as the gate activation. A model with ``generate`` gets its
    ``prepare_inputs_for_generation`` (and ``_expand_inputs_for_generation``) replaced on the
    instance, so ``model.generate(ids, tpe_positions=..., tpe_mask=...)`` decodes with 2D-TPE
    (see the module docstring).
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
    if callable(getattr(model, "generate", None)) and callable(getattr(model, "prepare_inputs_for_generation", None)):
        model.prepare_inputs_for_generation = _TPEPrepareInputs(model, orders)
        if callable(getattr(model, "_expand_inputs_for_generation", None)):
            model._expand_inputs_for_generation = _TPEExpandInputs(model, orders)
    return model


def uninstall_tpe(model: nn.Module) -> nn.Module:
    """Remove what :func:`install_tpe` added (routers, forwards, ``generate`` hooks); returns ``model``."""
    _, layers = decoder_layers(model)
    for layer in layers:
        attn = layer.self_attn
        attn.__dict__.pop("forward", None)
        if "tpe_router" in attn._modules:
            del attn._modules["tpe_router"]
    for name in ("prepare_inputs_for_generation", "_expand_inputs_for_generation"):
        if isinstance(model.__dict__.get(name), (_TPEPrepareInputs, _TPEExpandInputs)):
            del model.__dict__[name]
    return model
