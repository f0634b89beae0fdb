"""Attention with position-encoder hooks, blocks and small models.

Names load on first use (PEP 562), so ``mmpos.nn.attention`` and ``Attention`` need only the core
install; ``Transformer``, ``Block`` and ``VisionTransformer`` need the ``timm`` extra, and
``GraphTransformer`` the ``graph`` extra.
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_attributes

# the core (torch only), imported at once: the function ``attention`` must win over its submodule's name
from .attention import Attention, attention, attention_mask
from .multi_order import MultiOrderAttention, MultiOrderCache, TPEAttention, router_entropy_loss

if TYPE_CHECKING:
    from .blocks import Block, Transformer
    from .graph_transformer import GraphTransformer
    from .vit import VisionTransformer

# name -> submodule that defines it, for what needs an extra (imported on first access)
_LAZY = {
    "Block": ".blocks",
    "Transformer": ".blocks",
    "GraphTransformer": ".graph_transformer",
    "VisionTransformer": ".vit",
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

__getattr__, __dir__ = lazy_attributes(__name__, globals(), _LAZY)
