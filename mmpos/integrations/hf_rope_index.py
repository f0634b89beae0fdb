"""Qwen2-VL / Qwen2.5-VL / Qwen3-VL ``get_rope_index``, vectorised over the batch.

References: Hugging Face transformers ``Qwen2VLModel.get_rope_index``
(``models/qwen2_vl/modeling_qwen2_vl.py``), ``Qwen2_5_VLModel.get_rope_index``
(``models/qwen2_5_vl/modeling_qwen2_5_vl.py``) and ``Qwen3VLModel.get_rope_index``
(``models/qwen3_vl/modeling_qwen3_vl.py``), read in releases 4.57.1 and 5.24.0; tests compare
against the installed release directly. Papers: Wang et al., "Qwen2-VL",
https://arxiv.org/abs/2409.12191; Bai et al., "Qwen2.5-VL Technical Report",
https://arxiv.org/abs/2502.13923.

The reference walks every sample and every vision block in Python (``.tolist()``,
``.item()``, ``itertools.groupby``). Here the vision tokens of the whole batch are assigned
to their blocks with one ``nonzero`` per modality and the positions come from the packer
:func:`mmpos.layout.pack` (one ``cumsum`` along the sequence), the same packer that
:func:`mmpos.layout.build` uses for segments: :func:`token_layout` returns the same
:class:`~mmpos.layout.Layout`. The bookkeeping runs in NumPy on the host: token ids on an
accelerator are read to the host once and the ids moved back once (transformers' own
``get_rope_index`` reads them to the host too, sample by sample).

The releases differ; ``rule`` (:data:`mmpos.schemes.RULES`) picks one:

* ``"original"`` -- the rule of the Qwen checkpoints: the text after a vision block continues
  at the block's maximum over t, h and w plus one; Qwen2.5-VL temporal index
  ``floor(t * second_per_grid * tokens_per_second)``; 1 on padding; ``rope_deltas`` = next
  position - padded length.
* ``"hf-4.57"`` -- transformers 4.57 (and <= 5.2): as ``"original"``, but
  ``second_per_grid_ts`` is cast to an integer before the product (0.5 s becomes 0;
  huggingface/transformers #48669).
* ``"hf-5.3"`` -- transformers >= 5.3 (checked against 5.24): the text after a block moves by
  ``max(h, w)`` only (a video's temporal extent is ignored, #45381); images use temporal
  interval 1; 0 on padding; ``rope_deltas`` = largest position + 1 - real (unpadded) length.
* ``"installed"`` -- whichever of ``"hf-4.57"`` / ``"hf-5.3"`` the installed transformers
  implements, detected from the signature of the model class's ``get_rope_index``
  (:func:`installed_rule`).

Without vision grids the ``hf-4.57`` / ``original`` rules run the reference's text-only branch
(padding at 1, ``rope_deltas`` from the attention mask), as transformers 4.57 does.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .._arrays import host, ids_in_dtype
from .._validate import check_float, check_int
from ..layout import Layout, VisionBlocks, pack
from ..schemes import RULES, Rule, SchemeOptions, get_scheme, model_types, resolve_options, scheme_for_model_type
from ._token_blocks import (
    block_first,
    check_grids,
    fit_blocks,
    marked_runs,
    modality_code,
    modality_types,
    new_ids,
    packed_rows,
    real_tokens,
)
from .hf_families import FAMILY_ROPE_INDEX, GLM_VIDEO_MARKER_FAMILIES, inside_markers, video_markers

__all__ = [
    "RopeIndexOptions",
    "get_rope_index",
    "installed_rule",
    "packed_rope_index",
    "scheme_for_config",
    "scheme_rope_index",
    "token_layout",
]


def scheme_for_config(config: Any) -> str:
    """The name of the :mod:`mmpos.schemes` scheme of a model ``config``, read by
    ``config.model_type`` from the registry (``Scheme.model_types``)."""
    return scheme_for_model_type(getattr(config, "model_type", None)).name


def installed_rule(model_or_class: Any = None) -> str:
    """``"hf-5.3"`` when the (installed) model class's ``get_rope_index`` takes
    ``mm_token_type_ids`` (transformers >= 5.3), else ``"hf-4.57"``. Without an argument,
    the installed ``Qwen2VLModel`` is read."""
    if model_or_class is None:
        from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLModel

        model_or_class = Qwen2VLModel
    cls = model_or_class if isinstance(model_or_class, type) else type(model_or_class)
    fn = getattr(cls, "get_rope_index", None)
    if fn is None:
        raise ValueError(f"{cls.__name__} has no get_rope_index: not a Qwen-VL model of a known layout")
    return _signature_rule(fn)


@functools.lru_cache(maxsize=64)
def _signature_rule(fn: Any) -> str:
    """The rule a ``get_rope_index`` implements, read from its signature once (every call asks)."""
    return "hf-5.3" if "mm_token_type_ids" in inspect.signature(fn).parameters else "hf-4.57"


def _resolve_rule(rule: str | Rule) -> str | Rule:
    return installed_rule() if rule == "installed" else rule


@dataclass(frozen=True)
class RopeIndexOptions:
    """What :func:`scheme_rope_index` needs besides the prompt: the scheme and its options
    (validated by :func:`mmpos.schemes.resolve_options`, as :func:`mmpos.layout.build` does),
    the model's own scheme ``model_scheme`` (the prompt's token layout: where its ``Scheme.frames``
    is set, every video frame is its own run of tokens), the config's spatial merge size,
    placeholder token ids, ``tokens_per_second``, the ``rule`` and ``temporal_merge`` (video
    frames merged per token, ERNIE-4.5-VL's ``vision_config.temporal_merge_size``; 1 elsewhere:
    a video grid ``(t, h, w)`` holds ``t / temporal_merge * h * w / merge**2`` tokens). Checked on creation."""

    scheme: str
    model_scheme: str
    merge: int
    image_token_id: int
    video_token_id: int
    tokens_per_second: float
    delta: float | None = None
    temporal_scale: float | None = None
    training: bool = False
    rule: str | Rule = "original"
    temporal_merge: int = 1
    visual_stride: float | None = None
    #: the scheme's own options (e.g. CircleRoPE's ``radius``, ``alpha``), passed to ``resolve_options``
    scheme_options: dict[str, Any] | None = None
    #: GLM-4V's processors: ``(video start, video end)`` token ids; image tokens between them are video frames
    video_markers: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        own = model_types()
        if self.model_scheme not in own.values():
            raise ValueError(f"model_scheme must be one of {sorted(set(own.values()))}, got {self.model_scheme!r}")
        for name in ("merge", "image_token_id", "video_token_id", "temporal_merge"):
            value, low = getattr(self, name), 0 if name.endswith("token_id") else 1
            check_int(value, name, low)
        if not isinstance(self.rule, Rule) and self.rule != "installed" and self.rule not in RULES:
            raise ValueError(f"rule must be 'installed' or one of {tuple(RULES)}, got {self.rule!r}")
        tps = self.tokens_per_second
        check_float(tps, "tokens_per_second (config.vision_config)")
        object.__setattr__(self, "resolved", self._resolve())
        # whether every video frame is its own block (read by every call)
        object.__setattr__(self, "frames", get_scheme(self.model_scheme).frames or get_scheme(self.scheme).frames)

    def _resolve(self) -> SchemeOptions:
        return resolve_options(
            self.scheme,
            delta=self.delta,
            temporal_scale=self.temporal_scale,
            training=self.training,
            tokens_per_second=self.tokens_per_second,
            rule=_resolve_rule(self.rule),
            visual_stride=self.visual_stride,
            **(self.scheme_options or {}),
        )

    @classmethod
    def from_config(cls, config: Any, scheme: str | None = None, **options: Any) -> RopeIndexOptions:
        """The options of a Qwen-VL ``config`` for ``scheme`` (default: the model's own,
        :func:`scheme_for_config`); ``options``: ``delta``, ``temporal_scale``, ``visual_stride``, ``training``,
        ``rule``, ``scheme_options``."""
        return cls._of_config(config, _attrs(config, ("model_type",))[0], scheme, options)

    @classmethod
    def _of_config(cls, config: Any, model_type: Any, scheme: str | None, options: dict) -> RopeIndexOptions:
        """:meth:`from_config` of a ``config`` whose ``model_type`` was read (``_MISSING``: it has none)."""
        # every field read once, from the instance dict where that is what getattr reads (:func:`_attrs`)
        model_type = None if model_type is _MISSING else model_type
        sch = scheme_for_model_type(model_type)
        if sch.audio:  # the Omni models: audio and their own arguments
            raise ValueError(
                f"config.model_type {model_type!r} (an Omni model, audio / TMRoPE): use "
                "mmpos.integrations.hf_omni.get_rope_index"
            )
        own = sch.name
        vision, image_token_id, video_token_id = _attrs(config, ("vision_config", "image_token_id", "video_token_id"))
        vision = None if vision is _MISSING else vision
        merge, tokens_per_second, temporal_merge = (
            (_MISSING, 1, None)
            if vision is None
            else _attrs(vision, ("spatial_merge_size", "tokens_per_second", "temporal_merge_size"))
        )
        missing = [
            n for n, v in (("image_token_id", image_token_id), ("video_token_id", video_token_id)) if v is _MISSING
        ]
        if vision is None or merge is _MISSING or missing:
            raise ValueError(
                f"config of model_type {model_type!r} lacks "
                f"{missing + ([] if vision is not None else ['vision_config'])} or vision_config.spatial_merge_size"
            )
        markers = None
        if model_type in GLM_VIDEO_MARKER_FAMILIES:
            markers = tuple(_attrs(config, ("video_start_token_id", "video_end_token_id")))
            if not all(isinstance(i, int) and not isinstance(i, bool) for i in markers):
                markers = video_markers(config)  # raises its error
        fields = dict(
            scheme=own if scheme is None else scheme,
            model_scheme=own,
            merge=merge,
            image_token_id=image_token_id,
            video_token_id=video_token_id,
            tokens_per_second=1 if tokens_per_second is _MISSING else tokens_per_second,
            temporal_merge=(None if temporal_merge is _MISSING else temporal_merge) or 1,
            video_markers=markers,
            **options,
        )
        # every get_rope_index call asks for its options: the checked options of the same values are made once
        # (the key holds types too, so 1 and 1.0 or True stay apart; unhashable values are checked every call)
        key = tuple([(k, type(v), v) for k, v in fields.items()])
        try:
            hash(key)
        except TypeError:
            return cls(**fields)
        return _options_of(cls, key)


_MISSING = object()  # a config field that is not there


#: the ``__getattribute__`` of transformers' configs: the class's ``attribute_map`` renames a field
#: (``configuration_utils``), a heterogeneous config refuses its per-layer fields (``integrations.heterogeneity``);
#: every other field is read as ``object.__getattribute__`` reads it
_CONFIG_GETATTRIBUTE = {
    ("transformers.configuration_utils", "PreTrainedConfig.__getattribute__"),
    ("transformers.configuration_utils", "PretrainedConfig.__getattribute__"),
    ("transformers.integrations.heterogeneity.configuration_utils", "HeterogeneousConfigMixin.__getattribute__"),
}


@functools.lru_cache(maxsize=256)
def _plain_fields(cls: type, names: tuple[str, ...]) -> bool:
    """Whether ``getattr(obj, name)`` of an instance of ``cls`` is the instance dict's entry where it has one,
    else the class attribute, for every name: no ``__getattr__``, every ``__getattribute__`` in the MRO
    ``object``'s or transformers' config ones, no name renamed by the class's ``attribute_map``, no descriptor
    of that name on the class (read once per class)."""
    for k in cls.__mro__:
        f = k.__dict__.get("__getattribute__")
        if "__getattr__" in k.__dict__ or (
            f is not None
            and f is not object.__getattribute__
            and (getattr(f, "__module__", None), getattr(f, "__qualname__", None)) not in _CONFIG_GETATTRIBUTE
        ):
            return False
    renames = getattr(cls, "attribute_map", {})
    if not isinstance(renames, dict) or any(name in renames for name in names):
        return False
    for name in names:
        owner = next((k for k in cls.__mro__ if name in k.__dict__), None)
        if owner is not None and hasattr(type(owner.__dict__[name]), "__get__"):  # a property, a method ...
            return False
    return True


def _attrs(obj: Any, names: tuple[str, ...]) -> list:
    """``getattr(obj, name, _MISSING)`` of every name, read from the instance dict where that is what
    ``getattr`` reads (:func:`_plain_fields`; a transformers config's ``getattr`` goes through two Python-level
    ``__getattribute__`` and costs microseconds): not for an instance ``attribute_map`` or a heterogeneous config."""
    cls = type(obj)
    if _plain_fields(cls, names):
        try:
            d = object.__getattribute__(obj, "__dict__")
        except AttributeError:  # no instance dict (slots)
            d = None
        if type(d) is dict and "attribute_map" not in d and d.get("_heterogeneity_spec") is None:
            return [d[n] if n in d else getattr(cls, n, _MISSING) for n in names]
    return [getattr(obj, n, _MISSING) for n in names]


@functools.lru_cache(maxsize=256)
def _options_of(cls: type, key: tuple) -> RopeIndexOptions:
    """``cls`` of the fields in ``key`` (``(name, type, value)`` triples), made and checked once per key."""
    return cls(**{name: value for name, _, value in key})


def _text_only(input_ids: Tensor, attention_mask: Tensor | None) -> tuple[Tensor, Tensor]:
    """transformers 4.57's branch without vision grids (padding gets position 1)."""
    b, length = input_ids.shape
    if attention_mask is None:
        ids = torch.arange(length, device=input_ids.device).view(1, 1, -1).expand(3, b, -1)
        return ids, torch.zeros(b, 1, dtype=input_ids.dtype, device=input_ids.device)
    ids = attention_mask.long().cumsum(-1) - 1
    ids = ids.masked_fill(attention_mask == 0, 1).unsqueeze(0).expand(3, -1, -1)
    return ids, ids[0].max(-1, keepdim=True).values + 1 - length


