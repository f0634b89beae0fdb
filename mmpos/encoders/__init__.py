"""Position encoders, one module per method.

Every module of this package is imported here so that its ``@register_encoder``
entries reach :func:`mmpos.create`. Base classes live in :mod:`mmpos.encoders.base`.
"""

import importlib
import pkgutil

from .base import AdditiveEncoder, BiasEncoder, ConvEncoder, PositionEncoder, RotaryEncoder

for _info in pkgutil.iter_modules(__path__):
    if not _info.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_info.name}")

__all__ = ["AdditiveEncoder", "BiasEncoder", "ConvEncoder", "PositionEncoder", "RotaryEncoder"]
