"""The models of the multimodal recipes: a small vision-language model and its tower wrapper.

:class:`PatchTokens` turns a converted open_clip ``VisionTransformer`` into a patch-token
tower; :class:`TinyVLM` is the model the recipes train.

Vision tower (any module mapping images ``(B, 3, H, W)`` to patch tokens
``(B, Hp * Wp, C)`` in raster order; the recipes use an open_clip tower) -> a 2x2
patch merger (Qwen2-VL's ``PatchMerger``: LayerNorm, then an MLP on the 4 concatenated
neighbours) -> a causal :class:`mmpos.nn.Transformer` decoder whose rotary encoder
reads the layout's coordinates -> next-token logits.

Positions are data: the caller builds a :class:`mmpos.layout.Layout` for the batch
(outside ``forward``) and passes ``layout.coords``, or one ``Coords`` per decoder layer: CircleRoPE's
AGE mode (:func:`mmpos.age.age_coords`) gives some layers Circle-RoPE positions and the others Qwen2.5-VL's.

Shapes: a sample is a list of parts, shared by the batch: ``("text", ids (B, n))``,
``("image", (B, 3, H, W))`` or ``("video", (B, T, 3, H, W))``; logits ``(B, L, vocab)``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from mmpos.coords import Coords
from mmpos.layout import Image, Text, Video
from mmpos.nn import Transformer
from mmpos.schemes import SCHEMES  # layout scheme -> its record (SCHEMES[name].encoder: the rotary encoder)

__all__ = ["Part", "PatchTokens", "TinyVLM", "segments_of"]

Part = tuple[str, Tensor]


_PART_DIMS = {"text": 2, "image": 4, "video": 5}


def _check_parts(parts: Sequence[Part]) -> int:
    """The batch size shared by ``parts``; ``ValueError`` on an unknown kind, a wrong rank or mixed batches."""
    if not parts:
        raise ValueError("parts must be a non-empty list of (kind, tensor) pairs")
    batch = None
    for i, (kind, value) in enumerate(parts):
        if kind not in _PART_DIMS:
            raise ValueError(f"parts[{i}] kind must be 'text', 'image' or 'video', got {kind!r}")
        if value.dim() != _PART_DIMS[kind]:
            shapes = {"text": "(B, n)", "image": "(B, 3, H, W)", "video": "(B, T, 3, H, W)"}
            raise ValueError(f"parts[{i}] ({kind}) must have shape {shapes[kind]}, got {tuple(value.shape)}")
        batch = value.shape[0] if batch is None else batch
        if value.shape[0] != batch:
            raise ValueError(f"parts[{i}] has batch size {value.shape[0]}, expected {batch} like parts[0]")
    return batch  # type: ignore[return-value]


def segments_of(parts: Sequence[Part], patch_size: int) -> list[Text | Image | Video]:
    """Layout segments (grids in patches, before the merge) for one sample of ``parts``."""
    _check_parts(parts)
    segments: list[Text | Image | Video] = []
    for kind, value in parts:
        if kind == "text":
            segments.append(Text(value.shape[1]))
            continue
        h, w = value.shape[-2:]
        if h % patch_size or w % patch_size:
            raise ValueError(f"{kind} size {(h, w)} must be a multiple of patch_size = {patch_size}")
        t = 1 if kind == "image" else value.shape[1]
        segments.append((Image if kind == "image" else Video)((t, h // patch_size, w // patch_size)))
    return segments


class PatchTokens(nn.Module):
    """An open_clip ``VisionTransformer`` converted to mmpos encoders, returning its patch tokens.

    ``forward(images (B, 3, H, W)) -> (B, (H / p) * (W / p), width)``: the tokens after
    ``ln_post`` in raster order, without the class token, at any ``H``, ``W`` divisible by
    the patch size ``p`` (the converted tower keeps no absolute position table).
    """

    def __init__(self, tower: nn.Module) -> None:
        super().__init__()
        if not getattr(tower, "output_tokens", False) or getattr(tower, "positional_embedding", None) is not None:
            raise ValueError(
                "tower must be an open_clip VisionTransformer converted by mmpos.integrations.open_clip.convert, "
                "with output_tokens=True and no positional_embedding"
            )
        tower.proj = None  # the pooled projection is unused: drop it so that every parameter gets a gradient
        self.tower = tower

    def forward(self, images: Tensor) -> Tensor:
        _, tokens = self.tower(images)  # pooled (B, C), patch tokens (B, h * w, C)
        return tokens


class TinyVLM(nn.Module):
    """Vision tower + patch merger + causal decoder with a multimodal rotary encoder.

    Args:
        vision: images ``(B, 3, H, W)`` -> tokens ``(B, Hp * Wp, vision_dim)``.
        vision_dim: width of the vision tokens.
        patch_size: the tower's patch size (images are multiples of ``2 * patch_size``).
        vocab_size: text vocabulary.
        scheme: a key of :data:`mmpos.schemes.SCHEMES` (picks the decoder's rotary encoder).
        dim, depth, num_heads, num_kv_heads: the decoder.
        pos_kwargs: extra arguments of the rotary encoder.
        pos: a rotary encoder name instead of the scheme's (one that reads the scheme's axes), e.g.
            ``"grape-learned"`` on ``scheme="grape"``; the scheme's ``encoder_kwargs`` are then not passed.
    """

    def __init__(
        self,
        vision: nn.Module,
        vision_dim: int,
        patch_size: int,
        vocab_size: int,
        scheme: str,
        dim: int = 96,
        depth: int = 3,
        num_heads: int = 4,
        num_kv_heads: int | None = None,
        pos_kwargs: dict | None = None,
        pos: str | None = None,
    ) -> None:
        super().__init__()
        if scheme not in SCHEMES:
            raise ValueError(f"scheme must be one of {sorted(SCHEMES)}, got {scheme!r}")
        self.scheme = scheme
        self.patch_size = patch_size
        self.vision = vision
        self.merger = nn.Sequential(
            nn.LayerNorm(vision_dim),
            nn.Flatten(-2),  # (B, N, 4, C) -> (B, N, 4C) after the norm over C
            nn.Linear(4 * vision_dim, 4 * vision_dim),
            nn.GELU(),
            nn.Linear(4 * vision_dim, dim),
        )
        self.embed = nn.Embedding(vocab_size, dim)
        encoder = SCHEMES[scheme].encoder if pos is None else pos
        own = SCHEMES[scheme].encoder_kwargs if pos is None else {}
        self.decoder = Transformer(
            dim,
            depth,
            num_heads,
            pos=encoder,
            pos_kwargs={encoder: {**own, **dict(pos_kwargs or {})}},
            num_kv_heads=num_kv_heads,
            causal=True,
            conv_after=(),
        )
        self.lm_head = nn.Linear(dim, vocab_size)

    def encode_images(self, images: Tensor) -> Tensor:
        """``(B, 3, H, W)`` -> merged tokens ``(B, (Hp / 2) * (Wp / 2), dim)`` in raster order."""
        b, _, h, w = images.shape
        s = 2 * self.patch_size
        if h % s or w % s:
            raise ValueError(f"image size {(h, w)} must be a multiple of 2 * patch_size = {s}")
        hp, wp = h // self.patch_size, w // self.patch_size
        tokens = self.vision(images)  # (B, hp * wp, C)
        if tokens.shape[1] != hp * wp:
            raise ValueError(f"vision tower gave {tokens.shape[1]} tokens for a {hp}x{wp} patch grid")
        c = tokens.shape[-1]
        groups = tokens.view(b, hp // 2, 2, wp // 2, 2, c).permute(0, 1, 3, 2, 4, 5)  # (B, h, w, 2, 2, C)
        return self.merger(groups.reshape(b, (hp // 2) * (wp // 2), 4, c))

    def embed_parts(self, parts: Sequence[Part]) -> Tensor:
        """Token embeddings ``(B, L, dim)`` of the parts, in order."""
        _check_parts(parts)
        pieces = []
        for kind, value in parts:
            if kind == "text":
                pieces.append(self.embed(value))
            elif kind == "image":
                pieces.append(self.encode_images(value))
            elif kind == "video":
                b, t = value.shape[:2]
                frames = self.encode_images(value.flatten(0, 1))  # (B*T, n, dim)
                pieces.append(frames.view(b, t * frames.shape[1], -1))  # (t, h, w) raster order
        return torch.cat(pieces, dim=1)

    def forward(self, parts: Sequence[Part], coords: Coords | Sequence[Coords]) -> Tensor:
        """Logits ``(B, L, vocab_size)``; ``coords`` from :func:`mmpos.layout.build` of :func:`segments_of`, or
        one ``Coords`` per decoder layer (CircleRoPE's AGE: :func:`mmpos.age.age_coords`; each distinct one's
        cos / sin computed once, :class:`mmpos.nn.Transformer`)."""
        return self.lm_head(self.decoder(self.embed_parts(parts), coords))