def _check_seconds(second_per_grid_ts: Any, videos: int) -> np.ndarray | None:
    """``(videos,)`` float32 host copy of ``second_per_grid_ts``, checked; ``None`` when not given (1 s each)."""
    if second_per_grid_ts is None:
        return None
    seconds = torch.as_tensor(second_per_grid_ts)
    if seconds.dtype == torch.bool or seconds.is_complex():
        raise ValueError(f"second_per_grid_ts must hold real numbers, got dtype {seconds.dtype}")
    if seconds.dtype == torch.float32:  # a host copy in fewer calls
        seconds = host(seconds).reshape(-1)  # read only
    else:
        seconds = seconds.detach().cpu().reshape(-1).float().numpy()
    if seconds.shape[0] != videos:
        raise ValueError(f"second_per_grid_ts must hold one value per video ({videos}), got {seconds.shape[0]}")
    if seconds.size and not (seconds.min() >= 0 and np.isfinite(seconds.max())):  # no NaN, negative or infinity
        raise ValueError(f"second_per_grid_ts must hold finite numbers >= 0, got {seconds.tolist()}")
    return seconds


def token_layout(
    options: RopeIndexOptions,
    input_ids: Tensor,
    image_grid_thw: Tensor | None = None,
    video_grid_thw: Tensor | None = None,
    attention_mask: Tensor | None = None,
    second_per_grid_ts: Tensor | None = None,
    mm_token_type_ids: Tensor | None = None,
    generator: torch.Generator | None = None,
) -> Layout:
    """The :class:`~mmpos.layout.Layout` of a tokenised Qwen-VL batch (the token-id front end
    of :func:`mmpos.layout.pack`; arguments as :func:`get_rope_index`). The integer bookkeeping
    runs on the host: tensors on an accelerator are read to the host once and the layout's
    tensors moved back once."""
    if not isinstance(input_ids, Tensor) or input_ids.dim() != 2:
        raise ValueError(f"input_ids must be a (B, L) tensor, got {getattr(input_ids, 'shape', input_ids)}")
    for name, t in (("attention_mask", attention_mask), ("mm_token_type_ids", mm_token_type_ids)):
        if t is not None and (not isinstance(t, Tensor) or tuple(t.shape) != tuple(input_ids.shape)):
            raise ValueError(
                f"{name} must have the shape of input_ids {tuple(input_ids.shape)}, got "
                f"{tuple(getattr(t, 'shape', ()))}"
            )
    out = new_ids(input_ids, get_scheme(options.scheme))  # (rows, B, L) before any temporary (new_ids)
    types = None if mm_token_type_ids is None else modality_types(mm_token_type_ids)
    merge, temporal_merge = options.merge, options.temporal_merge
    grid, k_img = check_grids(image_grid_thw, video_grid_thw, merge)  # (K, 3) images then videos, a fresh array
    videos = grid[k_img:]
    if temporal_merge > 1:  # ERNIE-4.5-VL: frames merged in time before the LLM
        if (videos[:, 0] % temporal_merge).any():
            raise ValueError(f"video_grid_thw: t must be divisible by the temporal merge size {temporal_merge}")
        videos[:, 0] //= temporal_merge
    seconds = _check_seconds(second_per_grid_ts, videos.shape[0])
    if options.frames and videos.shape[0]:  # one block per frame
        seconds = None if seconds is None else np.repeat(seconds, videos[:, 0])
        grid = np.concatenate([grid[:k_img], np.repeat(videos, videos[:, 0], axis=0)])
        grid[k_img:, 0] = 1
    if merge != 1:
        grid[:, 1:] //= merge  # (K, 3) in tokens
    tokens = grid[:, 0] * grid[:, 1] * grid[:, 2]  # (K,) (the packer's own product: no reduction loop)

    real = None if attention_mask is None else real_tokens(attention_mask, input_ids.shape)
    code = _vision_code(options, input_ids, types, real)  # (B, L) 1 image, 2 video, 0 else
    if code is None:  # image and video tokens share an id: two masks, as the reference reads them
        marks = host(input_ids)
        is_image, is_video = marks == options.image_token_id, marks == options.video_token_id
        if real is not None:
            is_image &= real
            is_video &= real
        firsts = np.concatenate(
            [
                block_first(is_image, tokens[:k_img], "image_grid_thw"),
                block_first(is_video, tokens[k_img:], "video_grid_thw"),
            ]
        )  # (K,) as listed: pack sorts them (and refuses overlapping ones)
        seconds = np.concatenate([np.zeros(k_img, dtype=np.float32), _seconds(seconds, grid.shape[0] - k_img)])
        blocks = VisionBlocks(grid, firsts, seconds, np.arange(grid.shape[0]) < k_img)
    else:
        start, end, value = marked_runs(code)  # (M,) the runs of image / video tokens, reading order
        if _frames_by_runs(options, types):  # GLM-4V: the image runs between video markers are frames
            value = value + _runs_inside(host(input_ids), start, *options.video_markers)
        blocks = _blocks_as_runs(grid, tokens, k_img, seconds, start, end, value)
        if blocks is None:  # blocks sharing a run, or an error to find: each modality's blocks fill its runs
            length, n = code.shape[1], code.size
            first_image, first_video = (
                fit_blocks(
                    start[value == v],
                    end[value == v],
                    part,
                    name,
                    length,
                    functools.partial(_mask, start, end, value, v, n),
                )
                for v, part, name in ((1, tokens[:k_img], "image_grid_thw"), (2, tokens[k_img:], "video_grid_thw"))
            )
            blocks = _reading_order(grid, first_image, first_video, _seconds(seconds, first_video.shape[0]))
    if real is None:
        real = np.ones(input_ids.shape, dtype=bool)
    return pack(real, blocks, options.scheme, options.resolved, generator=generator, device=input_ids.device, out=out)


