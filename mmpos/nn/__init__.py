"""Attention with position-encoder hooks, blocks and small models.

Names load on first use (PEP 562), so ``mmpos.nn.attention`` and ``Attention`` need only the core
install; ``Transformer``, ``Block`` and ``VisionTransformer`` need the ``timm`` extra, and
``GraphTransformer`` the ``graph`` extra.
"""

import importlib
from typing import TYPE_CHECKING, Any

# the core (torch only), imported at once: the function ``attention`` must win over its submodule's name
from .attention import Attention, attention, attention_mask
from .multi_order import MultiOrderAttention, MultiOrderCache, TPEAttention, router_entropy_loss

if TYPE_CHECKING:
    from .blocks import Block, Transformer
    from .graph_transformer import GraphTransformer
    from .vit import VisionTransformer

# name -> submodule that defines it, for what needs an extra (imported on first access)
_LAZY = {
    "Block": "blocks",
    "Transformer": "blocks",
    "GraphTransformer": "graph_transformer",
    "VisionTransformer": "vit",
}

__all__ = [
    "Attention",
    "Block",
    "GraphTransformer",
    "MultiOrderAttention",
    "MultiOrderCache",
    "TPEAttention",
    "Transformer",
    "VisionTransformer",
    "attention",
    "attention_mask",
    "router_entropy_loss",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
