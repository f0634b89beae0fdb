"""Building blocks that are not position encoders but travel with one.

* :class:`AdaptiveTokenMerger` -- ViTAR's Adaptive Token Merger (grid attention that
  merges any token grid into a fixed one), used with the ``fuzzy`` encoder.
"""

from .token_merger import AdaptiveTokenMerger, merge_schedule

__all__ = ["AdaptiveTokenMerger", "merge_schedule"]
