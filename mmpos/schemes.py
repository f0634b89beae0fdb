"""The multimodal position schemes: one registry entry per scheme.

A *scheme* decides where the tokens of an interleaved text / image / video sequence sit.
Every fact about a scheme lives in its :class:`Scheme` entry of :data:`SCHEMES`:

* ``axes`` -- the coordinate axes it produces (``coords.axes`` of its :class:`~mmpos.layout.Layout`);
* ``block`` -- where the tokens of one vision block sit relative to the block start, and
  how far the block moves the running position (its *extent*), see :class:`BlockGeometry`;
  or ``rows``, the same rule per row of a block (a first value and a step along the row), from
  which the packer writes integer ids without per-token offsets (:data:`RowRule`);
* ``options`` / ``check`` -- which options it takes (``delta``, ``temporal_scale``) and their
  validation, shared by :func:`mmpos.layout.build` and the token-id path
  (:mod:`mmpos.integrations.hf_rope_index`), see :func:`resolve_options`;
* ``draws`` -- per-block random choices during training (V2PE ``delta``, HoPE scale), drawn
  from the caller's ``generator`` on both paths;
* ``id_dtype`` / ``delta_dtype`` / ``coord_dtype`` -- dtypes of its position ids, ``rope_deltas``
  and coordinates;
* ``hf_rows`` -- how its axes pack into the three Hugging Face position rows, and
  ``rows_to_axes``, how the rotary embedding reads them back;
* ``encoder`` -- the :mod:`mmpos.encoders` rotary encoder that reads its coordinates (the one
  scheme -> encoder map: read ``SCHEMES[name].encoder``);
  ``encoder_kwargs`` -- the arguments that encoder needs to read them (HunYuan-VL's axis names);
* ``frames`` -- whether a video is one block per frame (Qwen3-VL, timestamps between frames);
* ``paper`` / ``reference`` -- the paper, and the repository and file (function) of the reference
  implementation of its positions (``mmpos list schemes`` prints both);
* ``model_types`` -- the Hugging Face ``config.model_type`` values whose own ``get_rope_index``
  this scheme reproduces (:func:`scheme_for_model_type`); ``rotary_model_types`` -- those of them
  whose own rotary embedding is ``encoder`` (what :func:`mmpos.integrations.hf_rope.use_rope`
  can swap, checked logit-exact).

Adding a scheme is one :func:`register_scheme` call (``docs/adding-a-scheme.md``).

Qwen-family *rules* (:data:`RULES`) are a second, orthogonal choice: how far the text after
a vision block moves (``advance``), how Qwen2.5-VL turns seconds into temporal indices
(``seconds``) and the Hugging Face conventions for padding and ``rope_deltas``:

=============  ===========  ============  =======  ================================================
rule           advance      seconds       padding  ``rope_deltas``
=============  ===========  ============  =======  ================================================
``original``   ``max``      ``exact``     1        next position - padded length
``hf-4.57``    ``max``      ``truncate``  1        next position - padded length
``hf-5.3``     ``spatial``  ``interval``  0        max(largest position + 1, next) - real length
=============  ===========  ============  =======  ================================================

``max``: the text after a block continues at the block's maximum over every axis + 1 (the
rule of the Qwen2/2.5/3-VL checkpoints and transformers <= 5.2). ``spatial``: at the block
start + ``max(h, w)`` (transformers >= 5.3, huggingface/transformers #43972; the temporal
extent of a video is ignored, #45381). ``exact``: Qwen2.5-VL temporal index
``floor(t * (second_per_grid * tokens_per_second))`` in float32, images index 0;
``truncate``: ``second_per_grid`` cast to an integer first (transformers 4.57, fixed by
#48669); ``interval``: as ``exact`` but images use interval 1 (transformers >= 5.3 passes
images through the same ``get_vision_position_ids``). Rules only change the schemes whose
``block`` reads them (the Qwen family, MRoPE-I, MHRoPE) and the padding / delta conventions.
Two more, ``qwen2.5-omni`` and ``qwen3-omni``, hold the Omni models' conventions (padding 1 / 0,
``rope_deltas`` = largest position + 1 - real length; their TMRoPE blocks place themselves).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property, partial
from types import MappingProxyType

import numpy as np
import torch
from torch import Tensor

from ._validate import check_bool, check_int, is_real

__all__ = [
    "ADVANCES",
    "CIRCLE_METHODS",
    "HOPE_SCALES",
    "RULES",
    "SCHEMES",
    "V2PE_DELTAS",
    "BlockGeometry",
    "Rule",
    "Scheme",
    "SchemeOptions",
    "get_rule",
    "get_scheme",
    "model_types",
    "register_scheme",
    "resolve_options",
    "scheme_for_model_type",
]

#: HoPE's training choices of the temporal scale ``s`` (hrlics/HoPE ``modeling_hope.py``)
HOPE_SCALES = (0.5, 0.75, 1.0, 1.25, 1.5)
#: V2PE's training choices of the visual step ``delta = stride / 256`` (OpenGVLab/V2PE ``v2pe_rnd``)
V2PE_DELTAS = tuple(2.0**-k for k in range(9))
ADVANCES = ("max", "spatial")


@dataclass(frozen=True)
class Rule:
    """A Qwen-family rule (see the module docstring)."""

    name: str
    advance: str  # "max" | "spatial"
    seconds: str  # "exact" | "truncate" | "interval"
    padding_value: int  # position id written on padding
    deltas: str  # "next-padded" | "max-real"


#: the rules by name
RULES: dict[str, Rule] = {
    r.name: r
    for r in (
        Rule("original", "max", "exact", 1, "next-padded"),
        Rule("hf-4.57", "max", "truncate", 1, "next-padded"),
        Rule("hf-5.3", "spatial", "interval", 0, "max-real"),
    )
}


def get_rule(rule: str | Rule) -> Rule:
    """The :class:`Rule` named ``rule`` (``ValueError`` naming the known rules otherwise)."""
    if isinstance(rule, Rule):
        return rule
    if not isinstance(rule, str) or rule not in RULES:
        raise ValueError(f"rule must be one of {tuple(RULES)}, got {rule!r}")
    return RULES[rule]


@dataclass(frozen=True)
class SchemeOptions:
    """Validated options of one scheme (made by :func:`resolve_options`).

    ``delta``: V2PE visual step (``None`` while training: drawn per block);
    ``temporal_scale``: HoPE scale (``None`` while training) or the MRoPE-I integer stride;
    ``tokens_per_second``: Qwen2.5-VL temporal resolution; ``rule``: a :class:`Rule`;
    ``visual_stride``: V2PE's block-span form, the position span of one vision block (its
    per-token step is ``visual_stride / tokens``; ``None``: the per-token ``delta``).
    ``extra``: the scheme's own options beyond those (CircleRoPE's ``radius``, ``alpha``, ...),
    by name, as its ``check`` returned them (read-only).
    """

    delta: float | None
    temporal_scale: float | None
    training: bool
    tokens_per_second: float
    rule: Rule
    visual_stride: float | None = None
    extra: Mapping[str, object] = field(default_factory=lambda: MappingProxyType({}))


#: the options every scheme path takes by name (a scheme's other ``options`` travel in ``SchemeOptions.extra``)
_SHARED_OPTIONS = ("delta", "temporal_scale", "visual_stride")


@dataclass(frozen=True, eq=False)
class BlockGeometry:
    """The vision blocks of a batch, per block ``(K,)`` and per vision token ``(Nv,)``.

    Per block (float64 unless said): ``t``, ``h``, ``w`` (tokens, after the spatial merge),
    ``tokens`` (int64 ``t * h * w``), ``seconds`` (float32 seconds per temporal patch, 0 for
    images), ``is_image`` (bool), ``delta`` and ``scale`` (the per-block V2PE step / HoPE scale).
    Per row (``R = sum t * h`` rows: the ``w`` tokens of row ``i`` of frame ``f`` of a block, blocks
    in order, rows in raster order), built on first read: ``row_block`` (int64 index of its block),
    ``row_t`` and ``row_h`` (float64 ``f`` and ``i``), ``row_first`` (float64 index of its first
    token inside the block). Per token, built on first read (a block rule reads only what it
    needs): ``block`` (int64 index of its block), ``local`` (index inside the block, raster order
    t, h, w), ``ti``, ``hi``, ``wi`` (its frame, row and column). All are CPU tensors (the packer,
    :func:`mmpos.layout.pack`, works on the host) and read-only: ``ti`` of a batch of still
    images is one stored zero, expanded.
    """

    t: Tensor
    h: Tensor
    w: Tensor
    tokens: Tensor
    seconds: Tensor
    is_image: Tensor
    delta: Tensor
    scale: Tensor
    #: internal: the ``(K, 3)`` int64 grid the per-token fields are built from
    _grid: np.ndarray = field(repr=False)
    #: ``(K,)`` int64 tokens of each block besides its ``t * h * w`` video tokens (the audio of an
    #: audio-visual block, :class:`mmpos.layout.VisionBlocks`); ``None``: none. The per-token fields
    #: above cover the video tokens only; a scheme with ``Scheme.audio`` places the others.
    audio: Tensor | None = None
    #: ``(K,)`` float64 running position at each block's first token, for schemes with ``Scheme.reads_start``
    #: (``None`` on the packer's first call; it calls again with the starts its extents gave, until they settle)
    start: Tensor | None = None

    @classmethod
    def of(
        cls, grid, seconds: Tensor, is_image: Tensor, delta: Tensor, scale: Tensor, audio: Tensor | None = None
    ) -> BlockGeometry:
        """From the per-block ``grid`` ``(K, 3)`` int64 (array or tensor) and per-block values."""
        grid = np.ascontiguousarray(grid.cpu().numpy() if isinstance(grid, Tensor) else grid, dtype=np.int64)
        t, h, w = torch.from_numpy(np.ascontiguousarray(grid.T, dtype=np.float64)).unbind()  # (3, K): three (K,) rows
        tokens = torch.from_numpy(grid.prod(-1))
        return cls(t, h, w, tokens, seconds, is_image, delta, scale, grid, audio)

    @classmethod
    def from_host(cls, grid: np.ndarray, seconds: np.ndarray, is_image: np.ndarray, delta: float, scale: float):
        """:meth:`of` from host arrays, its per-block tensors built on first read (``grid`` ``(K, 3)`` int64, ``seconds``
        ``(K,)`` float32, ``is_image`` ``(K,)`` bool, ``delta`` and ``scale`` one value for every block; no
        audio): a row rule reading only the grid's rows makes no tensor."""
        self = cls.__new__(cls)
        self.__dict__.update(_grid=grid, audio=None, start=None, _defer=(seconds, is_image, delta, scale))
        return self

    def _host(self, name: str) -> np.ndarray:
        """``seconds`` or ``is_image`` as a NumPy array, without building a :meth:`from_host` geometry's tensors."""
        defer = self.__dict__.get("_defer")
        if defer is not None:
            return defer[0] if name == "seconds" else defer[1]
        return getattr(self, name).detach().cpu().numpy()

    def __getattr__(self, name: str):
        """The per-block tensors of a :meth:`from_host` geometry, all built at the first read of one."""
        defer = self.__dict__.get("_defer")
        if defer is None or name not in _DEFERRED:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        seconds, is_image, delta, scale = defer
        k = self._grid.shape[0]
        built = BlockGeometry.of(
            self._grid,
            torch.from_numpy(seconds),
            torch.from_numpy(is_image),
            torch.from_numpy(np.full(k, delta)),
            torch.from_numpy(np.full(k, scale)),
        )
        self.__dict__.update({f: built.__dict__[f] for f in _DEFERRED})
        del self.__dict__["_defer"]
        return self.__dict__[name]

    @cached_property
    def _rows(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per row ``(f, i)`` of every block (``R = sum t * h`` rows): block, ``f * H + i``,
        width, and per token its row; vectorised in two levels, no division per token."""
        t, h, w = self._grid.T
        k_rows = t * h  # (K,) rows per block
        row_block = np.arange(len(k_rows)).repeat(k_rows)  # (R,)
        row_local = np.arange(len(row_block)) - (k_rows.cumsum() - k_rows).repeat(k_rows)  # f * H + i
        row_w = w.take(row_block)
        return row_block, row_local, row_w, row_w.cumsum() - row_w  # ..., first token of each row

    def _per_token(self, per_row: np.ndarray) -> Tensor:
        """``(Nv,)`` float64: a per-row value repeated over the row's tokens."""
        return torch.from_numpy(np.repeat(per_row.astype(np.float64), self._rows[2]))

    @cached_property
    def row_block(self) -> Tensor:
        if "_rows" in self.__dict__:
            return torch.from_numpy(self._rows[0])
        return torch.from_numpy(np.arange(self._grid.shape[0]).repeat(self._grid[:, 0] * self._grid[:, 1]))

    @cached_property
    def row_t(self) -> Tensor:
        return torch.from_numpy(self._frame_row[0].astype(np.float64))

    @cached_property
    def row_h(self) -> Tensor:
        return torch.from_numpy(self._frame_row[1].astype(np.float64))

    @cached_property
    def row_first(self) -> Tensor:
        """``(R,)`` float64 index of each row's first token inside its block (``f * H * W + i * W``)."""
        _, row_local, row_w, _ = self._rows
        return torch.from_numpy((row_local * row_w).astype(np.float64))

    @cached_property
    def block(self) -> Tensor:
        return torch.from_numpy(np.repeat(np.arange(self._grid.shape[0]), self.tokens.numpy()))

    @cached_property
    def local(self) -> Tensor:
        tokens = self.tokens.numpy()
        nv = int(tokens.sum())
        return torch.from_numpy(np.arange(nv, dtype=np.float64) - np.repeat((np.cumsum(tokens) - tokens), tokens))

    @cached_property
    def _frames(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        """Per frame (``F = sum t`` frames, blocks in order) int64: its rows ``h``, its index ``f`` in its block and
        its first row; and ``R``, the number of rows (a few operations on ``K`` and ``F`` values)."""
        t, h = self._grid[:, 0], self._grid[:, 1]
        frame_h = h.repeat(t)  # (F,) rows per frame
        frame_f = np.arange(frame_h.shape[0])
        frame_f -= (t.cumsum() - t).repeat(t)  # (F,) index in its block
        row_end = frame_h.cumsum()  # (F,) one past each frame's last row
        return frame_h, frame_f, row_end - frame_h, int(row_end[-1]) if row_end.size else 0

    def _row_i(self, out: np.ndarray, frame_shift: np.ndarray | None = None) -> np.ndarray:
        """Write each row's row ``i`` in its frame into ``out`` ``(R,)`` int64 (plus its frame's ``frame_shift``
        ``(F,)``, if given): the row's index minus its frame's first row, repeated per frame (no division)."""
        frame_h, _, frame_row, n = self._frames
        if frame_shift is not None:
            frame_row = frame_row - frame_shift
        return np.subtract(np.arange(n), frame_row.repeat(frame_h), out=out)

    @cached_property
    def _frame_row(self) -> tuple[np.ndarray, np.ndarray]:
        """Per row: its frame ``f`` and row ``i`` in the frame (two levels of runs, no division)."""
        frame_h, frame_f, _, n = self._frames
        return frame_f.repeat(frame_h), self._row_i(np.empty(n, dtype=np.int64))  # (R,) each

    @cached_property
    def ti(self) -> Tensor:
        if (self._grid[:, 0] == 1).all():  # still images and single frames: frame 0 everywhere (one stored zero)
            return torch.zeros(1, dtype=torch.float64).expand(int(self.tokens.sum()))
        return self._per_token(self._frame_row[0])

    @cached_property
    def hi(self) -> Tensor:
        return self._per_token(self._frame_row[1])

    @cached_property
    def wi(self) -> Tensor:
        _, _, row_w, row_first = self._rows
        wi = np.repeat(-row_first.astype(np.float64), row_w)  # (Nv,) minus the row's first token ...
        wi += np.arange(wi.shape[0], dtype=np.float64)  # ... plus the token's index
        return torch.from_numpy(wi)


_DEFERRED = ("t", "h", "w", "tokens", "seconds", "is_image", "delta", "scale")  # BlockGeometry.from_host's

#: what a block rule returns: offsets from the block start ``(A, Nv)``, extents ``(K,)`` and
#: which axes add the block start ``(A,)``, all float64
BlockRule = Callable[[BlockGeometry, SchemeOptions], tuple[Tensor, Tensor, Tensor]]
#: what a per-row block rule returns (``Scheme.rows``): per axis and row of every block the offset of
#: the row's first token from the block start ``(A, R)``, the step from one token of a row to the next
#: ``(A,)``, extents ``(K,)`` and which axes add the block start ``(A,)``, float64 tensors or NumPy arrays
#: (``base`` may be an integer array: the packer then skips its integrality check): token ``j`` of row
#: ``r`` sits at ``start * use_start + base[:, r] + step * j``
RowRule = Callable[[BlockGeometry, SchemeOptions], tuple[Tensor | np.ndarray, ...]]


def _tokens_of_rows(rows: RowRule, g: BlockGeometry, o: SchemeOptions) -> tuple[Tensor, Tensor, Tensor]:
    """A per-row rule's per-token form (``Scheme.block`` of a scheme given ``rows``): offsets ``(A, Nv)``."""
    base, step, extent, use_start = rows(g, o)
    base = base.numpy() if isinstance(base, Tensor) else np.asarray(base)
    # a rule may return shared constants: the caller's own copies
    step, use_start = (
        torch.from_numpy(np.array(x, dtype=np.float64))  # (a copy: the constants are read-only)
        if isinstance(x, np.ndarray)
        else torch.as_tensor(x, dtype=torch.float64).clone()
        for x in (step, use_start)
    )
    _, _, row_w, row_first = g._rows
    j = np.arange(int(row_w.sum()), dtype=np.float64) - np.repeat(row_first.astype(np.float64), row_w)  # (Nv,)
    offset = np.repeat(base, row_w, axis=1) + step.numpy()[:, None] * j  # (A, Nv) float64
    return torch.from_numpy(offset), torch.as_tensor(extent, dtype=torch.float64), use_start


@dataclass(frozen=True)
class Scheme:
    """One position scheme (see the module docstring for what each field means).

    ``hf_rows`` ``(3, A)``: Hugging Face row ``r`` holds ``sum_a hf_rows[r][a] * axis_a``;
    ``rows_to_axes`` ``(A, 3)``: axis ``a`` is ``sum_r rows_to_axes[a][r] * row_r``. The two
    invert each other on every position the scheme produces.
    """

    name: str
    axes: tuple[str, ...]
    encoder: str
    #: the per-token block rule; ``None`` with ``rows`` (then made from it)
    block: BlockRule | None
    hf_rows: tuple[tuple[int, ...], ...]
    rows_to_axes: tuple[tuple[int, ...], ...]
    options: tuple[str, ...] = ()
    check: Callable[[str, dict], dict] | None = None
    draws: dict[str, tuple[float, ...]] = field(default_factory=dict)
    id_dtype: torch.dtype = torch.long
    delta_dtype: torch.dtype = torch.long
    coord_dtype: torch.dtype = torch.float32
    frames: bool = False
    paper: str = ""
    reference: str = ""
    model_types: tuple[str, ...] = ()
    rotary_model_types: tuple[str, ...] = ()
    #: whether ``block`` places audio-visual blocks (``VisionBlocks.audio``: audio tokens interleaved with a
    #: video's); the packer refuses them for other schemes
    audio: bool = False
    #: whether ``block`` reads ``BlockGeometry.start`` (Qwen3-Omni: float32 sums that include the block start)
    reads_start: bool = False
    #: with ``reads_start``: the ``(K,)`` extents alone that ``block`` gives for the geometry's ``start``, from the
    #: blocks without a per-token value; the packer then settles the starts on it and calls ``block`` once (``None``:
    #: ``block`` is called again until the starts settle)
    extent: Callable[[BlockGeometry, SchemeOptions], Tensor | np.ndarray] | None = None
    #: arguments ``encoder`` needs to read this scheme's coordinates (HunYuan-VL: ``{"axes": ("w", "h", "image")}``)
    encoder_kwargs: dict[str, object] = field(default_factory=dict)
    #: the block rule per row (:data:`RowRule`), for rules whose positions move by a fixed step along a row
    #: of a block: the packer writes integer ids from it without per-token offsets (``block`` is then ``None``)
    rows: RowRule | None = None

    def __post_init__(self) -> None:
        a = len(self.axes)
        if len(self.hf_rows) != 3 or any(len(r) != a for r in self.hf_rows):
            raise ValueError(f"scheme {self.name!r}: hf_rows must be 3 rows of {a} weights")
        if len(self.rows_to_axes) != a or any(len(r) != 3 for r in self.rows_to_axes):
            raise ValueError(f"scheme {self.name!r}: rows_to_axes must be {a} rows of 3 weights")
        if isinstance(self.model_types, str) or not all(isinstance(m, str) for m in self.model_types):
            raise TypeError(f"scheme {self.name!r}: model_types must be a tuple of str, got {self.model_types!r}")
        object.__setattr__(self, "model_types", tuple(self.model_types))
        object.__setattr__(self, "rotary_model_types", tuple(self.rotary_model_types))
        if not set(self.rotary_model_types) <= set(self.model_types):
            raise ValueError(f"scheme {self.name!r}: rotary_model_types must be a subset of model_types")
        block = self.block
        made = isinstance(block, partial) and block.func is _tokens_of_rows and block.args == (self.rows,)
        if (block is None) == (self.rows is None) and not made:  # (dataclasses.replace passes the made one back)
            raise ValueError(f"scheme {self.name!r}: give exactly one of block (per token) and rows (per row)")
        if block is None:
            object.__setattr__(self, "block", partial(_tokens_of_rows, self.rows))  # the row rule's per-token form
        if self.extent is not None and not (self.reads_start and callable(self.extent)):
            raise ValueError(f"scheme {self.name!r}: extent must be a function, given with reads_start=True")


#: every scheme by name (``register_scheme`` adds to it)
SCHEMES: dict[str, Scheme] = {}


#: ``Scheme.reference``: the reference implementation, ``"owner/repo path/to/file.py (function)"``
_REFERENCE = re.compile(r"[\w.-]+/[\w.-]+ [\w./-]+\.py \(.+\)")


def register_scheme(scheme: Scheme) -> Scheme:
    """Add ``scheme`` to :data:`SCHEMES` (a name may be registered once; it must name its ``paper`` and its
    ``reference`` implementation as ``"owner/repo path/to/file.py (function)"``)."""
    if not isinstance(scheme, Scheme):
        raise TypeError(f"scheme must be a Scheme, got {type(scheme).__name__}")
    if not isinstance(scheme.paper, str) or not scheme.paper.strip():
        raise ValueError(f"scheme {scheme.name!r}: paper must name the paper (a non-empty str), got {scheme.paper!r}")
    if not isinstance(scheme.reference, str) or not _REFERENCE.fullmatch(scheme.reference):
        raise ValueError(
            f"scheme {scheme.name!r}: reference must name the reference implementation as "
            f"'owner/repo path/to/file.py (function)', got {scheme.reference!r}"
        )
    if scheme.name in SCHEMES and SCHEMES[scheme.name] is not scheme:
        raise ValueError(f"scheme {scheme.name!r} is already registered")
    taken = {m: s.name for s in SCHEMES.values() if s is not scheme for m in s.model_types}
    clash = [m for m in scheme.model_types if m in taken]
    if clash:
        raise ValueError(f"scheme {scheme.name!r}: model_types {clash} already belong to scheme {taken[clash[0]]!r}")
    SCHEMES[scheme.name] = scheme
    return scheme


def model_types() -> dict[str, str]:
    """``config.model_type -> scheme name`` for every registered scheme (read from ``Scheme.model_types``)."""
    return {m: s.name for s in SCHEMES.values() for m in s.model_types}


def scheme_for_model_type(model_type: str) -> Scheme:
    """The scheme whose ``model_types`` holds ``model_type``; ``ValueError`` naming the known ones otherwise."""
    if isinstance(model_type, str):
        for sch in SCHEMES.values():  # (model types are unique across schemes: register_scheme checks)
            if model_type in sch.model_types:
                return sch
    raise ValueError(f"config.model_type must be one of {tuple(model_types())}, got {model_type!r}")


def get_scheme(name: str) -> Scheme:
    """The registered scheme ``name``; ``ValueError`` naming the known schemes otherwise."""
    if not isinstance(name, str) or name not in SCHEMES:
        raise ValueError(f"scheme must be one of {tuple(SCHEMES)}, got {name!r}")
    return SCHEMES[name]


def resolve_options(
    scheme: str | Scheme,
    *,
    delta: float | None = None,
    temporal_scale: float | None = None,
    training: bool = False,
    tokens_per_second: float = 2,
    rule: str | Rule = "original",
    visual_stride: float | None = None,
    **scheme_options: object,
) -> SchemeOptions:
    """Check a scheme's options and fill in its defaults (one validator for every path).

    ``scheme_options``: the scheme's own options (names in its ``Scheme.options`` besides
    ``delta`` / ``temporal_scale`` / ``visual_stride``, e.g. CircleRoPE's ``radius``); they
    reach the block rule as ``SchemeOptions.extra``."""
    sch = scheme if isinstance(scheme, Scheme) else get_scheme(scheme)
    check_bool(training, "training")
    if not is_real(tokens_per_second) or not (math.isfinite(tokens_per_second) and tokens_per_second > 0):
        raise ValueError(f"tokens_per_second must be a finite number > 0, got {tokens_per_second!r}")
    given = {"delta": delta, "temporal_scale": temporal_scale, "visual_stride": visual_stride}
    for name, value in scheme_options.items():
        if name not in sch.options and not any(name in s.options for s in SCHEMES.values()):
            known = sorted({n for s in SCHEMES.values() for n in s.options} - set(_SHARED_OPTIONS))
            raise TypeError(f"unknown scheme option {name!r} (the schemes' own options: {known})")
    given.update({n: scheme_options.get(n) for n in sch.options if n not in _SHARED_OPTIONS})
    given.update({n: v for n, v in scheme_options.items() if n not in given})  # refused below
    for name, value in given.items():
        if value is not None and name not in sch.options:
            takes = [s.name for s in SCHEMES.values() if name in s.options]
            raise ValueError(f"{name} applies only to schemes {takes}, got {name}={value!r} for scheme={sch.name!r}")
    for name in sch.draws:
        if training and given[name] is not None:
            raise ValueError(f"{name} must be None when training=True ({sch.name} draws it per block)")
    if sch.check is not None:
        given = sch.check(sch.name, dict(given, training=training))
    return SchemeOptions(
        given["delta"],
        given["temporal_scale"],
        training,
        float(tokens_per_second),
        get_rule(rule),
        given["visual_stride"],
        MappingProxyType({n: v for n, v in given.items() if n not in (*_SHARED_OPTIONS, "training")}),
    )


# --------------------------------------------------------------------------- option checks
def _check_v2pe(name: str, o: dict) -> dict:
    d, stride = o["delta"], o["visual_stride"]
    if stride is not None:  # the block-span form: a span per block, divided by the block's tokens
        if o["training"] or d is not None:
            raise ValueError(
                f"visual_stride (scheme='{name}', block-span form) excludes delta and training=True, "
                f"got delta={d!r}, training={o['training']!r}"
            )
        if not (is_real(stride) and math.isfinite(stride) and stride > 0):
            raise ValueError(f"visual_stride must be a finite number > 0 for scheme='{name}', got {stride!r}")
        return dict(o, visual_stride=float(stride))
    if not o["training"] and not (is_real(d) and math.isfinite(d) and 0 < d <= 1):
        raise ValueError(
            f"delta must be a number in (0, 1] for scheme='{name}' at evaluation (or give visual_stride), got {d!r}"
        )
    return o


def _check_hope(name: str, o: dict) -> dict:
    s = o["temporal_scale"]
    if not o["training"] and not (is_real(s) and math.isfinite(s) and s > 0):
        raise ValueError(
            f"temporal_scale must be a finite positive number for scheme='{name}' at evaluation "
            f"(the reference makes the user choose it), got {s!r}"
        )
    return o


def _check_spacing(name: str, o: dict) -> dict:
    s = 2.0 if o["temporal_scale"] is None else o["temporal_scale"]  # VideoRoPE's default temporal spacing
    if not (is_real(s) and math.isfinite(s) and s > 0):
        raise ValueError(f"temporal_scale (the {name} temporal spacing) must be a finite number > 0, got {s!r}")
    return dict(o, temporal_scale=float(s))


def _check_stride(name: str, o: dict) -> dict:
    s = 1 if o["temporal_scale"] is None else o["temporal_scale"]
    return dict(o, temporal_scale=check_int(s, f"temporal_scale (the {name} temporal stride)"))


#: CircleRoPE's ``method``: ``"circle"`` maps a block's grid onto a ring, ``"no_circle"`` keeps the grid
#: (centred, projected onto the plane orthogonal to the text axis)
CIRCLE_METHODS = ("circle", "no_circle")


def _unit_number(value: object, low_open: bool = False) -> bool:
    return is_real(value) and math.isfinite(value) and (value > 0 if low_open else value >= 0) and value <= 1


def _check_circle(name: str, o: dict) -> dict:
    """CircleRoPE's options, defaults those of lose4578/CircleRoPE ``code/config.json``
    (``radius=10``, ``alpha=0.5``, ``move_to_origin=True``; ``move_to_positive`` and ``dff_rate`` off)."""
    out = dict(o)
    s = 1.0 if o["temporal_scale"] is None else o["temporal_scale"]
    if not (is_real(s) and math.isfinite(s) and s > 0):
        raise ValueError(
            f"temporal_scale (the {name} spacing of a video's rings) must be a finite number > 0, got {s!r}"
        )
    out["temporal_scale"] = float(s)
    r = 10.0 if o["radius"] is None else o["radius"]
    if isinstance(r, str) and (r == "auto" or r.startswith("auto-")):
        try:
            scale = 1.0 if r == "auto" else float(r[5:])
        except ValueError:
            scale = math.nan
        if not (math.isfinite(scale) and scale > 0):
            raise ValueError(f"radius='auto-K' (scheme='{name}') needs a finite K > 0, got {r!r}")
        out["radius"], out["radius_scale"] = None, scale
    elif is_real(r) and math.isfinite(r) and r > 0:
        out["radius"], out["radius_scale"] = float(r), None
    else:
        raise ValueError(f"radius must be a finite number > 0, 'auto' or 'auto-K' for scheme='{name}', got {r!r}")
    a = 0.5 if o["alpha"] is None else o["alpha"]
    if not _unit_number(a):
        raise ValueError(f"alpha must be a number in [0, 1] for scheme='{name}', got {a!r}")
    out["alpha"] = float(a)
    d = 0.0 if o["dff_rate"] is None or o["dff_rate"] is False else o["dff_rate"]
    if not _unit_number(d):
        raise ValueError(f"dff_rate must be a number in [0, 1] (or False) for scheme='{name}', got {d!r}")
    out["dff_rate"] = float(d)
    origin = True if o["move_to_origin"] is None else o["move_to_origin"]
    check_bool(origin, f"move_to_origin (scheme='{name}')")
    out["move_to_origin"] = origin
    positive = False if o["move_to_positive"] is None else o["move_to_positive"]
    if positive is False or positive == "auto":
        pass
    elif is_real(positive) and math.isfinite(positive):
        positive = float(positive) if positive else False  # the reference: 0 (falsy) is off
    else:
        raise ValueError(
            f"move_to_positive must be False, 'auto' or a finite number (the offset) for scheme='{name}', "
            f"got {positive!r}"
        )
    out["move_to_positive"] = positive
    method = "circle" if o["method"] is None else o["method"]
    if method not in CIRCLE_METHODS:
        raise ValueError(f"method must be one of {CIRCLE_METHODS} for scheme='{name}', got {method!r}")
    out["method"] = method
    return out


# --------------------------------------------------------------------------- block rules
def _qwen_extent(g: BlockGeometry, o: SchemeOptions, t_max: np.ndarray | None) -> np.ndarray:
    """``(K,)`` float64 extents from the int64 grid (NumPy: a few ops on ``K`` values); ``t_max``: each block's
    largest temporal offset (``None``: ``t - 1``, the integer grid's)."""
    h, w = g._grid[:, 1], g._grid[:, 2]
    if o.rule.advance == "max":
        if t_max is None:  # max(t - 1, h - 1, w - 1) + 1 of integers: max(t, h, w)
            return np.maximum(np.maximum(g._grid[:, 0], h), w, dtype=np.float64)
        return np.maximum(np.maximum(t_max, h - 1), w - 1) + 1.0
    return np.maximum(h, w, dtype=np.float64)


def _constant(values: list[float]) -> np.ndarray:
    out = np.array(values, dtype=np.float64)
    out.flags.writeable = False
    return out


_STEP_W = _constant([0.0, 0.0, 1.0])  # t, h, w: a row's tokens step along w (read-only NumPy: no conversion)
_USE_START = {False: _constant([1.0, 1.0, 1.0]), True: _constant([1.0, 0.0, 0.0])}
_STEP_VROPE = _constant([1.0, -1.0, 1.0, -1.0])  # c0 .. c3 along a row: j and W - 1 - j
_ONES4 = _constant([1.0, 1.0, 1.0, 1.0])
_ONE = _constant([1.0])


def _side(g: BlockGeometry) -> np.ndarray:
    """``(K,)`` float64 ``max(h, w)`` of every block (from the int64 grid)."""
    return np.maximum(g._grid[:, 1], g._grid[:, 2]).astype(np.float64)


def _frame_thw_rows(g: BlockGeometry, frame_t: np.ndarray | None) -> np.ndarray:
    """``(3, R)`` int64 row offsets ``(t, i, 0)``, ``t`` from each row's frame: ``frame_t`` ``(F,)`` int64
    (``None``: its index ``f`` in its block), written in place (each row one pass)."""
    frame_h, frame_f, _, n = g._frames
    base = np.empty((3, n), dtype=np.int64)
    base[0] = (frame_f if frame_t is None else frame_t).repeat(frame_h)
    g._row_i(base[1])
    base[2] = 0
    return base


def _thw_rows(t_base: np.ndarray | float, g: BlockGeometry) -> np.ndarray:
    """``(3, R)`` row offsets ``(t_base, i, 0)``: int64 where ``t_base`` is (an int, or an integer array: the packer
    skips its check), else float64."""
    hi = g._frame_row[1]  # (R,) int64 row of every row in its frame
    integer = type(t_base) is int or (isinstance(t_base, np.ndarray) and t_base.dtype.kind in "iu")
    base = np.empty((3, hi.shape[0]), dtype=np.int64 if integer else np.float64)
    base[0], base[1], base[2] = t_base, hi, 0  # cast as written (no float64 copy of the rows)
    return base


def _qwen_rows(g: BlockGeometry, o: SchemeOptions, stride: float = 1, reset: bool = False):
    """Qwen2-VL M-RoPE: ``(start + stride * f, start + i, start + j)``; ``reset`` (MRoPE-I):
    h and w start at 0 in every block."""
    if stride == 1:  # int64 rows, t from each row's frame
        return _frame_thw_rows(g, None), _STEP_W, _qwen_extent(g, o, None), _USE_START[reset]
    t_base, t_max = g.row_t.numpy() * stride, (g._grid[:, 0] - 1) * stride
    return _thw_rows(t_base, g), _STEP_W, _qwen_extent(g, o, t_max), _USE_START[reset]


def _qwen25_rows(g: BlockGeometry, o: SchemeOptions):
    """Qwen2.5-VL: temporal index from seconds (see the ``seconds`` rules)."""
    spg = g._host("seconds")  # (K,) float32 from the packer, 0 for images
    if spg.dtype != np.float32:  # a geometry built elsewhere: torch's arithmetic for its dtype
        return _qwen25_rows_torch(g, o)
    is_image = g._host("is_image")  # (K,) bool
    with np.errstate(all="ignore"):  # huge seconds: inf and NaN, refused by the packer
        tps = np.float32(o.tokens_per_second)  # float32 products, as the reference (and torch's float32 * scalar)
        if o.rule.seconds == "truncate":
            interval = np.trunc(spg) * tps
        else:
            interval = spg * tps
            if o.rule.seconds == "interval":
                interval = np.where(is_image, np.float32(1), interval)
        interval = interval.astype(np.float32, copy=False)  # (K,) float32, as the reference multiplies
        t = g._grid[:, 0]
        _, frame_f, _, _ = g._frames
        # (F,) each frame's temporal index: the product of every row of the frame, computed once per frame
        frame_t = np.floor(frame_f.astype(np.float32) * interval.repeat(t))
        t_max = np.floor((t - 1).astype(np.float64).astype(np.float32) * interval).astype(np.float64)
        exact = not frame_t.size or float(np.abs(frame_t).max()) < 2**53  # finite (NaN fails), exact in int64
    if exact:  # integer rows (the packer skips its integrality check)
        return _frame_thw_rows(g, frame_t.astype(np.int64)), _STEP_W, _qwen_extent(g, o, t_max), _USE_START[False]
    t_base = frame_t.astype(np.float64).repeat(g._frames[0])  # (R,) inf or NaN: float64 rows, as the packer checks
    return _thw_rows(t_base, g), _STEP_W, _qwen_extent(g, o, t_max), _USE_START[False]


def _qwen25_rows_torch(g: BlockGeometry, o: SchemeOptions):
    """:func:`_qwen25_rows` for seconds that are not float32, in torch as the reference."""
    spg = g.seconds
    if o.rule.seconds == "truncate":
        interval = spg.trunc() * o.tokens_per_second
    else:
        interval = spg * o.tokens_per_second
        if o.rule.seconds == "interval":
            interval = torch.where(g.is_image, torch.ones_like(interval), interval)
    interval = interval.float().numpy()  # (K,) float32, as the reference multiplies
    with np.errstate(all="ignore"):  # huge seconds: inf and NaN, refused by the packer
        t_base = np.floor(g._frame_row[0].astype(np.float32) * interval[g.row_block.numpy()]).astype(np.float64)
    t_max = ((g.t - 1).float() * torch.from_numpy(interval)).floor().double().numpy()
    return _thw_rows(t_base, g), _STEP_W, _qwen_extent(g, o, t_max), _USE_START[False]


def _mrope_i_rows(g: BlockGeometry, o: SchemeOptions):
    return _qwen_rows(g, o, stride=float(o.temporal_scale), reset=True)


def _hope_block(g: BlockGeometry, o: SchemeOptions):
    """HoPE: ``t = start + s f``; ``h = start + i - floor((H-1)/2) + s f`` (w alike)."""
    t_off = g.ti * g.scale[g.block]
    h_off = g.hi - torch.floor((g.h[g.block] - 1) / 2) + t_off
    w_off = g.wi - torch.floor((g.w[g.block] - 1) / 2) + t_off
    extent = (g.t - 1) * g.scale + 1  # the text continues at the last t + 1
    return torch.stack([t_off, h_off, w_off]), extent, torch.ones(3, dtype=torch.float64, device=t_off.device)


def _videorope_block(g: BlockGeometry, o: SchemeOptions):
    """VideoRoPE's diagonal layout: ``t = start + s f``; ``h = i - floor((H-1)/2) + t`` (w alike),
    the text after the block at the last ``t`` + 1 -- HoPE's layout with one fixed spacing ``s``."""
    return _hope_block(g, o)


def _reset_rows(g: BlockGeometry, o: SchemeOptions):
    """Spatial reset, stride 1 (ILRoPE / OmniRoPE: ``(start + f, i, j)``; with ``frames=True`` every
    block is one frame, so the text after it continues at ``start + max(1, h, w)``)."""
    return _qwen_rows(g, o, reset=True)


def _vrope_rows(g: BlockGeometry, o: SchemeOptions):
    """VRoPE: the four symmetric combinations of ``(i, j)``, frame ``f`` at ``f (H + W - 1)``."""
    rb = g.row_block.numpy()
    t, h, w = g._grid.T  # (K,) int64
    hk, wk = h.take(rb), w.take(rb)  # (R,)
    frame_i, i = g._frame_row  # (R,) int64
    frame = frame_i * (hk + wk - 1)
    i_flip = hk - 1 - i
    base = np.empty((4, rb.shape[0]), dtype=np.int64)  # (4, R): j = 0, in int64 (the packer skips its check)
    np.add(i, frame, out=base[0])
    np.add(base[0], wk - 1, out=base[1])
    np.add(i_flip, frame, out=base[2])
    np.add(base[2], wk - 1, out=base[3])
    return base, _STEP_VROPE, (t * (h + w - 1)).astype(np.float64), _ONES4


def _v2pe_block(g: BlockGeometry, o: SchemeOptions):
    """V2PE: token ``n`` of a block at ``start - 1 + (n + 1) delta``; the text resumes at
    ``ceil(last visual) + 1``. Block-span form (``visual_stride``): ``delta = visual_stride / tokens``
    per block (the reference's ``rope_pos_id_stride / num_image_token``), for grids of any size."""
    tokens = g.tokens.to(torch.float64)
    delta = g.delta if o.visual_stride is None else o.visual_stride / tokens  # (K,)
    offset = ((g.local + 1) * delta[g.block] - 1).unsqueeze(0)
    extent = torch.ceil(tokens * delta)
    return offset, extent, torch.ones(1, dtype=torch.float64, device=offset.device)


def _per_block(values: Tensor, block: Tensor, k: int, reduce: str) -> Tensor:
    """``(K,)`` the ``"amin"`` / ``"amax"`` of per-token ``values`` ``(Nv,)`` over each block (one scatter)."""
    return values.new_zeros(k).scatter_reduce_(0, block, values, reduce, include_self=False)


def _circle_block(g: BlockGeometry, o: SchemeOptions):
    """CircleRoPE: the tokens of a block on a ring of radius ``r`` in the plane orthogonal to the
    text direction ``(1, 1, 1)`` (every token of the block equally far from every text token);
    frame ``f`` of a video is the same ring moved by ``f * temporal_scale`` along ``(1, 1, 1)``
    (JJJYmmm/Multimodal-RoPEs' extension of the image-only reference); the text after the block at
    its largest position + 1.

    Token ``(i, j)`` of an ``H x W`` frame: ``x = j - (W-1)/2``, ``y = i - (H-1)/2``
    (``move_to_origin``); angle ``a = alpha * a_norm + (1 - alpha) * 2 pi (i W + j) / (H W)`` with
    ``a_norm`` = ``atan2(y, x)`` rescaled by the block's min and max to ``[0, 2 pi]``;
    ``(cx, cy) = r (cos a, sin a)`` (``dff_rate`` ``d``: ``(1-d) (cx, cy) + d (x, y)``), placed at
    ``cx u + cy v`` with ``u = (-1, 1, 0)/sqrt 2``, ``v = (-1, -1, 2)/sqrt 6`` on the (w, h, t)
    axes. The per-block min / max are one scatter each (no loop over blocks)."""
    e, k = o.extra, len(g.tokens)
    blk = g.block
    hk, wk = g.h[blk], g.w[blk]  # (Nv,)
    x, y = g.wi, g.hi  # (Nv,) float64
    if e["move_to_origin"]:
        x, y = x - (wk - 1) / 2, y - (hk - 1) / 2
    if e["method"] == "circle":
        if e["radius"] is None:  # "auto-K": K * the block's largest coordinate (w, h or t * stride)
            t_top = (g.t - 1) * o.temporal_scale
            top = torch.maximum(torch.maximum(g.w - 1, g.h - 1), t_top)
            radius = (top / 2 if e["move_to_origin"] else top).abs()[blk] * e["radius_scale"]
        else:
            radius = e["radius"]
        theta = torch.atan2(y, x)  # (Nv,)
        low, high = _per_block(theta, blk, k, "amin"), _per_block(theta, blk, k, "amax")
        spread = (high - low)[blk]
        theta_norm = torch.where(spread > 0, (theta - low[blk]) / spread.clamp_min(1e-300) * (2 * math.pi), theta)
        theta_index = (g.hi * wk + g.wi) / (hk * wk) * (2 * math.pi)
        angle = e["alpha"] * theta_norm + (1 - e["alpha"]) * theta_index
        cx, cy = radius * torch.cos(angle), radius * torch.sin(angle)
    else:
        cx, cy = x, y
    if e["dff_rate"]:
        d = e["dff_rate"]
        cx, cy = (1 - d) * cx + d * x, (1 - d) * cy + d * y
    s2, s6 = math.sqrt(2.0), math.sqrt(6.0)
    ring = torch.stack([2 * cy / s6, cx / s2 - cy / s6, -cx / s2 - cy / s6])  # (3, Nv) rows t, h, w
    if e["move_to_positive"] is not False:  # every axis up by the block's |lowest value| (+ the offset)
        shift = _per_block(ring.amin(0), blk, k, "amin").abs()
        ring = ring + (shift[blk] + (0.0 if e["move_to_positive"] == "auto" else e["move_to_positive"]))
    offset = ring + g.ti * o.temporal_scale  # stacked rings: frame f moved along (1, 1, 1)
    extent = _per_block(offset.amax(0), blk, k, "amax") + 1
    return offset, extent, torch.ones(3, dtype=torch.float64, device=offset.device)


def _flat_rows(g: BlockGeometry, o: SchemeOptions):
    _, row_local, row_w, _ = g._rows
    return (row_local * row_w)[None], _ONE, g._grid.prod(-1).astype(np.float64), _ONE  # (1, R) int64 row starts


def _hy_v4_vl_rows(g: BlockGeometry, o: SchemeOptions):
    """HY-V4-VL (XD-RoPE): a frame of ``H`` rows of ``W`` tokens (``w`` counts the newline token that
    ends every merged row) spans ``S = max(H, W)`` positions; token ``(f, i, j)`` at
    ``(start + f S, start + i + f S, start + j + f S)``, the text after the block at ``start + T S``."""
    t = g._grid[:, 0]
    side = np.maximum(g._grid[:, 1], g._grid[:, 2])  # (K,) int64 S
    frame_h, frame_f, _, n = g._frames
    frame = frame_f * side.repeat(t)  # (F,) f S of each frame
    base = np.empty((3, n), dtype=np.int64)  # int64: the packer skips its check
    base[0] = frame.repeat(frame_h)
    base[2] = base[0]
    g._row_i(base[1], frame)  # i + f S
    return base, _STEP_W, (t * side).astype(np.float64), _USE_START[False]


def _glm_image_rows(g: BlockGeometry, o: SchemeOptions):
    """GLM-Image: ``(start + f, start + i, start + j)``, the text after the block at
    ``start + max(h, w)`` (its one rule: the temporal extent is ignored)."""
    return _thw_rows(g._frame_row[0], g), _STEP_W, _side(g), _USE_START[False]


def _minicpm_canvas_rows(g: BlockGeometry, o: SchemeOptions):
    """MiniCPM-V 4.7, a canvas of one thumbnail (no slices): ``(start, start + i, start + j)``, the
    text after it at ``start + max(h, w) + 1``. Slices and marker tokens: the token-id path
    (:func:`mmpos.integrations.hf_families.minicpmv4_7_rope_index`)."""
    return _thw_rows(0, g), _STEP_W, _side(g) + 1, _USE_START[False]


_STEP_HUNYUAN = _constant([1.0, 0.0, 0.0])  # w, h, image: a row steps along w
_NO_START = _constant([0.0, 0.0, 0.0])


def _hunyuan_vl_rows(g: BlockGeometry, o: SchemeOptions):
    """HunYuan-VL: token ``(i, j)`` of the ``k``-th image of the batch (reading order) at
    ``(w, h, image) = (j, i, k)``, absolute (no block start); the text runs on over the block
    (extent: its token count), so text tokens sit at their index among the real tokens."""
    base = np.empty((3, g._frames[3]), dtype=np.int64)  # (3, R) int64: the packer skips its check
    base[0] = 0
    g._row_i(base[1])
    base[2] = g.row_block.numpy()  # (R,) each row's block
    return base, _STEP_HUNYUAN, g._grid.prod(-1).astype(np.float64), _NO_START


# --------------------------------------------------------------------------- the registry
THW = ("t", "h", "w")
_IDENTITY = ((1, 0, 0), (0, 1, 0), (0, 0, 1))
_REPEAT = ((1,), (1,), (1,))  # one axis written on all three rows
_READ_ROW0 = ((1, 0, 0),)

for _scheme in (
    Scheme(
        "qwen2-vl",
        THW,
        "mrope",
        None,
        _IDENTITY,
        _IDENTITY,
        rows=_qwen_rows,
        paper="Wang et al. 2024, Qwen2-VL (arXiv:2409.12191)",
        reference="huggingface/transformers src/transformers/models/qwen2_vl/modeling_qwen2_vl.py (Qwen2VLModel.get_rope_index)",
        # transformers' get_rope_index of these families is Qwen2-VL's (ERNIE-4.5-VL divides a video's t by
        # vision_config.temporal_merge_size first: a property of its prompt, read from the config)
        model_types=("qwen2_vl", "paddleocr_vl", "ernie4_5_vl_moe"),
        rotary_model_types=("qwen2_vl",),
    ),
    Scheme(
        "qwen2.5-vl",
        THW,
        "mrope",
        None,
        _IDENTITY,
        _IDENTITY,
        rows=_qwen25_rows,
        paper="Bai et al. 2025, Qwen2.5-VL (arXiv:2502.13923)",
        reference="huggingface/transformers src/transformers/models/qwen2_5_vl/modeling_qwen2_5_vl.py (Qwen2_5_VLModel.get_rope_index)",
        model_types=("qwen2_5_vl",),
        rotary_model_types=("qwen2_5_vl",),
    ),
    Scheme(
        "qwen3-vl",
        THW,
        "mrope-i",
        None,
        _IDENTITY,
        _IDENTITY,
        rows=_qwen_rows,
        frames=True,
        paper="Qwen3-VL (interleaved M-RoPE, timestamped frames)",
        reference="huggingface/transformers src/transformers/models/qwen3_vl/modeling_qwen3_vl.py (Qwen3VLModel.get_rope_index)",
        # one get_rope_index in transformers 5.24 for all of these (frames split, text after a block at
        # start + max(h, w)); their rotary embeddings differ (rotary_model_types: the ones mmpos reproduces)
        model_types=(
            "qwen3_vl",
            "qwen3_vl_moe",
            "qwen3_5",
            "qwen3_5_moe",
            "qwen4_exp",
            "glm4v",
            "glm4v_moe",
            "glm46v",
            "glm_ocr",
            "cohere_compass",
            "cosmos3_edge",
            "cosmos3_omni",
        ),
        rotary_model_types=("qwen3_vl", "qwen3_vl_moe"),
    ),
    Scheme(
        "mrope-i",
        THW,
        "mrope-i",
        None,
        _IDENTITY,
        _IDENTITY,
        rows=_mrope_i_rows,
        options=("temporal_scale",),
        check=_check_stride,
        paper="Huang et al. 2025, MRoPE-Interleave (arXiv:2510.23095)",
        reference="JJJYmmm/Multimodal-RoPEs multimodal_ropes/pos_design/mrope_i.py (get_mrope_interleave_index, spatial_reset=True)",
    ),
    # MHRoPE with the positions of its paper's code (JJJYmmm/Multimodal-RoPEs README and test.py run
    # get_mrope_interleave_index with spatial_reset=True for it): spatial reset, integer temporal stride
    Scheme(
        "mhrope",
        THW,
        "mhrope",
        None,
        _IDENTITY,
        _IDENTITY,
        rows=_mrope_i_rows,
        options=("temporal_scale",),
        check=_check_stride,
        paper="Huang et al. 2025, Multi-Head RoPE (arXiv:2510.23095)",
        reference="JJJYmmm/Multimodal-RoPEs multimodal_ropes/pos_design/mrope_i.py (get_mrope_interleave_index, spatial_reset=True)",
    ),
    # ... and with Qwen2-VL's positions (spatial_reset=False, that code's default)
    Scheme(
        "mhrope-qwen2-vl",
        THW,
        "mhrope",
        None,
        _IDENTITY,
        _IDENTITY,
        rows=_qwen_rows,
        paper="Huang et al. 2025, Multi-Head RoPE (arXiv:2510.23095), on Qwen2-VL positions",
        reference="JJJYmmm/Multimodal-RoPEs multimodal_ropes/pos_design/mrope_i.py (get_mrope_interleave_index, spatial_reset=False)",
    ),
    Scheme(
        "hope",
        THW,
        "hope",
        _hope_block,
        _IDENTITY,
        _IDENTITY,
        options=("temporal_scale",),
        check=_check_hope,
        draws={"temporal_scale": HOPE_SCALES},
        id_dtype=torch.float32,
        delta_dtype=torch.float32,
        paper="Li et al. 2025, HoPE (arXiv:2505.20444)",
        reference="hrlics/HoPE modeling_hope.py (get_dynamic_rope_index)",
    ),
    # VideoRoPE (JJJYmmm/Multimodal-RoPEs pos_design/videorope.py: diagonal layout, spacing temporal_stride = 2)
    Scheme(
        "videorope",
        THW,
        "videorope",
        _videorope_block,
        _IDENTITY,
        _IDENTITY,
        options=("temporal_scale",),
        check=_check_spacing,
        id_dtype=torch.float32,
        delta_dtype=torch.float32,
        paper="Wei et al. 2025, VideoRoPE (arXiv:2502.05173)",
        reference="JJJYmmm/Multimodal-RoPEs multimodal_ropes/pos_design/videorope.py (get_videorope_index)",
    ),
    # ILRoPE and OmniRoPE (JJJYmmm/Multimodal-RoPEs pos_design/omnirope.py, ilrope.py = the same index):
    # a video is one block per frame, h and w restart at 0 in every block, the text after a block at
    # start + max(1, h, w); ILRoPE rotates with the interleaved (cyclic) allocation, OmniRoPE with the chunked one
    Scheme(
        "ilrope",
        THW,
        "mrope-i",
        None,
        _IDENTITY,
        _IDENTITY,
        rows=_reset_rows,
        frames=True,
        paper="Liao et al. 2025, ILRoPE (Mogao, arXiv:2505.05472)",
        reference="JJJYmmm/Multimodal-RoPEs multimodal_ropes/pos_design/ilrope.py (get_ilrope_index)",
    ),
    Scheme(
        "omnirope",
        THW,
        "mrope",
        None,
        _IDENTITY,
        _IDENTITY,
        rows=_reset_rows,
        frames=True,
        paper="Wu et al. 2025, OmniGen2 Omni-RoPE (arXiv:2506.18871)",
        reference="JJJYmmm/Multimodal-RoPEs multimodal_ropes/pos_design/omnirope.py (get_omnirope_index)",
    ),
    # MM-RoPE (JJJYmmm/Multimodal-RoPEs pos_design/mmrope.py at position_scale (1, 1, 1)): Qwen2-VL's
    # positions with a video as one block per frame; its distributed T,T,H,W,H,W,H,W allocation is the encoder
    Scheme(
        "mmrope",
        THW,
        "mmrope",
        None,
        _IDENTITY,
        _IDENTITY,
        rows=_qwen_rows,
        frames=True,
        paper="Yuan et al. 2025, Lumos-1 MM-RoPE (arXiv:2507.08801)",
        reference="JJJYmmm/Multimodal-RoPEs multimodal_ropes/pos_design/mmrope.py (get_mmrope_index)",
    ),
    # CircleRoPE (lose4578/CircleRoPE code/circle_rope.py, defaults of its code/config.json; videos as
    # JJJYmmm/Multimodal-RoPEs pos_design/circlerope.py: one ring per frame, moved along the text axis);
    # rotated with the chunked M-RoPE of the reference's Qwen2.5-VL (mrope_section 16, 24, 24)
    Scheme(
        "circlerope",
        THW,
        "mrope",
        _circle_block,
        _IDENTITY,
        _IDENTITY,
        options=("temporal_scale", "radius", "alpha", "move_to_origin", "move_to_positive", "dff_rate", "method"),
        check=_check_circle,
        id_dtype=torch.float32,
        delta_dtype=torch.float32,
        paper="Wang et al. 2025, Circle-RoPE (arXiv:2505.16416)",
        reference="lose4578/CircleRoPE code/circle_rope.py (get_circle_rope_index)",
    ),
    # GRAPE's canonical (drop-in cos / sin) mode on the positions the reference pairs it with: JJJYmmm's
    # get_mrope_index (Qwen2-VL's positions, a video as one block per frame, text after a block at its max + 1)
    Scheme(
        "grape",
        THW,
        "grape",
        None,
        _IDENTITY,
        _IDENTITY,
        rows=_qwen_rows,
        frames=True,
        paper="Zhang et al. 2025, GRAPE (arXiv:2512.07805), canonical planes, chunked",
        reference="JJJYmmm/Multimodal-RoPEs multimodal_ropes/pos_design/mrope.py (get_mrope_index)",
    ),
    Scheme(
        "grape-i",
        THW,
        "grape-i",
        None,
        _IDENTITY,
        _IDENTITY,
        rows=_qwen_rows,
        frames=True,
        paper="Zhang et al. 2025, GRAPE (arXiv:2512.07805), canonical planes, cyclic",
        reference="JJJYmmm/Multimodal-RoPEs multimodal_ropes/pos_design/mrope.py (get_mrope_index)",
    ),
    # VRoPE's four combinations travel as (c0, c1, c2): c3 = c1 + c2 - c0 for every position
    Scheme(
        "vrope",
        ("c0", "c1", "c2", "c3"),
        "vrope",
        None,
        ((1, 0, 0, 0), (0, 1, 0, 0), (0, 0, 1, 0)),
        ((1, 0, 0), (0, 1, 0), (0, 0, 1), (-1, 1, 1)),
        rows=_vrope_rows,
        paper="Liu et al. 2025, VRoPE (arXiv:2502.11664)",
        reference="johncaged/VRoPE vrope.py (VRoPE.generate_nd_positions)",
    ),
    Scheme(
        "v2pe",
        ("seq",),
        "v2pe",
        _v2pe_block,
        _REPEAT,
        _READ_ROW0,
        options=("delta", "visual_stride"),
        check=_check_v2pe,
        draws={"delta": V2PE_DELTAS},
        id_dtype=torch.float64,
        coord_dtype=torch.float64,
        paper="Ge et al. 2024, V2PE (arXiv:2412.09616)",
        reference="OpenGVLab/V2PE internvl/model/internvl_chat/modeling_internvl_chat.py (get_rope_pos_id)",
    ),
    # HY-V4-VL's XD-RoPE positions; its rotary reads them interleaved (T, H, W cyclic), as Qwen3-VL's
    Scheme(
        "hy-v4-vl",
        THW,
        "mrope-i",
        None,
        _IDENTITY,
        _IDENTITY,
        rows=_hy_v4_vl_rows,
        paper="Tencent HY-V4-VL (XD-RoPE: one block of max(H, W + 1) positions per frame)",
        reference="huggingface/transformers src/transformers/models/hy_v4_vl/modeling_hy_v4_vl.py (HYV4VLModel.get_rope_index)",
        model_types=("hy_v4_vl",),
    ),
    # GLM-Image's prompt positions (the source images of image-to-image generation); rotary: chunked sections
    Scheme(
        "glm-image",
        THW,
        "mrope",
        None,
        _IDENTITY,
        _IDENTITY,
        rows=_glm_image_rows,
        paper="Z.ai GLM-Image (autoregressive image generation with M-RoPE grids)",
        reference="huggingface/transformers src/transformers/models/glm_image/modeling_glm_image.py (GlmImageModel.get_rope_index)",
        model_types=("glm_image",),
    ),
    # MiniCPM-V 4.7's canvas (thumbnails over the slices' canvas, markers at its corners: the token-id path);
    # its text backbone is Qwen3.5's (interleaved sections, partial rotary)
    Scheme(
        "minicpm-v",
        THW,
        "mrope-i",
        None,
        _IDENTITY,
        _IDENTITY,
        rows=_minicpm_canvas_rows,
        paper="OpenBMB MiniCPM-V 4.7 (canvas M-RoPE over the thumbnail and its slices)",
        reference="huggingface/transformers src/transformers/models/minicpmv4_7/modeling_minicpmv4_7.py (MiniCPMV4_7Model.get_rope_index)",
        model_types=("minicpmv4_7",),
    ),
    # HunYuan-VL: the last three of its N M-RoPE axes (the leading N - 3 hold the 1-D text position,
    # added by mmpos.integrations.hf_families); rotary: chunked sections over the N axes
    Scheme(
        "hunyuan-vl",
        ("w", "h", "image"),
        "mrope",
        None,
        _IDENTITY,
        _IDENTITY,
        rows=_hunyuan_vl_rows,
        paper="Tencent HunYuan-VL / HunyuanOCR (XD-RoPE: width, height and image-index axes)",
        reference="huggingface/transformers src/transformers/models/hunyuan_vl/modeling_hunyuan_vl.py (HunYuanVLModel.get_rope_index)",
        model_types=("hunyuan_vl",),
        encoder_kwargs={"axes": ("w", "h", "image")},
    ),
    Scheme(
        "flat",
        ("seq",),
        "rope",
        None,
        _REPEAT,
        _READ_ROW0,
        rows=_flat_rows,
        paper="1-D RoPE over the whole sequence (Su et al. 2021, RoFormer, arXiv:2104.09864)",
        reference="JJJYmmm/Multimodal-RoPEs multimodal_ropes/pos_design/vanilla.py (get_vanilla_rope_index)",
    ),
):
    register_scheme(_scheme)


# --------------------------------------------------------------------------- TMRoPE (Qwen-Omni)
# The Omni models' padding and rope_deltas conventions (one per family, the same in transformers 4.57.1 and
# 5.24.0): padding 1 (Qwen2.5-Omni) / 0 (Qwen3-Omni), rope_deltas = largest position + 1 - real length. Their
# blocks place themselves (advance and seconds are not read).
for _rule in (Rule("qwen2.5-omni", "max", "exact", 1, "max-real"), Rule("qwen3-omni", "max", "exact", 0, "max-real")):
    RULES[_rule.name] = _rule


def _check_omni(name: str, o: dict) -> dict:
    s = 2 if o["seconds_per_chunk"] is None else o["seconds_per_chunk"]  # Qwen2.5-Omni's config default
    if not (is_real(s) and math.isfinite(s) and s > 0):
        raise ValueError(f"seconds_per_chunk must be a finite number > 0 for scheme='{name}', got {s!r}")
    return dict(o, seconds_per_chunk=s)


def _segment_cummin(values: np.ndarray, segment: np.ndarray) -> np.ndarray:
    """Cumulative minimum of ``values`` ``(N,)`` int64, restarted at every segment (``segment`` ``(N,)``
    non-decreasing ids): each later segment is moved below every earlier one, one pass."""
    if not values.size:
        return values
    span = int(values.max() - values.min()) + 1
    return np.minimum.accumulate(values - span * segment) + span * segment


def _f32_sum(start: Tensor | None, block: np.ndarray | None, offset: np.ndarray) -> np.ndarray:
    """float64 values of the float32 sums ``start + offset`` (per token of ``block``, or per block); the
    offsets alone without ``start`` (the packer's first call)."""
    offset = np.asarray(offset, dtype=np.float64)
    if start is None:
        return offset
    s = start.numpy().astype(np.float32)
    return (s if block is None else s[block]) + offset.astype(np.float32)  # float32 + float32: one rounding


def _f32_extent(start: Tensor | None, top: np.ndarray) -> np.ndarray:
    """``(K,)`` the extent that puts the token after a block at ``float32(float32(start + top) + 1)``, the
    reference's ``max + 1`` (``top + 1`` without ``start``)."""
    if start is None:
        return (np.asarray(top, dtype=np.float64) + 1).astype(np.float64)
    after = (_f32_sum(start, None, top) + np.float32(1)).astype(np.float32)
    return after.astype(np.float64) - start.numpy()


def _omni_block(g: BlockGeometry, o: SchemeOptions, *, chunks: bool):
    """TMRoPE (Qwen2.5-Omni, arXiv:2503.20215; Qwen3-Omni): a vision token ``(f, i, j)`` at
    ``(start + T_f, start + i, start + j)`` with ``T_f = f * seconds * position_id_per_seconds`` (in
    float32 as the reference; ``tokens_per_second`` here; images: 1 second per frame), floored for
    Qwen2.5-Omni (``chunks``); the text after the block at its largest position + 1. An audio token
    ``k`` of an audio-visual block (``g.audio``) sits at ``start + k`` on every axis (40 ms per
    position at 25 per second), and the block's video and audio tokens are interleaved by time:

    * Qwen3-Omni: merged by position (a video token before an audio token of the same position);
    * Qwen2.5-Omni (``chunks``): in chunks of ``seconds_per_chunk`` seconds (video chunk 0, audio
      chunk 0, video chunk 1, ...), the chunks cut as the reference's ``get_chunked_index`` cuts them
      (a cut at every token whose position reaches the next multiple of the chunk, one chunk per cut);
      the block spans its audio start and end tokens too, which share the positions of the video's
      start and end tokens (``g.audio`` counts them: audio tokens + 2).

    The text after an audio-visual block continues at the largest position of the chunk (Qwen2.5) or
    run (Qwen3) that comes last, + 1 -- as the reference, which reads the last one it appended.
    """
    grid = g._grid  # (K, 3) video grid in tokens
    k = grid.shape[0]
    frame_block, t_frame, t_last, v_max = _omni_frames(g, o, chunks)
    hw = grid[:, 1] * grid[:, 2]
    t_off = np.repeat(t_frame, hw[frame_block])  # (Nvid,) per video token
    video = np.stack([t_off, g.hi.numpy(), g.wi.numpy()])  # (3, Nvid)
    markers = int(chunks)  # Qwen2.5-Omni: the audio start / end tokens belong to the block
    audio, n_audio = _omni_audio(g, markers)
    if not (audio > 0).any():
        ones = torch.ones(3, dtype=torch.float64)
        return torch.from_numpy(video), torch.from_numpy(_f32_extent(g.start, v_max)), ones
    if (n_audio[audio > 0] < 1).any():
        raise ValueError(
            f"an audio-visual block needs >= 1 audio token (+ {2 * markers} markers), got {audio.tolist()}"
        )
    a_block = np.repeat(np.arange(k), n_audio)  # (Na,)
    a_local = np.arange(a_block.shape[0]) - np.repeat(np.cumsum(n_audio) - n_audio, n_audio)
    v_block, v_local = g.block.numpy(), g.local.numpy().astype(np.int64)
    if chunks:  # chunk index: the cuts of get_chunked_index, s_i = i + cummin_{j<=i}(r_j - j), r = position // chunk
        per_chunk = int(o.tokens_per_second * o.extra["seconds_per_chunk"])
        if per_chunk < 1:
            raise ValueError(
                f"tokens_per_second * seconds_per_chunk must be >= 1 (one position per chunk), got {per_chunk}"
            )
        v_key = v_local + _segment_cummin(t_off.astype(np.int64) // per_chunk - v_local, v_block)
        a_key = a_local // per_chunk  # audio positions rise by 1: never more than one cut per token
        video_chunks = np.zeros(k, dtype=np.int64)
        np.maximum.at(video_chunks, v_block, v_key + 1)
        audio_last = np.zeros(k, dtype=bool)
        audio_last[audio > 0] = ((n_audio - 1) // per_chunk + 1 >= video_chunks)[audio > 0]
        last_max = np.where((audio > 0) & audio_last, n_audio - 1, v_max)
    else:  # merged by position, video first on ties: compared as the float32 sums with the block start
        v_key, a_key = _f32_sum(g.start, v_block, t_off), _f32_sum(g.start, a_block, a_local)
        last_max = _run_last_max(g.start, t_last, v_max, audio, n_audio)
    extent = _f32_extent(g.start, last_max)  # the end token(s) / the text after the block
    a_pos = a_local.astype(np.float64)
    v_key, a_key = np.asarray(v_key, dtype=np.float64), np.asarray(a_key, dtype=np.float64)
    end = last_max + 1  # (K,) the end token's offset (Qwen2.5-Omni's audio-visual blocks)
    order = _merge_by_time(grid[:, 0] * hw, n_audio, markers * (audio > 0), v_key, a_key)
    if order is None:  # keys too fine to merge by offsets: sort them
        parts = [(video, v_block, v_key, 0, v_local), (np.stack([a_pos] * 3), a_block, a_key, 1, a_local)]
        if markers:  # the audio start token first (the video start's position), the end token last (the video end's)
            av = np.flatnonzero(audio > 0)
            parts.append((np.full((3, av.shape[0]), -1.0), av, np.full(av.shape, -np.inf), 0, np.zeros_like(av)))
            parts.append((np.stack([end[av]] * 3), av, np.full(av.shape, np.inf), 0, np.zeros_like(av)))
        offsets = np.concatenate([p[0] for p in parts], axis=1)  # (3, N): video, audio, markers
        block = np.concatenate([p[1] for p in parts])
        key = np.concatenate([p[2] for p in parts])
        kind = np.concatenate([np.full(p[1].shape, p[3]) for p in parts])
        local = np.concatenate([p[4] for p in parts])
        order = np.lexsort((local, kind, key, block))  # block, then time (chunk), video before audio, then index
        out = np.ascontiguousarray(offsets[:, order])
    else:  # each token's place in the output: written there (no sort)
        v_at, a_at, start_at, end_at = order
        out = np.empty((3, v_at.shape[0] + a_at.shape[0] + start_at.shape[0] + end_at.shape[0]))
        out[:, v_at] = video
        out[:, a_at] = a_pos
        out[:, start_at] = -1.0  # the audio start token: the video start's position
        out[:, end_at] = end[markers * (audio > 0) > 0]  # the end token: the video end's
    ones = torch.ones(3, dtype=torch.float64)
    return torch.from_numpy(out), torch.from_numpy(extent), ones


def _omni_frames(g: BlockGeometry, o: SchemeOptions, chunks: bool):
    """Per frame of the blocks (``F = sum t``): its block ``(F,)`` and time offset ``T_f`` ``(F,)`` float64 (float32
    products, floored for Qwen2.5-Omni's ``chunks``); per block: its last frame's ``T_f`` and its largest video
    offset on any axis ``(K,)`` float64."""
    grid = g._grid
    t = grid[:, 0]
    frame_block = np.repeat(np.arange(grid.shape[0]), t)  # (F,) per frame: its block and index f
    f = (np.arange(frame_block.shape[0]) - np.repeat(np.cumsum(t) - t, t)).astype(np.float32)
    seconds = np.where(g.is_image.numpy(), np.float32(1), g.seconds.numpy().astype(np.float32))  # (K,) float32
    t_frame = (f * seconds[frame_block]).astype(np.float32) * np.float32(o.tokens_per_second)  # float32 products
    if chunks:
        t_frame = np.trunc(t_frame)  # .long()
    t_frame = t_frame.astype(np.float64)
    t_last = t_frame[np.cumsum(t) - 1]  # (K,)
    v_max = np.maximum(np.maximum(t_last, grid[:, 1] - 1), grid[:, 2] - 1).astype(np.float64)
    return frame_block, t_frame, t_last, v_max


def _omni_audio(g: BlockGeometry, markers: int) -> tuple[np.ndarray, np.ndarray]:
    """``(K,)`` int64 each block's tokens besides its video tokens (``g.audio``; 0: none) and its audio tokens proper
    (without the ``2 * markers`` start / end tokens)."""
    audio = np.zeros(g._grid.shape[0], dtype=np.int64) if g.audio is None else g.audio.numpy().astype(np.int64)
    return audio, np.where(audio > 0, audio - 2 * markers, 0)


def _run_last_max(start: Tensor | None, t_last, v_max, audio, n_audio) -> np.ndarray:
    """``(K,)`` Qwen3-Omni: the largest offset of the run that comes last in each block (its audio's last token
    where that comes after the last frame, compared as the float32 sums with the block ``start``), else the
    video's."""
    audio_last = _f32_sum(start, None, t_last) <= _f32_sum(start, None, n_audio - 1)
    return np.where((audio > 0) & audio_last, n_audio - 1, v_max)


def _qwen3_omni_extent(g: BlockGeometry, o: SchemeOptions) -> np.ndarray:
    """``(K,)`` the extents :func:`_qwen3_omni_block` gives for ``g.start``, from the blocks and frames alone."""
    _, _, t_last, v_max = _omni_frames(g, o, chunks=False)
    audio, n_audio = _omni_audio(g, 0)
    return _f32_extent(g.start, _run_last_max(g.start, t_last, v_max, audio, n_audio))


def _merge_by_time(n_v, n_a, marks, v_key, a_key):
    """Where each token of the blocks goes when every block's video and audio tokens are merged by key
    (video first on ties; each kind's keys rise along its tokens), a marker token at both ends of the
    blocks with ``marks`` 1: ``(video, audio, start markers, end markers)`` output indices, or ``None``
    where the keys cannot be told apart after moving every block above the one before (by whole numbers)."""
    k = n_v.shape[0]
    v_start, a_start = np.cumsum(n_v) - n_v, np.cumsum(n_a) - n_a  # (K,) first token of each block, per kind
    size = n_v + n_a + 2 * marks
    out_start = np.cumsum(size) - size  # (K,) each block's first output index
    v_block, a_block = np.repeat(np.arange(k), n_v), np.repeat(np.arange(k), n_a)
    with np.errstate(invalid="ignore"):  # empty kinds: inf - inf
        lo = np.full(k, np.inf)
        hi = np.full(k, -np.inf)
        has_v, has_a = n_v > 0, n_a > 0
        lo[has_v], hi[has_v] = v_key[v_start[has_v]], v_key[(v_start + n_v - 1)[has_v]]
        lo[has_a] = np.minimum(lo[has_a], a_key[a_start[has_a]])
        hi[has_a] = np.maximum(hi[has_a], a_key[(a_start + n_a - 1)[has_a]])
        if not (np.isfinite(lo) | (size == 2 * marks)).all():
            return None
        lo, hi = np.where(np.isfinite(lo), lo, 0), np.where(np.isfinite(hi), hi, 0)
        span = np.floor(hi) - np.floor(lo) + 1  # (K,) whole numbers covering each block's keys
        shift = np.cumsum(span) - span - np.floor(lo)  # block k's keys moved into [sum of spans before, ...)
        v_moved, a_moved = v_key + shift[v_block], a_key + shift[a_block]
    if not (np.array_equal(v_moved - shift[v_block], v_key) and np.array_equal(a_moved - shift[a_block], a_key)):
        return None  # a key rounded when moved: ties could change
    if (np.diff(v_moved) < 0).any() or (np.diff(a_moved) < 0).any():
        return None
    # a token's output index: its block's first + its marker + the tokens of both kinds before it in the block
    # (its own kind's by index, the other kind's by key); keys repeat along a video frame's tokens, so the video
    # keys are searched once per run of equal keys (runs never cross blocks: the moved keys rise across them)
    base = out_start + marks - v_start - a_start  # (K,)
    first = np.flatnonzero(np.diff(v_moved, prepend=-np.inf))  # (U,) each run of equal video keys: first token
    keys = v_moved.take(first)  # (U,) rising
    run_len = np.diff(first, append=v_moved.shape[0])  # (U,)
    v_at = np.repeat(base.take(v_block.take(first)) + np.searchsorted(a_moved, keys, "left"), run_len)
    v_at += np.arange(v_at.shape[0])
    video_before = np.concatenate([[0], np.cumsum(run_len)])  # (U + 1,) video tokens of the first j runs
    a_at = video_before.take(np.searchsorted(keys, a_moved, "right")) + base.take(a_block)
    a_at += np.arange(a_at.shape[0])
    with_marks = np.flatnonzero(marks > 0)
    return v_at, a_at, out_start[with_marks], (out_start + size - 1)[with_marks]


def _qwen25_omni_block(g: BlockGeometry, o: SchemeOptions):
    return _omni_block(g, o, chunks=True)


def _qwen3_omni_block(g: BlockGeometry, o: SchemeOptions):
    return _omni_block(g, o, chunks=False)


for _scheme in (
    Scheme(
        "qwen2.5-omni",
        THW,
        "mrope",
        _qwen25_omni_block,
        _IDENTITY,
        _IDENTITY,
        options=("seconds_per_chunk",),
        check=_check_omni,
        audio=True,
        paper="Xu et al. 2025, Qwen2.5-Omni TMRoPE (arXiv:2503.20215)",
        reference="huggingface/transformers src/transformers/models/qwen2_5_omni/modeling_qwen2_5_omni.py "
        "(Qwen2_5OmniPreTrainedModelForConditionalGeneration.get_rope_index)",
        model_types=("qwen2_5_omni", "qwen2_5_omni_thinker"),
    ),
    Scheme(
        "qwen3-omni",
        THW,
        "mrope-i",
        _qwen3_omni_block,
        _IDENTITY,
        _IDENTITY,
        audio=True,
        reads_start=True,
        extent=_qwen3_omni_extent,
        id_dtype=torch.float32,
        delta_dtype=torch.float32,
        paper="Xu et al. 2025, Qwen3-Omni TMRoPE (arXiv:2509.17765)",
        reference="huggingface/transformers src/transformers/models/qwen3_omni_moe/modeling_qwen3_omni_moe.py "
        "(Qwen3OmniMoePreTrainedModelForConditionalGeneration.get_rope_index)",
        model_types=("qwen3_omni_moe", "qwen3_omni_moe_thinker"),
    ),
):
    register_scheme(_scheme)