def _vision_code(
    options: RopeIndexOptions, input_ids: Tensor, types: np.ndarray | None, real: np.ndarray | None
) -> np.ndarray | None:
    """``(B, L)`` uint8: 1 on the image tokens, 2 on the video tokens (real tokens only), 0 elsewhere; ``None``
    where the config gives images and videos one token id (the caller reads two masks)."""
    markers = options.video_markers
    if types is not None and types.dtype.kind in "biu":  # checked: 0, 1 or 2
        code = types.astype(np.uint8)
        if real is not None:
            code *= real.view(np.uint8)
    else:
        if types is not None:  # e.g. float types: the tokens equal to 1 and 2
            marks, image_mark, video_mark = types, 1, 2
        else:
            marks, image_mark, video_mark = host(input_ids), options.image_token_id, options.video_token_id
            if markers is None and image_mark == video_mark:
                return None
        # GLM-4V without types: its video tokens are not read (else no token is both: the ids differ, or types do)
        code = modality_code(marks, image_mark, video_mark if types is not None or markers is None else None, real)
    if markers is not None and not _frames_by_runs(options, types):  # image tokens between video markers: frames
        framed = inside_markers(host(input_ids), *markers) & (code == 1)  # (transformers 4.57 types them 1)
        code += framed.view(np.uint8)
    return code


