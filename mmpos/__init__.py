"""mmpos: position encoders for multimodal and structured data.

Public API: the names below and the documented submodules (``docs/api.md``):
:mod:`mmpos.rotary`, :mod:`mmpos.scaling`, :mod:`mmpos.schemes` (with :mod:`mmpos.age`), :mod:`mmpos.layout`,
:mod:`mmpos.table`, :mod:`mmpos.encoders` (with :mod:`mmpos.encoders.registry`), :mod:`mmpos.nn`, :mod:`mmpos.layers`,
:mod:`mmpos.integrations`, :mod:`mmpos.media`, :mod:`mmpos.viz` (figures), :mod:`mmpos.export`
(torch.export / ONNX), :mod:`mmpos.graph` (directed-graph PEs on plain tensors) and :mod:`mmpos.runner`
(the recipe runner; the recipes themselves live in the top-level ``recipes`` package beside the library).
"""

from typing import TYPE_CHECKING

from ._lazy import lazy_attributes

if TYPE_CHECKING:
    from .coords import Coords, Modality
    from .encoders.registry import EncoderInfo, create, list_encoders, register_encoder
    from .rotary import FrequencyPlan

__version__ = "0.1.0"

# name -> submodule that defines it: imported on first access (PEP 562), so that ``import mmpos``
# (and ``mmpos --help``, ``mmpos list recipes``, ``mmpos cp``) does not load torch.
_LAZY = {
    "Coords": ".coords",
    "Modality": ".coords",
    "EncoderInfo": ".encoders.registry",
    "create": ".encoders.registry",
    "list_encoders": ".encoders.registry",
    "register_encoder": ".encoders.registry",
    "FrequencyPlan": ".rotary",
}


__getattr__, __dir__ = lazy_attributes(__name__, globals(), _LAZY, submodules=True)  # also mmpos.rotary, ...


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
