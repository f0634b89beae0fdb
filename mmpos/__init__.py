"""mmpos: position encoders for multimodal and structured data.

Public API: the names below and the documented submodules (``docs/api.md``):
:mod:`mmpos.rotary`, :mod:`mmpos.layout`, :mod:`mmpos.table`, :mod:`mmpos.registry`, :mod:`mmpos.encoders`,
:mod:`mmpos.nn`, :mod:`mmpos.layers`, :mod:`mmpos.integrations`, :mod:`mmpos.data`,
:mod:`mmpos.recipes`, :mod:`mmpos.media`, :mod:`mmpos.viz` (figures), :mod:`mmpos.export`
(torch.export / ONNX), :mod:`mmpos.graph` (directed-graph PEs on plain tensors).
"""

from .coords import Coords, Modality
from .registry import EncoderInfo, create, list_encoders, register_encoder
from .rotary import FrequencyPlan

__version__ = "0.1.0"

__all__ = [
    "Coords",
    "EncoderInfo",
    "FrequencyPlan",
    "Modality",
    "__version__",
    "create",
    "list_encoders",
    "register_encoder",
]