def _mask(start: np.ndarray, end: np.ndarray, value: np.ndarray, v: int, n: int) -> np.ndarray:
    """``(n,)`` bool: the tokens of the runs of value ``v`` (made on the error path only)."""
    change = np.zeros(n + 1, dtype=np.int64)
    change[start[value == v]] += 1
    change[end[value == v]] -= 1
    return np.cumsum(change[:-1]) > 0


def _frames_by_runs(options: RopeIndexOptions, types: np.ndarray | None) -> bool:
    """Whether GLM-4V's frames are told from its images run by run (:func:`_runs_inside`), not token by token
    (:func:`~.hf_families.inside_markers`): without ``mm_token_type_ids`` (only image tokens are read) and with
    marker ids other than the image token's (a run then holds no marker, so it lies inside or outside as a whole)."""
    markers = options.video_markers
    return markers is not None and types is None and options.image_token_id not in markers


def _runs_inside(ids: np.ndarray, first: np.ndarray, start_id: int, end_id: int) -> np.ndarray:
    """``(M,)`` bool: whether the token at each flat index ``first`` of the ``(B, L)`` ``ids`` follows more
    ``start_id`` than ``end_id`` tokens of its row (GLM-4V's ``create_mm_token_type_ids``, as
    :func:`~.hf_families.inside_markers` reads it), from the marker tokens alone (no ``(B, L)`` mask)."""
    length = ids.shape[1]
    flat = ids.reshape(-1)
    is_start = flat == start_id
    marks = np.flatnonzero(is_start | (flat == end_id))  # (P,) every marker, reading order
    if not marks.size:
        return np.zeros(first.shape[0], dtype=bool)
    opened = np.zeros(marks.shape[0] + 1, dtype=np.int64)  # (P + 1,) starts minus ends among the first i markers
    np.cumsum(np.where(is_start[marks], 1, -1), out=opened[1:])
    row_start = first - first % length
    return opened[np.searchsorted(marks, first)] > opened[np.searchsorted(marks, row_start)]


