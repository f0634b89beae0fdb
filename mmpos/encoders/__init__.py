"""Position encoders, one module per method, and their registry (:mod:`mmpos.encoders.registry`).

Base classes live in :mod:`mmpos.encoders.base`. Encoder modules are imported by the registry
on first use (``mmpos.create``, ``mmpos.list_encoders``), so their ``@register_encoder`` entries
are found without ``import mmpos`` loading every method.
"""

from .base import AdditiveEncoder, BiasEncoder, ConvEncoder, PositionEncoder, RotaryEncoder

__all__ = ["AdditiveEncoder", "BiasEncoder", "ConvEncoder", "PositionEncoder", "RotaryEncoder"]
