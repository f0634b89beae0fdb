"""1-D rotary position embedding.

Paper: Su et al., "RoFormer: Enhanced Transformer with Rotary Position Embedding",
2021, https://arxiv.org/abs/2104.09864. Reference: Hugging Face transformers,
``models/llama/modeling_llama.py`` (``LlamaRotaryEmbedding``, ``apply_rotary_pos_emb``);
tests compare with it directly.

Shapes: q, k ``(B, H, N, D)``; angles ``(B, N, rotary_dim / 2)``.
"""

from __future__ import annotations

from .._validate import check_float
from ..coords import Coords
from ..rotary import FrequencyPlan
from ..scaling import RopeScaling
from .base import RotaryEncoder, resolve_head_dim
from .registry import register_encoder

__all__ = ["RoPE1d"]


@register_encoder(
    "rope",
    paper="Su et al. 2021, RoFormer (arXiv:2104.09864)",
    reference="huggingface/transformers src/transformers/models/llama/modeling_llama.py (LlamaRotaryEmbedding)",
)
class RoPE1d(RotaryEncoder):
    """1-D RoPE on axis ``"seq"``; a grid is read in raster order (:meth:`Coords.flattened`).

    Args:
        dim: model width (with ``num_heads`` gives ``head_dim``), or pass ``head_dim``.
        num_heads: number of attention heads.
        theta: base of the spectrum.
        rotary_dim: rotate only the first ``rotary_dim`` channels of a head (partial rotary).
        convention: ``"half"`` (Llama/HF) or ``"interleaved"`` (GPT-J).
        scaling: a length-scaling rule (:class:`~mmpos.scaling.RopeScaling` or a dict of its arguments).
    """

    def __init__(
        self,
        dim: int | None = None,
        num_heads: int | None = None,
        head_dim: int | None = None,
        theta: float = 10000.0,
        rotary_dim: int | None = None,
        convention: str = "half",
        scaling: RopeScaling | dict | None = None,
    ) -> None:
        head_dim = resolve_head_dim(dim, num_heads, head_dim)
        plan = FrequencyPlan.rope(head_dim, check_float(theta, "theta"), rotary_dim, "seq", convention)
        super().__init__(plan, scaling=scaling)

    def positions(self, coords: Coords) -> Coords:
        if "seq" in coords.axes:
            return coords
        return coords.flattened()