def _blocks_as_runs(
    grid: np.ndarray,
    tokens: np.ndarray,
    k_img: int,
    seconds: np.ndarray | None,
    start: np.ndarray,
    end: np.ndarray,
    value: np.ndarray,
) -> VisionBlocks | None:
    """The :class:`~mmpos.layout.VisionBlocks` in reading order where every run of placeholder tokens
    (:func:`~._token_blocks.marked_runs`) is one block: the ``i``-th image run holds the ``i``-th image grid's
    tokens, the ``i``-th video run the ``i``-th video grid's (what :func:`~._token_blocks.fit_blocks` finds then,
    in a few operations on the ``K`` runs); else ``None``."""
    k = tokens.shape[0]
    if start.shape[0] != k:
        return None
    is_image = value == 1  # (K,) the runs in reading order (values 1 and 2)
    image_runs = is_image.nonzero()[0]  # (methods, not NumPy's Python-level wrappers)
    if image_runs.shape[0] != k_img:
        return None
    run = np.concatenate([image_runs, (value != 1).nonzero()[0]])  # (K,) the run of each grid: images, videos
    if (end.take(run) - start.take(run) != tokens).any():
        return None
    run_grid = np.empty((k, 3), dtype=np.int64)  # (K, 3) the grid of each run
    run_grid[run] = grid
    if seconds is None:  # images: no time scaling; videos: 1 s
        run_seconds = np.subtract(1, is_image, dtype=np.float32)
    else:
        run_seconds = np.zeros(k, dtype=np.float32)
        run_seconds[run[k_img:]] = seconds
    return VisionBlocks(run_grid, start, run_seconds, is_image)


