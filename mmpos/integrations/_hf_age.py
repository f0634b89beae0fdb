"""CircleRoPE's AGE inside a Hugging Face Qwen-VL model (:func:`mmpos.integrations.hf_rope.use_rope` ``age=``).

Paper: Wang et al. 2025, Circle-RoPE, AGE (https://arxiv.org/abs/2505.16416). Reference: lose4578/CircleRoPE
``modular_qwen2_5_vl_circle_rope.py``: ``forward`` computes the prompt's position ids twice (``get_rope_index``
with ``use_m_index`` False and True) and ``Qwen2_5_VLModel_AGE_mode`` calls the rotary module once per decoder
layer with the ids :func:`~mmpos.age.age_layers` picks for it.

A transformers text model calls its rotary module once per forward, ``rotary_emb(x, position_ids) -> (cos, sin)``,
and hands the pair to every decoder layer as ``position_embeddings``. Under AGE:

* :class:`AgeIndex` (the model's ``get_rope_index``) returns the Circle-RoPE ids and ``rope_deltas`` (the model
  decodes with them, as the reference's ``self.rope_deltas``) and hands the model's own ids of the same prompt,
  and the difference of the two ``rope_deltas``, to :class:`AgeRotary` (:meth:`AgeRotary.remember`);
* :class:`AgeRotary` (the text model's ``rotary_emb``) returns the Circle-RoPE ``(cos, sin)`` and keeps the own
  layout's pair, rotated by the same plan (the reference has one rotary module for both), in :attr:`AgeRotary.own`;
* a forward pre-hook on every decoder layer that reads the own layout replaces its ``position_embeddings`` by
  that pair (:func:`own_layer_hook`); a pre-hook on the text model tells the rotary where the call's tokens start
  in the cache (:func:`past_length_hook`), which places them: the prompt's (the own ids kept by the index) or
  tokens decoded after it (the call's Circle-RoPE ids plus the difference of the ``rope_deltas``).

No host sync in the forward (``torch.compile(fullgraph=True)`` traces the prefill and the decoding steps, with a
``DynamicCache`` or a ``StaticCache``): the prompt is told from the index having run (a Python flag) and the shapes,
the cache's length is read as the cache returns it (a Python int, or a tensor that picks the own ids by tensor
ops). One value check stays on the host: position ids that the caller passed (:func:`caller_ids_hook`) for a new
sequence the index did not place must be text positions (three equal rows), else the own layout is unknown; it runs
only where the host knows the sequence is new (no cache, or an empty cache of Python length), never while decoding.

By default (``decoding="per-layer"``) each layer keeps its own layout while decoding, so a cached ``generate``
equals a full forward over the generated sequence. The reference's decoding steps pass no ``position_ids_list``
(its ``flag_use_get_rope_index`` holds at the prefill only), so every layer reads the Circle-RoPE positions of the
new tokens there: ``decoding="reference"`` does the same (for a checkpoint trained or evaluated that way).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["AGE_DECODINGS", "AgeIndex", "AgeRotary", "caller_ids_hook", "own_layer_hook", "past_length_hook"]

#: how AGE places the tokens decoded after the prompt: ``"per-layer"`` (each layer keeps its layout) or
#: ``"reference"`` (every layer reads their Circle-RoPE positions, as lose4578/CircleRoPE's decoding steps do)
AGE_DECODINGS = ("per-layer", "reference")


def _rows(position_ids: Tensor) -> Tensor:
    """``(B, L)``, ``(1, B, L)`` or ``(3, B, L)`` ids as ``(3, B, L)``."""
    if position_ids.dim() == 2:
        position_ids = position_ids.unsqueeze(0)
    return position_ids.expand(3, -1, -1)


def _batched(t: Tensor, batch: int, dim: int) -> Tensor | None:
    """``t`` repeated along ``dim`` to ``batch`` rows, as transformers repeats ``rope_deltas`` (beams, samples);
    ``None`` where ``batch`` is not a multiple of its rows (another batch)."""
    if t.shape[dim] == batch:
        return t
    return None if batch % t.shape[dim] else t.repeat_interleave(batch // t.shape[dim], dim=dim)


class AgeRotary(nn.Module):
    """The text model's rotary module under AGE: ``forward(x, position_ids (3, B, L)) -> (cos, sin)`` of the
    Circle-RoPE positions (those the model passes), in the shape ``rotary`` returns; the own layout's pair of the
    same call in :attr:`own` (``None`` before the first call).

    No host sync while decoding (``torch.compile(fullgraph=True)`` traces it): where the call's tokens sit in the
    cache (:attr:`past`) is a Python int when the cache's length is one (a ``DynamicCache``: its keys' shape), else
    a tensor (a ``StaticCache``'s length, or transformers 4.x ``cache_position``), and the own ids are then picked by
    tensor ops. Whether the cache continues the remembered prompt (:attr:`live`) is a Python bool, or a ``(1,)``
    bool tensor where the host cannot know if the cache was emptied.

    Args:
        rotary: the plan (:class:`~mmpos.integrations.hf_rope.HFRotaryEmbedding`), shared by both layouts.
        layers: one flag per decoder layer, ``True`` where it reads Circle-RoPE (:func:`mmpos.age.age_layers`).
        decoding: one of :data:`AGE_DECODINGS`: the positions of the tokens decoded after the prompt.
    """

    def __init__(self, rotary: nn.Module, layers: tuple[bool, ...], decoding: str = "per-layer") -> None:
        super().__init__()
        if decoding not in AGE_DECODINGS:
            raise ValueError(f"age_decoding must be one of {AGE_DECODINGS}, got {decoding!r}")
        self.rotary = rotary
        self.layers = layers
        self.decoding = decoding
        self.own: tuple[Tensor, Tensor] | None = None
        #: where this call's tokens start in the cache (past_length_hook): an int, a 0-dim tensor (the cache's
        #: length) or an ``(n,)`` tensor (their cache positions); None: called outside the text model (0)
        self.past: int | Tensor | None = None
        #: the caller passed position_ids to the model (caller_ids_hook; True outside the model: unknown ids)
        self.given = True
        #: the cache continues the remembered prompt: a bool, or a (1,) bool tensor (a cache of tensor length)
        self.live: bool | Tensor = False
        self._prompt: tuple[Tensor, Tensor] | None = None  # the index's (circle ids, own ids), (3, B, L) each
        self._offset: Tensor | None = None  # (B, 1): own rope_deltas - circle rope_deltas
        self._fresh = False  # the index ran since the last prompt was read

    def remember(self, circle: tuple[Tensor, Tensor], own: tuple[Tensor, Tensor]) -> None:
        """Keep a prompt's two layouts: ``(position_ids (3, B, L), rope_deltas (B, 1))`` of each."""
        dtype = circle[0].dtype if circle[0].is_floating_point() else torch.float32
        self._prompt = (circle[0], own[0].to(dtype))
        self._offset = own[1].to(dtype) - circle[1].to(dtype)
        self._fresh = True

    def _positions(self, past: int | Tensor, n: int, device: torch.device) -> Tensor:
        """The cache positions ``(n,)`` of the call's ``n`` tokens."""
        if isinstance(past, Tensor) and past.dim() == 1:
            return past.to(device)
        return torch.arange(n, device=device) + (past.to(device) if isinstance(past, Tensor) else past)

    def _new_sequence(self, ids: Tensor, given: bool) -> Tensor:
        """A sequence the index did not place: one layout for every layer, its text positions."""
        self._prompt = self._offset = None
        self.live = False
        # the one host sync left: a value check of position ids the caller gave (a new sequence, known on the host)
        if given and not (torch.equal(ids[0], ids[1]) and torch.equal(ids[0], ids[2])):
            raise ValueError(
                "position_ids hold vision positions that get_rope_index did not compute, so the model's own "
                "layout of those tokens (AGE's other layers) is unknown: let the model compute its position ids "
                "(do not pass position_ids), or install circlerope without age"
            )
        return ids

    def _own_ids(self, ids: Tensor) -> Tensor:
        """The own layout's ids of the tokens whose Circle-RoPE ids are ``ids`` ``(3, B, n)``."""
        past, self.past = self.past, None
        past = 0 if past is None else past  # called outside the text model's forward: a new sequence
        given, self.given = self.given, True
        fresh, self._fresh = self._fresh, False
        # a new sequence, known on the host (an empty cache of Python length)
        new = not isinstance(past, Tensor) and past == 0
        if self._prompt is None:
            return self._new_sequence(ids, given) if new else ids
        circle, own = (_batched(t, ids.shape[1], 1) for t in self._prompt)
        length, n = self._prompt[0].shape[-1], ids.shape[-1]
        if fresh and not (new and (circle is None or n > length)):
            # the prompt the index placed: all of it, its first chunk, or its part after the cache (new vision tokens)
            self.live = True
        elif new:
            return self._new_sequence(ids, given)
        elif isinstance(past, Tensor) and self.live is not False:  # the cache may have been emptied (reset)
            self.live = self.live & (self._positions(past, n, ids.device)[:1] != 0)
        if self.live is False:
            return ids
        if circle is None:
            if isinstance(self.live, Tensor):  # an emptied static cache, a new batch: a new sequence
                self._prompt = self._offset = None
                self.live = False
                return ids
            raise ValueError(
                f"a batch of {ids.shape[1]} sequences continues a prompt of {self._prompt[0].shape[1]} (AGE positions)"
            )
        decoded = ids
        if self.decoding == "per-layer":  # decoded tokens: the own rope_deltas (the reference: Circle-RoPE)
            decoded = ids + _batched(self._offset, ids.shape[1], 0).to(ids.dtype)  # (B, 1) onto (3, B, n)
        if self.live is True and not isinstance(past, Tensor):  # Python positions: guards under compile, no sync
            if past >= length:
                return decoded
            if past + n <= length:  # the prompt, or the rest of it (a prefill in chunks)
                return own[..., past : past + n].to(ids.dtype)
        positions = self._positions(past, n, ids.device)  # (n,)
        placed = own.index_select(-1, positions.clamp(max=length - 1)).to(ids.dtype)  # (3, B, n)
        out = torch.where(positions < length, placed, decoded)
        return out if self.live is True else torch.where(self.live, out, ids)

    def forward(self, x: Tensor, position_ids: Tensor) -> tuple[Tensor, Tensor]:
        cos, sin = self.rotary(x, position_ids)
        ids = _rows(position_ids)
        own = self._own_ids(ids)
        self.own = (cos, sin) if own is ids else self.rotary(x, own)
        return cos, sin


class AgeIndex:
    """Bound to the model as ``get_rope_index``: ``circle(...)`` (the Circle-RoPE index, returned) and ``own(...)``
    (the model's own scheme) on the same arguments; both results go to ``rotary`` (:meth:`AgeRotary.remember`)."""

    def __init__(self, circle: Any, own: Any, rotary: AgeRotary) -> None:
        self.circle, self.own, self.rotary = circle, own, rotary

    def __call__(self, *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor]:
        circle = self.circle(*args, **kwargs)
        self.rotary.remember(circle, self.own(*args, **kwargs))
        return circle


def past_length_hook(rotary: AgeRotary):
    """Forward pre-hook (``with_kwargs``) on the text model: where the call's tokens start in its cache, for
    ``rotary`` (``cache`` from transformers 5.x, ``past_key_values`` before): the cache's length as it returns it
    (a ``DynamicCache``: a Python int; a ``StaticCache``: a tensor, or transformers 4.x ``cache_position`` where the
    model passes it) -- never read on the host."""

    def hook(module: nn.Module, args: Any, kwargs: dict[str, Any]) -> None:
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        length = 0 if cache is None else cache.get_seq_length()
        positions = kwargs.get("cache_position")
        rotary.past = positions if isinstance(length, Tensor) and positions is not None else length

    return hook


def caller_ids_hook(rotary: AgeRotary, forward: Any):
    """Forward pre-hook (``with_kwargs``) on the model that calls ``get_rope_index`` (its ``forward``): whether its
    caller passed ``position_ids`` (otherwise the model's own text positions reach the rotary, no ids to check)."""
    names = list(inspect.signature(forward).parameters)
    at = names.index("position_ids") if "position_ids" in names else None

    def hook(module: nn.Module, args: Any, kwargs: dict[str, Any]) -> None:
        ids = kwargs.get("position_ids", args[at] if at is not None and len(args) > at else None)
        rotary.given = ids is not None

    return hook


def own_layer_hook(rotary: AgeRotary):
    """Forward pre-hook (``with_kwargs``) on a decoder layer that reads the own layout: its ``position_embeddings``
    become ``rotary.own``, the own layout's ``(cos, sin)`` of this forward."""

    def hook(module: nn.Module, args: Any, kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        if "position_embeddings" not in kwargs:
            raise ValueError(
                f"{type(module).__name__} was called without position_embeddings: unknown decoder layout for AGE"
            )
        return args, {**kwargs, "position_embeddings": rotary.own}

    return hook
