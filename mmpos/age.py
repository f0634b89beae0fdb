"""CircleRoPE's Alternating Geometry Encoding (AGE): which decoder layers read Circle-RoPE positions.

Paper: Wang et al. 2025, "Circle-RoPE: Cone-like Decoupled Rotary Positional Embedding for Large
Vision-Language Models" (https://arxiv.org/abs/2505.16416; its Alternating Geometry Encoding). Reference:
lose4578/CircleRoPE ``modular_qwen2_5_vl_circle_rope.py`` (``AGE_index_dict``; ``Qwen2_5_VLModel_AGE_mode``
computes the rotation of each decoder layer from its own position ids).

Under AGE the layers of one decoder read two layouts of the same tokens: the ``circlerope`` layout (the
vision tokens on a ring orthogonal to the text axis, :mod:`mmpos.schemes`) and the model's own, Qwen2.5-VL's
(``qwen2.5-vl``; the reference's ``use_m_index``). A layout gives one set of positions, so AGE is a choice of
the model, made per layer:

* :func:`age_layers` ``(strategy, depth)`` -> ``depth`` flags, ``True`` where a layer reads Circle-RoPE;
* :func:`age_coords` ``(strategy, circle, other)`` -> one :class:`~mmpos.coords.Coords` per layer, for
  :class:`mmpos.nn.Transformer` (``forward(x, coords=[...])``);
* :func:`mmpos.integrations.hf_rope.use_rope` ``(model, "circlerope", age=strategy)`` does the same inside a
  Hugging Face Qwen-VL model.

The reference's strategies (:data:`AGE_STRATEGIES`) are lists for Qwen2.5-VL-3B's 36 layers (it asserts that
depth): ``strategy_2`` the first 18 layers on Circle-RoPE, ``strategy_3`` the last 18, ``strategy_4`` the even
layers 0, 2, ..., 34. mmpos states them as rules of the depth -- the first / last ``depth // 2`` layers, the even
layers -- so that they reach other depths (Qwen2.5-VL-7B's 28 layers: 14 and 14); at depth 36 they are the
reference's lists. Its ``code/config.json`` names a ``strategy_1`` that its table lacks: refused here. A strategy
may also be given as the flags themselves (a sequence of ``depth`` bools).
"""

from __future__ import annotations

from collections.abc import Sequence

from ._validate import check_int
from .coords import Coords

__all__ = ["AGE_STRATEGIES", "age_coords", "age_layers"]

#: the reference's ``AGE_index_dict`` keys: ``strategy_2`` (first half on Circle-RoPE), ``strategy_3`` (second
#: half), ``strategy_4`` (even layers)
AGE_STRATEGIES = ("strategy_2", "strategy_3", "strategy_4")


def age_layers(strategy: str | Sequence[bool], depth: int) -> tuple[bool, ...]:
    """``depth`` flags: ``True`` for the decoder layers that read Circle-RoPE positions under AGE ``strategy``,
    ``False`` for those that read the model's own (Qwen2.5-VL's).

    Args:
        strategy: one of :data:`AGE_STRATEGIES`, or the flags themselves (``depth`` bools).
        depth: the number of decoder layers (> 0).
    """
    depth = check_int(depth, "depth")
    if isinstance(strategy, str):
        if strategy not in AGE_STRATEGIES:
            raise ValueError(f"strategy must be one of {AGE_STRATEGIES} or a sequence of bools, got {strategy!r}")
        half = depth // 2
        if strategy == "strategy_2":
            return tuple(i < half for i in range(depth))
        if strategy == "strategy_3":
            return tuple(i >= half for i in range(depth))
        return tuple(i % 2 == 0 for i in range(depth))
    if not isinstance(strategy, Sequence) or not all(isinstance(f, bool) for f in strategy):
        raise TypeError(f"strategy must be one of {AGE_STRATEGIES} or a sequence of bools, got {strategy!r}")
    if len(strategy) != depth:
        raise ValueError(f"strategy must hold one bool per layer (depth = {depth}), got {len(strategy)}")
    return tuple(strategy)


def age_coords(strategy: str | Sequence[bool], circle: Coords, other: Coords, depth: int | None = None) -> list[Coords]:
    """One ``Coords`` per decoder layer for AGE: ``circle`` (the ``circlerope`` layout) where :func:`age_layers`
    says so, ``other`` (the model's own layout of the same tokens, e.g. ``qwen2.5-vl``) elsewhere. The list holds
    the two objects themselves, so a model computes each one's rotation once (:class:`mmpos.nn.Transformer`).

    Args:
        strategy: one of :data:`AGE_STRATEGIES`, or one bool per layer.
        circle, other: two layouts of the same tokens: ``pos`` ``(B, N, A)`` on the same axes.
        depth: the number of layers (default: ``len(strategy)`` for a sequence of bools; required for a name).
    """
    if not isinstance(circle, Coords) or not isinstance(other, Coords):
        raise TypeError(f"circle and other must be Coords, got {type(circle).__name__} and {type(other).__name__}")
    if circle.pos.shape[:2] != other.pos.shape[:2] or circle.axes != other.axes:
        raise ValueError(
            f"circle and other must be layouts of the same tokens on the same axes, got {tuple(circle.pos.shape)} "
            f"{circle.axes} and {tuple(other.pos.shape)} {other.axes}"
        )
    if depth is None:
        if isinstance(strategy, str):
            raise ValueError(f"depth is required with strategy={strategy!r} (the number of decoder layers)")
        depth = len(strategy)
    return [circle if flag else other for flag in age_layers(strategy, depth)]