def _seconds(seconds: np.ndarray | None, videos: int) -> np.ndarray:
    """``(videos,)`` float32 seconds per temporal patch (:func:`_check_seconds`; ``None``: 1 s each)."""
    return np.ones(videos, dtype=np.float32) if seconds is None else seconds


def _reading_order(grid: np.ndarray, first_image: np.ndarray, first_video: np.ndarray, seconds: np.ndarray):
    """The :class:`~mmpos.layout.VisionBlocks` of the image blocks and the video blocks (each in reading order),
    merged in reading order (as :func:`~mmpos.layout.pack` reads them; images: no time scaling)."""
    k_img, k_vid = first_image.shape[0], first_video.shape[0]
    if not (k_img and k_vid):
        is_image = np.full(k_img + k_vid, bool(k_img))
        first = first_image if k_img else first_video
        return VisionBlocks(grid, first, seconds if k_vid else np.zeros(k_img, dtype=np.float32), is_image)
    at_image = np.searchsorted(first_video, first_image)  # (K_img,) videos before each image ...
    at_image += np.arange(k_img)  # ... plus the images before: its place among all blocks
    at_video = np.searchsorted(first_image, first_video)
    at_video += np.arange(k_vid)
    order = np.empty(k_img + k_vid, dtype=np.int64)  # (K,) the block at each place, blocks as listed
    order[at_image] = np.arange(k_img)
    order[at_video] = np.arange(k_img, k_img + k_vid)
    first = np.empty(k_img + k_vid, dtype=np.int64)
    first[at_image], first[at_video] = first_image, first_video
    is_image = np.zeros(k_img + k_vid, dtype=bool)
    is_image[at_image] = True
    all_seconds = np.zeros(k_img + k_vid, dtype=np.float32)
    all_seconds[at_video] = seconds
    return VisionBlocks(grid[order], first, all_seconds, is_image)


