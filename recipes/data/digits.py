"""Real handwritten digits, offline: scikit-learn's bundled ``load_digits`` (the optional ``data`` extra).

``load_digits`` ships 1,797 real 8 x 8 digits (UCI "Optical Recognition of Handwritten Digits",
grey levels 0-16) inside the scikit-learn wheel: nothing is downloaded. They are split once and for
all by index: every fifth image (``index % 5 == 0``, 360 images) is the held-out ``"test"`` split,
the other 1,437 the ``"train"`` split, so that evaluation never sees a training image.

Shapes: images ``(N, 8, 8)`` float32 in ``[0, 1]``, labels ``(N,)`` int64 in ``0..9``.
"""

from __future__ import annotations

from functools import cache, lru_cache

import torch
from torch import Tensor

__all__ = ["SPLITS", "digit_batch", "digit_images", "load_split", "split_images"]

SPLITS = ("train", "test")


@cache
def _all() -> tuple[Tensor, Tensor]:
    try:
        from sklearn.datasets import load_digits
    except ImportError as e:  # the optional data extra
        raise ImportError(
            "the real-digit recipes need scikit-learn (its bundled load_digits): "
            'pip install scikit-learn, or pip install "mmpos-torch[data]"'
        ) from e
    bunch = load_digits()
    images = torch.as_tensor(bunch.images, dtype=torch.float32) / 16.0  # (1797, 8, 8) in [0, 1]
    return images, torch.as_tensor(bunch.target, dtype=torch.long)


def load_split(split: str) -> tuple[Tensor, Tensor]:
    """``(images (N, 8, 8), labels (N,))`` of ``split`` (``"train"``: 1,437 images, ``"test"``: 360)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    images, labels = _all()
    held_out = torch.arange(len(labels)) % 5 == 0
    keep = held_out if split == "test" else ~held_out
    return images[keep], labels[keep]


@lru_cache(maxsize=4)
def _by_class(split: str) -> tuple[tuple[Tensor, ...], Tensor]:
    images, labels = load_split(split)
    groups = tuple(images[labels == c] for c in range(10))
    return groups, torch.tensor([len(g) for g in groups])


def digit_images(labels: Tensor, split: str, generator: torch.Generator) -> Tensor:
    """A real image of each requested class: ``labels`` ``(...)`` in ``0..9`` -> ``(..., 8, 8)``.

    Each entry draws one image of its class from ``split`` uniformly with ``generator``.
    """
    if labels.dtype != torch.long or (labels.numel() and (labels.min() < 0 or labels.max() > 9)):
        raise ValueError("labels must be an int64 tensor of digit classes 0..9")
    groups, counts = _by_class(split)
    flat = labels.reshape(-1)
    pick = (torch.rand(flat.shape, generator=generator) * counts[flat]).long()  # index within the class
    stacked = torch.cat(groups)  # class-sorted images
    offsets = torch.cumsum(counts, 0) - counts
    return stacked[offsets[flat] + pick].reshape(*labels.shape, 8, 8)


def digit_batch(n: int, split: str, size: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """``n`` real digits of ``split`` drawn uniformly, as ``(images (n, 3, size, size), labels (n,))``.

    Each 8 x 8 digit is enlarged to ``size`` (a multiple of 8) by repeating pixels (nearest
    neighbour, so no pixel value is invented) and copied to three channels (RGB backbones).
    """
    if not isinstance(size, int) or size <= 0 or size % 8:
        raise ValueError(f"size must be a positive multiple of 8 (the digits are 8 x 8), got {size!r}")
    images, labels = load_split(split)
    pick = torch.randint(0, len(labels), (n,), generator=generator)
    return _enlarge(images[pick], size), labels[pick]


def split_images(split: str, size: int) -> tuple[Tensor, Tensor]:
    """Every digit of ``split`` at ``size`` pixels: ``(images (N, 3, size, size), labels (N,))``."""
    if not isinstance(size, int) or size <= 0 or size % 8:
        raise ValueError(f"size must be a positive multiple of 8 (the digits are 8 x 8), got {size!r}")
    images, labels = load_split(split)
    return _enlarge(images, size), labels


def _enlarge(images: Tensor, size: int) -> Tensor:
    k = size // 8
    big = images.repeat_interleave(k, dim=-2).repeat_interleave(k, dim=-1)  # (N, size, size)
    return big.unsqueeze(1).expand(-1, 3, -1, -1).contiguous()
