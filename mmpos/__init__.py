"""mmpos: position encoders for multimodal and structured data.

Public API: :class:`Coords`, :class:`Modality`, :func:`create`, :func:`list_encoders`,
the rotary core (:mod:`mmpos.rotary`), encoders (:mod:`mmpos.encoders`) and
attention / blocks (:mod:`mmpos.nn`).
"""

from .coords import Coords, Modality
from .registry import create, list_encoders, register_encoder
from .rotary import FrequencyPlan

__version__ = "0.1.0"

__all__ = ["Coords", "Modality", "FrequencyPlan", "create", "list_encoders", "register_encoder", "__version__"]
