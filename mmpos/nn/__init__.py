"""Attention with position-encoder hooks, blocks and small models."""

from .attention import Attention, attention, attention_mask
from .blocks import Block, Transformer
from .vit import VisionTransformer

__all__ = ["attention", "attention_mask", "Attention", "Block", "Transformer", "VisionTransformer"]