def scheme_rope_index(
    options: RopeIndexOptions,
    input_ids: Tensor,
    image_grid_thw: Tensor | None = None,
    video_grid_thw: Tensor | None = None,
    attention_mask: Tensor | None = None,
    second_per_grid_ts: Tensor | None = None,
    mm_token_type_ids: Tensor | None = None,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    """HF-shaped ``(position_ids (3, B, L), rope_deltas (B, 1))`` of a Qwen-VL prompt under
    ``options.scheme`` and ``options.rule``, from :func:`token_layout`.

    Arguments as :func:`get_rope_index`. Rows are packed as the scheme declares
    (``Scheme.hf_rows``): VRoPE's rows are ``c0, c1, c2`` (``c3 = c1 + c2 - c0``); 1-D
    schemes repeat their row. Ids are float64 for ``v2pe`` and float32 for ``hope``
    (``rope_deltas`` too) when the prompt has vision blocks, else the dtype of ``input_ids``.
    """
    rule = options.resolved.rule  # type: ignore[attr-defined]
    if isinstance(input_ids, Tensor) and (
        input_ids.is_floating_point() or input_ids.is_complex() or input_ids.dtype == torch.bool
    ):
        raise TypeError(f"input_ids must be an integer tensor of token ids, got {input_ids.dtype}")
    if image_grid_thw is None and video_grid_thw is None and rule.deltas == "next-padded":
        if not isinstance(input_ids, Tensor) or input_ids.dim() != 2:
            raise ValueError(f"input_ids must be a (B, L) tensor, got {getattr(input_ids, 'shape', input_ids)}")
        return _text_only(input_ids, attention_mask)
    lay = token_layout(
        options,
        input_ids,
        image_grid_thw,
        video_grid_thw,
        attention_mask,
        second_per_grid_ts,
        mm_token_type_ids,
        generator,
    )
    ids, deltas = lay.hf_position_ids("3d"), lay.rope_deltas
    fractional = ids.is_floating_point() and lay.num_vision_tokens > 0
    if not fractional:  # integer schemes, and fractional ones on prompts without vision blocks
        ids, deltas = ids_in_dtype(ids, deltas, input_ids.dtype)
    return ids, deltas


def packed_rope_index(
    config: Any,
    input_ids: Tensor,
    cu_seqlens: Tensor,
    image_grid_thw: Tensor | None = None,
    video_grid_thw: Tensor | None = None,
    second_per_grid_ts: Tensor | None = None,
    mm_token_type_ids: Tensor | None = None,
    rule: str = "original",
    scheme: str | None = None,
) -> tuple[Tensor, Tensor]:
    """Position ids of a packed batch: several samples in one row, positions reset per sample.

    Args:
        config, image_grid_thw, video_grid_thw, second_per_grid_ts, rule: as :func:`get_rope_index`
            (the grids in order of appearance across the packed row).
        input_ids: ``(1, N)`` the samples one after the other, no padding.
        cu_seqlens: ``(B + 1,)`` sample offsets (FlashAttention varlen's ``cu_seqlens``: 0, then the
            running sum of the sample lengths).
        mm_token_type_ids: ``(1, N)`` optional, as :func:`get_rope_index`.
        scheme: another :mod:`mmpos.schemes` scheme than the model's own (default ``None``).

    Returns:
        ``position_ids`` ``(3, 1, N)`` (each sample's positions as if it were alone, so every
        sample starts at 0) and ``rope_deltas`` ``(B, 1)``, each sample's own.
    """
    if not isinstance(input_ids, Tensor) or input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise ValueError(f"input_ids must be a packed (1, N) tensor, got {getattr(input_ids, 'shape', input_ids)}")
    total = input_ids.shape[1]
    lengths, unpack = packed_rows(cu_seqlens, total, input_ids.device)
    b, longest = lengths.shape[0], int(lengths.max())
    if mm_token_type_ids is not None and tuple(mm_token_type_ids.shape) != tuple(input_ids.shape):
        raise ValueError(f"mm_token_type_ids must have the shape of input_ids {tuple(input_ids.shape)}")
    mask = unpack(torch.ones_like(input_ids, dtype=torch.bool))  # right padding
    options = RopeIndexOptions.from_config(config, scheme, rule=rule)
    lay = token_layout(
        options,
        unpack(input_ids),
        image_grid_thw,
        video_grid_thw,
        mask,
        second_per_grid_ts,
        None if mm_token_type_ids is None else unpack(mm_token_type_ids),
    )
    ids, _, _ = lay.packed("3d")
    deltas = lay.rope_deltas
    if options.resolved.rule.deltas == "next-padded":  # type: ignore[attr-defined]  # relative to each sample alone
        deltas = deltas + torch.from_numpy(longest - lengths).view(b, 1).to(deltas)
    if not ids.is_floating_point():
        ids, deltas = ids_in_dtype(ids, deltas, input_ids.dtype)
    return ids, deltas


def get_rope_index(
    config: Any,
    input_ids: Tensor,
    image_grid_thw: Tensor | None = None,
    video_grid_thw: Tensor | None = None,
    attention_mask: Tensor | None = None,
    second_per_grid_ts: Tensor | None = None,
    mm_token_type_ids: Tensor | None = None,
    rule: str = "original",
    images_per_sample: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """3-D position ids ``(3, B, L)`` and ``rope_deltas`` ``(B, 1)`` of a Qwen-VL batch.

    ``hy_v4_vl``, ``hunyuan_vl`` and ``glm_image`` configs go to their own token layouts
    (:mod:`mmpos.integrations.hf_families`; HunYuan-VL returns ``(N, B, L)``, GLM-Image reads
    ``images_per_sample`` and no videos).

    Args:
        config: a ``Qwen2VLConfig``, ``Qwen2_5_VLConfig``, ``Qwen3VLConfig`` or
            ``Qwen3VLMoeConfig`` (read: ``model_type``, ``image_token_id``, ``video_token_id``,
            ``vision_config.spatial_merge_size``, ``vision_config.tokens_per_second``).
        input_ids: ``(B, L)`` token ids; every image / video has ``t * h * w / merge**2``
            consecutive placeholder tokens (for Qwen3-VL: per frame).
        image_grid_thw: ``(num_images, 3)`` patch grids, in order of appearance.
        video_grid_thw: ``(num_videos, 3)`` patch grids.
        attention_mask: ``(B, L)``, 1 on real tokens; left or right padding.
        second_per_grid_ts: ``(num_videos,)`` seconds per temporal patch (Qwen2.5-VL; default 1),
            finite and ``>= 0``.
        mm_token_type_ids: ``(B, L)`` 0 text, 1 image, 2 video (transformers >= 5.3 input);
            when given it locates the vision tokens instead of the token ids.
        rule: ``"original"``, ``"hf-4.57"``, ``"hf-5.3"`` or ``"installed"`` (module docstring).
        images_per_sample: ``(B,)`` GLM-Image only: how many grids of ``image_grid_thw`` each sample reads.

    Returns:
        ``position_ids`` ``(3, B, L)`` (dtype of ``input_ids``) and ``rope_deltas`` ``(B, 1)``,
        equal to the model's own ``get_rope_index`` of the release whose rule is asked for.
    """
    model_type = _attrs(config, ("model_type",))[0]
    model_type = None if model_type is _MISSING else model_type
    family = FAMILY_ROPE_INDEX.get(model_type)
    if family is not None:
        if model_type == "glm_image":
            if video_grid_thw is not None or second_per_grid_ts is not None or mm_token_type_ids is not None:
                raise ValueError(
                    "model_type 'glm_image' reads input_ids, image_grid_thw, images_per_sample, attention_mask"
                )
            return family(config, input_ids, image_grid_thw, images_per_sample, attention_mask, rule=rule)
        if second_per_grid_ts is not None:
            raise ValueError(f"second_per_grid_ts applies to the Qwen2.5-VL rule, not model_type {model_type!r}")
        return family(config, input_ids, image_grid_thw, video_grid_thw, attention_mask, mm_token_type_ids, rule=rule)
    if images_per_sample is not None:
        raise ValueError("images_per_sample applies to model_type 'glm_image' only")
    options = RopeIndexOptions._of_config(config, model_type, None, {"rule": rule})
    return scheme_rope_index(
        options, input_ids, image_grid_thw, video_grid_thw, attention_mask, second_per_grid_ts, mm_token_type_ids
    )
