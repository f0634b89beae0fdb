"""Hugging Face transformers (Qwen2-VL, Qwen2.5-VL, Qwen3-VL): one import for both halves.

* :func:`get_rope_index` -- ``(position_ids, rope_deltas)`` equal to the model's own
  ``get_rope_index`` of the release whose ``rule`` is asked for (:func:`installed_rule`),
  vectorised; :func:`token_layout` gives the same as a :class:`~mmpos.layout.Layout`
  (:mod:`mmpos.integrations.hf_rope_index`);
* :func:`use_rope` -- swap MRoPE-I, MHRoPE, VRoPE, V2PE, HoPE or flat RoPE into a model,
  or go back to its own scheme (:mod:`mmpos.integrations.hf_rope`).

Needs the ``hf`` extra (``pip install "mmpos-torch[hf]"``; tested on transformers 4.57.1 and 5.24.0).
"""

from .hf_rope import CONFIG_KEY, apply_config_rope, current_rope, from_pretrained, use_rope
from .hf_rope_index import get_rope_index, installed_rule, scheme_for_config, token_layout

__all__ = [
    "CONFIG_KEY",
    "apply_config_rope",
    "current_rope",
    "from_pretrained",
    "get_rope_index",
    "installed_rule",
    "scheme_for_config",
    "token_layout",
    "use_rope",
]
