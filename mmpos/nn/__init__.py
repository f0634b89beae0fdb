"""Attention with position-encoder hooks, blocks and small models."""

from .attention import Attention, attention, attention_mask
from .blocks import Block, Transformer
from .graph_transformer import GraphTransformer
from .multi_order import MultiOrderAttention, MultiOrderCache, TPEAttention, router_entropy_loss
from .vit import VisionTransformer

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
