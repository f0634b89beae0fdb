"""Attention with position-encoder hooks, blocks and small models."""

from .attention import Attention, attention, attention_mask
from .blocks import Block, Transformer
from .multi_order import MultiOrderAttention, MultiOrderCache, TPEAttention, router_entropy_loss
from .vit import VisionTransformer

__all__ = [
    "attention",
    "attention_mask",
    "Attention",
    "Block",
    "Transformer",
    "VisionTransformer",
    "MultiOrderAttention",
    "MultiOrderCache",
    "TPEAttention",
    "router_entropy_loss",
]
