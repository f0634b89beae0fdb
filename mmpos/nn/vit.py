"""A small vision transformer built from :class:`mmpos.nn.Transformer`.

Patches come from timm's ``PatchEmbed``; the token grid (``Coords.grid``) is derived
from the static image shape, so any resolution (and non-square images) work with
encoders that read coordinates.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from .._extras import requires
from ..coords import Coords
from ..scaling import RopeScaling
from .blocks import Transformer
from .placement import grid_scaled_kwargs

with requires("timm"):  # one line naming the package and the extra when it is missing
    from timm.layers import PatchEmbed, to_2tuple

__all__ = ["VisionTransformer"]


class VisionTransformer(nn.Module):
    """ViT classifier with mmpos position encoders.

    Args:
        img_size: training image size (sets the ``grid_size`` handed to learned encoders).
        patch_size, in_chans, num_classes, dim, depth, num_heads, mlp_ratio: the model.
        pos, pos_kwargs, conv_after: position encoders, see :class:`Transformer`.
        class_token: prepend a class token (a prefix token without position).
        global_pool: ``"token"`` (class token) or ``"avg"`` (mean of patch tokens).
        scaling, train_grid, target_grid: one length-scaling rule for every rotary encoder
            (:func:`mmpos.nn.placement.grid_scaled_kwargs`): a rule name with the grid the weights were trained
            on and the grid the model runs at (each defaults to this model's patch grid), e.g.
            ``scaling="yarn", target_grid=(28, 28)`` on a model trained at ``img_size`` giving 14x14; or a
            :class:`~mmpos.scaling.RopeScaling`. The plans are buffers, so trained weights load unchanged.

    ``forward(images (B, C, H, W)) -> logits (B, num_classes)``; ``H, W`` multiples of the patch.
    """

    def __init__(
        self,
        img_size: int | Sequence[int] = 32,
        patch_size: int = 4,
        in_chans: int = 3,
        num_classes: int = 10,
        dim: int = 64,
        depth: int = 4,
        num_heads: int = 4,
        mlp_ratio: float = 4.0,
        pos: str | Sequence[str] | None = "learned",
        pos_kwargs: dict[str, dict[str, Any]] | None = None,
        conv_after: Sequence[int] = (0,),
        class_token: bool = True,
        global_pool: str = "token",
        drop_path: float = 0.0,
        scaling: str | RopeScaling | Mapping[str, Any] | None = None,
        train_grid: Sequence[int] | None = None,
        target_grid: Sequence[int] | None = None,
    ) -> None:
        super().__init__()
        if global_pool not in ("token", "avg"):
            raise ValueError(f"global_pool must be 'token' or 'avg', got {global_pool!r}")
        if global_pool == "token" and not class_token:
            raise ValueError("global_pool='token' needs class_token=True")
        img_size = to_2tuple(img_size)
        self.patch_size = patch_size
        self.patch_embed = PatchEmbed(img_size, patch_size, in_chans, dim, strict_img_size=False, flatten=False)
        self.num_prefix_tokens = 1 if class_token else 0
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim)) if class_token else None
        grid = (img_size[0] // patch_size, img_size[1] // patch_size)
        pos_kwargs = grid_scaled_kwargs(pos, pos_kwargs, scaling, grid, train_grid, target_grid)
        self.transformer = Transformer(
            dim,
            depth,
            num_heads,
            pos,
            pos_kwargs,
            grid,
            mlp_ratio,
            axes=("h", "w"),
            conv_after=conv_after,
            drop_path=drop_path,
            prefix_rows=self.num_prefix_tokens,  # the class token gets a learned vector, as in timm
        )
        self.global_pool = global_pool
        self.head = nn.Linear(dim, num_classes)
        if self.cls_token is not None:
            nn.init.normal_(self.cls_token, std=1e-6)

    def coords(self, images: Tensor) -> Coords:
        """Token coordinates for a batch of ``images`` (from the static shape only)."""
        h, w = images.shape[-2:]
        if h % self.patch_size or w % self.patch_size:
            raise ValueError(f"image size {(h, w)} must be a multiple of patch_size={self.patch_size}")
        return Coords.grid(
            h // self.patch_size, w // self.patch_size, num_prefix_tokens=self.num_prefix_tokens, device=images.device
        )

    def forward_features(self, images: Tensor) -> Tensor:
        """``(B, prefix + h * w, dim)`` tokens after the transformer."""
        coords = self.coords(images)
        x = self.patch_embed(images).flatten(2).transpose(1, 2)  # (B, h*w, dim)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        return self.transformer(x, coords)

    def forward(self, images: Tensor) -> Tensor:
        x = self.forward_features(images)
        pooled = x[:, 0] if self.global_pool == "token" else x[:, self.num_prefix_tokens :].mean(1)
        return self.head(pooled)
