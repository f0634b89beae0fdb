"""Hugging Face transformers (Qwen2-VL, Qwen2.5-VL, Qwen3-VL): one import for both halves.

* :func:`get_rope_index` -- ``(position_ids, rope_deltas)`` equal to the model's own
  ``get_rope_index``, vectorised (:mod:`mmpos.integrations.hf_rope_index`);
* :func:`use_rope` -- swap MRoPE-I, MHRoPE, VRoPE, V2PE, HoPE or flat RoPE into a model,
  or go back to its own scheme (:mod:`mmpos.integrations.hf_rope`).

Needs the ``hf`` extra (``pip install "mmpos-torch[hf]"``).
"""

from .hf_rope import SCHEMES, current_rope, use_rope
from .hf_rope_index import get_rope_index, scheme_for_config

__all__ = ["get_rope_index", "scheme_for_config", "use_rope", "current_rope", "SCHEMES"]
