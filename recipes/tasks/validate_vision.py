"""Validation tasks of the vision encoders: one decisive task per method family (docs/recipes.md).

Every task is dense and single-hop on *oracle tokens* (an embedding of each cell's identity, from
:mod:`recipes.data.oracle_grids`), so position is the only thing to learn; the iRPE task also has
a real-pixel variant (``data.tokens: digits``, real 8 x 8 digits from :mod:`recipes.data.digits`).
Each task's recipe names a positive control and the claim in its ``validation:`` section; the
runner turns the runs into verdicts (:func:`mmpos.runner.stats.verdicts`).

* ``validate_vision_rope`` -- Heo et al., "Rotary Position Embedding for Vision Transformer",
  ECCV 2024 (arXiv 2403.13298), §3.2-3.3: axial 2-D RoPE splits the pairs between the ``h`` and
  ``w`` axes, so a head's rotary logit is a row term plus a column term and "cannot handle
  diagonal directions"; RoPE-Mixed learns per-head frequency *vectors* mixing both axes.
  Task (:func:`~recipes.data.oracle_grids.diagonal_pairs`): count the marks at the diagonal
  neighbours ``(+1, +1)`` and ``(-1, -1)`` and not at the anti-diagonal ones, one attention head,
  one layer; train on 8 x 8 grids, test on 16 x 16 (``acc@2x``). With a row term ``f`` plus a
  column term ``g``, ``f(1) + g(1) + f(-1) + g(-1)`` equals the sum of the two anti-diagonal logits,
  so no axial head puts both diagonal neighbours above both anti-diagonal ones *by position alone*.
  (The identity holds for each pair of query and key contents; since marked and unmarked keys have
  different keys, a softmax over both can still partly separate the counts -- measured, not
  assumed: axial RoPE is not at chance here.) The range check
  (``margin@8``, ``margin@2x``): the best single-head margin of the encoder's current frequency
  plan for "both diagonal neighbours above every other offset of the grid" (a linear program over
  the logit's cosine/sine coefficients, bounded by 1): exactly 0 for an axial plan by the identity
  above, positive where a plan can express the pattern. Control: contextual iRPE (product buckets
  give ``(+1, +1)`` and ``(-1, -1)`` their own bucket).
* ``validate_vision_peg`` -- Chu et al., "Conditional Positional Encodings for Vision
  Transformers", ICLR 2023 (arXiv 2102.10882), §3.2 and §4.2 (translation equivariance, input
  size generalisation). Task (:func:`~recipes.data.oracle_grids.left_neighbour`): copy the left
  neighbour's identity, objects only in the left half while training; ``acc@right``: objects only
  in the right half (Chu et al.'s translation split); ``acc@2x``: a 16 x 16 grid, objects in its
  left half. Control: contextual iRPE on keys, whose positional logit ``q . r(bucket(offset))``
  depends on the offset and the query only -- never on the key's content -- so "attend to
  ``(0, -1)``" is one table entry for every identity, every column and every grid (its buckets
  saturate at offset 4, so the 2x grid has no untrained bucket). ``acc:worst_id``: the accuracy of
  the worst-copied identity on the training layout (the diagnostic that shows a per-content
  failure: axial RoPE's positional logit ``q^T R(offset) k`` does depend on the key's content,
  and one head gets stuck copying some identities perfectly and others not at all).
* ``validate_vision_peg_padding`` -- the same paper, §3.2 / Table 7 ("zero padding lets PEG know the
  absolute position"): :func:`~recipes.data.oracle_grids.border` (is this cell on the border?),
  scored as balanced accuracy (chance 0.5). ``peg@circular`` is PEG with circular padding (the grid
  becomes a torus: no cell is special, chance by construction). Control: the learned table.
* ``validate_vision_fuzzy`` -- Fan et al., "ViTAR: Vision Transformer with Any Resolution", 2024
  (arXiv 2403.18361), §3.2 (fuzzy positional encoding) and its multi-resolution training: an
  absolute, resolution-free target (:func:`~recipes.data.oracle_grids.bands`: the cell's region of
  a ``num_bands x num_bands`` partition of the image), trained on grids of 6, 8 and 12 cells,
  tested at the non-integer scales 1.25x (10) and 1.75x (14) and at 2x (16) against the learned
  table resampled bicubically (timm's rule), and under sub-patch shifts (``data.eval_shifts``,
  ``acc@shift<s>``): the training grid moved by a fraction ``s`` of a cell along both axes, each
  token's position ``(i + s, j + s)`` (:meth:`mmpos.Coords.shifted`), its target the region of
  its shifted centre. The fuzzy table is read where ViTAR reads it, at the exact (shifted)
  position; the learned table is read bicubically at the same positions
  (:func:`learned_at_positions`), the resampling it gets at any other resolution. Control: the
  learned table on the training grid (``coord-mlp``, the true cell centre through an MLP, is too
  slow to learn 64 regions in this budget).
* ``validate_vision_irpe`` -- Wu et al., "Rethinking and Improving Relative Position Encoding for
  Vision Transformer", ICCV 2021 (arXiv 2107.14222), §3.1-3.2 (bias mode vs contextual mode):
  :func:`~recipes.data.oracle_grids.directed_neighbour`: each token carries a value and a
  direction and must output the value of its neighbour in that direction. One head, one layer: a
  bias-mode logit ``b(offset)`` is the same for every query, so the head cannot look up for a
  token pointing left and down for one pointing up; contextual mode ``q . r(offset)`` can.
  Control: axial RoPE (query-dependent relative logits).
* ``validate_vision_fourier`` -- Li et al., "Learnable Fourier Features for Multi-Dimensional
  Spatial Positional Encoding", NeurIPS 2021 (arXiv 2106.02795), §3: point sets with continuous
  coordinates (:func:`~recipes.data.oracle_grids.nearest_neighbour_points`: name the token of the
  nearest other point), trained in ``[0, extent]^2`` (``data.extent``, 8: about one unit between
  neighbours, as patch coordinates) and tested on the same task rescaled by 0.5 and by 2 (every
  distance scaled, no target changed). ``fourier`` (the paper's learnable Fourier
  features + MLP) against ``coord-mlp`` (the MLP on raw coordinates, no Fourier features) and
  axial RoPE on the continuous coordinates (the control).

Encoders: any registered mmpos encoder the task's coordinates suit, plus ``coord-mlp`` (task
feature above), ``peg@circular`` and ``irpe@bias`` / ``irpe@ctx`` (iRPE with ``mode`` set;
the other iRPE settings from ``model.pos_kwargs.irpe``).

Batches: ``train_batch(step)`` draws from ``torch.Generator`` seeded ``seed * 1_000_003 + step``;
the evaluation sets from ``10**9 + 1000 * seed + k`` (split ``k``). Metrics: accuracy over the
scored cells (``IGNORE`` excluded), balanced accuracy for the border task.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmpos.coords import Coords
from mmpos.encoders import RotaryEncoder
from mmpos.encoders.learned import LearnedPositionEmbedding
from mmpos.encoders.peg import PositionEncodingGenerator
from mmpos.nn import Transformer
from mmpos.runner.tasks import Task, parse_encoders, register_task

from ..data import oracle_grids as og

__all__ = ["TokenModel", "learned_at_positions", "min_class_accuracy", "rotary_margin"]

COORD_MLP = "coord-mlp"
_VARIANTS = {"peg": ("circular", "zeros"), "irpe": ("bias", "ctx")}

_MODEL = {
    "dim": 32,
    "depth": 1,
    "num_heads": 1,
    "mlp_ratio": 2.0,
    "pos_kwargs": {},  # per encoder name, e.g. {rope-axial: {theta: 100}}; entries of unused encoders are ignored
}


# --------------------------------------------------------------------------- model
class TokenModel(nn.Module):
    """Oracle tokens (or real digit pixels) -> :class:`mmpos.nn.Transformer` -> one prediction per token.

    Args:
        num_tokens: identities embedded by ``nn.Embedding`` (``0``: pixel input only).
        num_classes: classes of the per-token head.
        names: mmpos encoder names for the transformer (``coord-mlp`` handled here).
        grid_size: training grid ``(H, W)`` for learned grids; ``None`` for point sets.
        axes: ``("h", "w")`` for grids, ``("x", "y")`` for points.
        pixels: width of a flattened pixel input (``64`` for 8 x 8 digits), ``0`` for none.
        directions: embed a second id per token (the iRPE task's direction), ``0`` for none.
        peg_padding: ``"zeros"`` (CPVT) or ``"circular"`` for every PEG.

    ``forward(batch) -> logits (B, N, num_classes)``; ``batch`` has ``ids`` ``(B, H, W)`` or
    ``(B, N)``, optionally ``pixels`` ``(B, H, W, 8, 8)``, ``dirs`` ``(B, H, W)``, ``xy`` ``(B, N, 2)``
    and ``shift`` (a ``(row, col)`` pair of Python floats: the grid moved by that fraction of a
    cell, :meth:`mmpos.Coords.shifted`; every learned table is then read bicubically at the
    shifted positions, :func:`learned_at_positions`).
    """

    def __init__(
        self,
        num_tokens: int,
        num_classes: int,
        names: list[str],
        model: dict[str, Any],
        grid_size: tuple[int, int] | None,
        axes: tuple[str, str],
        pixels: int = 0,
        directions: int = 0,
        peg_padding: str = "zeros",
        pos_kwargs: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        super().__init__()
        dim = model["dim"]
        self.axes = axes
        self.embed = nn.Embedding(num_tokens, dim) if num_tokens else None
        self.pixel_embed = nn.Linear(pixels, dim) if pixels else None
        self.dir_embed = nn.Embedding(directions, dim) if directions else None
        self.coord_mlp = COORD_MLP in names
        if self.coord_mlp:
            self.coord_proj = nn.Sequential(nn.Linear(2, dim), nn.GELU(), nn.Linear(dim, dim))
        pos = [n for n in names if n not in (COORD_MLP, "none")]
        self.transformer = Transformer(
            dim,
            model["depth"],
            model["num_heads"],
            pos,
            pos_kwargs or None,
            grid_size,
            model["mlp_ratio"],
            axes=axes,
            conv_after=(0,),
        )
        for m in self.modules():
            if isinstance(m, PositionEncodingGenerator):
                m.proj.padding_mode = peg_padding  # nn.Conv2d pads by F.pad(mode=...) unless "zeros"
        self.head = nn.Linear(dim, num_classes)

    def coords(self, batch: dict[str, Tensor]) -> Coords:
        if "xy" in batch:
            return Coords.points(batch["xy"], axes=self.axes)
        b, h, w = batch["ids"].shape
        return Coords.grid(h, w, batch=b, device=batch["ids"].device)

    def forward(self, batch: dict[str, Tensor]) -> Tensor:
        ids = batch["ids"]
        x = 0
        if self.embed is not None:
            x = x + self.embed(ids)
        if self.pixel_embed is not None:
            x = x + self.pixel_embed(batch["pixels"].flatten(-2))
        if self.dir_embed is not None:
            x = x + self.dir_embed(batch["dirs"])
        b = ids.shape[0]
        x = x.reshape(b, -1, x.shape[-1])  # (B, N, D), grids row-major
        coords = self.coords(batch)
        shift = batch.get("shift")
        if shift is not None:
            coords = coords.shifted(shift)  # (i + dh, j + dw): a sub-cell shift of the whole grid
        if self.coord_mlp:
            if "xy" in batch:
                feat = batch["xy"]
            else:
                feat = coords.normalized().pos  # cell centres in [-1, 1], (B, N, 2)
            x = x + self.coord_proj(feat.to(x.dtype))
        with _tables_read_at_positions(self) if shift is not None else contextlib.nullcontext():
            return self.head(self.transformer(x, coords))


def learned_at_positions(encoder: LearnedPositionEmbedding, coords: Coords) -> Tensor:
    """A 2-D learned table read bicubically at the (possibly fractional) grid positions of ``coords``.

    The table ``(1, gh * gw, D)`` is sampled with ``F.grid_sample(mode="bicubic",
    align_corners=False, padding_mode="border")`` at ``coords.normalized()``: at the cell centres of
    the training grid this is the table itself, at the centres of another grid timm's bicubic
    resampling without antialiasing, and between cells (a sub-patch shift) the bicubic
    interpolation a learned table has no other way to offer. Returns ``(B, N, D)``; ``coords``
    without prefix tokens (``encoder.num_prefix_tokens`` must be 0).
    """
    if encoder.num_prefix_tokens or len(encoder.grid_size) != 2 or coords.num_prefix_tokens:
        raise ValueError(
            "learned_at_positions reads a 2-D table without prefix tokens; got grid_size="
            f"{encoder.grid_size}, num_prefix_tokens={encoder.num_prefix_tokens} / {coords.num_prefix_tokens}"
        )
    gh, gw = encoder.grid_size
    table = encoder.pos_embed.reshape(1, gh, gw, -1).permute(0, 3, 1, 2).float()  # (1, D, gh, gw)
    pos = coords.normalized().pos  # (B, N, 2) (row, col) in [-1, 1]
    grid = pos.flip(-1).unsqueeze(2).float()  # (B, N, 1, 2) in grid_sample's (x, y) order
    out = F.grid_sample(
        table.expand(grid.shape[0], -1, -1, -1), grid, mode="bicubic", padding_mode="border", align_corners=False
    )
    return out.squeeze(-1).transpose(1, 2).to(encoder.pos_embed.dtype)  # (B, N, D)


@contextlib.contextmanager
def _tables_read_at_positions(model: nn.Module):
    """Inside: every learned table of ``model`` embeds with :func:`learned_at_positions`."""
    tables = [m for m in model.modules() if isinstance(m, LearnedPositionEmbedding)]
    for m in tables:
        m.embed = functools.partial(learned_at_positions, m)  # an instance attribute shadows the method
    try:
        yield
    finally:
        for m in tables:
            del m.embed


def _build_model(cfg: dict, encoder: str, num_tokens: int, num_classes: int, grid, axes, **kw) -> TokenModel:
    spec = parse_encoders(encoder, _VARIANTS)
    names = spec.names
    pos_kwargs = {k: dict(v) for k, v in (cfg["model"]["pos_kwargs"] or {}).items() if k in names}
    peg_padding = "zeros"
    for name, variant in spec.items:
        if name == "irpe" and variant is not None:
            pos_kwargs.setdefault("irpe", {})["mode"] = variant
        if name == "peg" and variant is not None:
            peg_padding = variant
    return TokenModel(
        num_tokens, num_classes, names, cfg["model"], grid, axes, peg_padding=peg_padding, pos_kwargs=pos_kwargs, **kw
    )


# --------------------------------------------------------------------------- the range check
def _offsets(size: int) -> Tensor:
    r = torch.arange(-(size - 1), size, dtype=torch.float64)
    return torch.stack(torch.meshgrid(r, r, indexing="ij"), -1).reshape(-1, 2)  # (M, 2) (dh, dw)


def rotary_margin(freqs: Tensor, positive: list[tuple[int, int]], size: int) -> float:
    """Best single-head margin of a rotary plan: the positive offsets' logits above every other offset's.

    ``freqs`` ``(2, P)``: the angle of pair ``p`` at offset ``(dh, dw)`` is ``dh * freqs[0, p] + dw *
    freqs[1, p]``. A head's rotary logit is ``sum_p a_p cos(angle_p) + b_p sin(angle_p)`` (any
    ``a, b``: they come from q and k); the linear program maximises ``t`` with every positive logit
    at least ``t`` above every other offset of a ``size x size`` grid, ``|a_p|, |b_p| <= 1``.
    """
    from scipy.optimize import linprog  # scipy comes with scikit-learn (the data extra)

    offsets = _offsets(size)
    angles = offsets @ freqs.double()  # (M, P)
    feats = torch.cat([angles.cos(), angles.sin()], -1).numpy()  # (M, 2P)
    index = {(int(a), int(b)): i for i, (a, b) in enumerate(offsets.tolist())}
    pos = [index[p] for p in positive]
    neg = [i for i in range(len(offsets)) if i not in set(pos)]
    import numpy as np

    rows = [feats[neg] - feats[p] for p in pos]  # (|neg|, 2P) each: L(n) - L(p) + t <= 0
    a_ub = np.concatenate([np.concatenate([r, np.ones((len(r), 1))], 1) for r in rows])
    c = np.zeros(feats.shape[1] + 1)
    c[-1] = -1.0  # maximise t
    bounds = [(-1.0, 1.0)] * feats.shape[1] + [(None, None)]
    res = linprog(c, A_ub=a_ub, b_ub=np.zeros(len(a_ub)), bounds=bounds, method="highs")
    return float(res.x[-1]) if res.success else math.nan


def _plans(model: nn.Module) -> list[Tensor]:
    """Every head's ``(2, P)`` frequency plan of the model's rotary encoders (RoPE-Mixed: one per head)."""
    out = []
    for m in model.modules():
        if isinstance(m, RotaryEncoder):
            w = m.weight.detach().cpu()
            out += list(w) if w.dim() == 3 else [w]  # (H, A, P) or (A, P)
    return out


# --------------------------------------------------------------------------- shared glue
def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _accuracy(logits: Tensor, target: Tensor, balanced: bool = False) -> float:
    pred, target = logits.argmax(-1).reshape(-1), target.reshape(-1)
    keep = target != og.IGNORE
    pred, target = pred[keep], target[keep]
    if not balanced:
        return (pred == target).float().mean().item()
    recalls = [(pred[target == c] == c).float().mean() for c in target.unique()]
    return torch.stack(recalls).mean().item()


def min_class_accuracy(pred: Tensor, target: Tensor) -> float:
    """The lowest per-class accuracy over the classes present in ``target`` (``IGNORE`` left out).

    ``pred`` and ``target``: integer tensors of the same shape. A model that copies some identities
    and not others (a per-content failure) has a high mean accuracy and a low minimum.
    """
    if pred.shape != target.shape:
        raise ValueError(f"pred and target must have the same shape, got {tuple(pred.shape)} and {tuple(target.shape)}")
    pred, target = pred.reshape(-1), target.reshape(-1)
    keep = target != og.IGNORE
    pred, target = pred[keep], target[keep]
    if not len(target):
        raise ValueError("target has no scored entries (all IGNORE)")
    return min((pred[target == c] == c).float().mean().item() for c in target.unique())


def _task(
    model: nn.Module,
    cfg: dict,
    seed: int,
    device: torch.device,
    make: Callable[[int, torch.Generator], tuple[dict[str, Tensor], Tensor]],
    evals: dict[str, Callable[[torch.Generator], tuple[dict[str, Tensor], Tensor]]],
    balanced: bool = False,
    extra: Callable[[nn.Module], dict[str, float]] | None = None,
) -> Task:
    """``make(step, generator) -> (inputs, target)`` trains; ``evals[name](generator)`` are fixed sets."""
    sets = {}
    for k, (name, fn) in enumerate(evals.items()):
        sets[name] = fn(_generator(10**9 + 1000 * seed + k))

    def train_batch(step: int):
        return make(step, _generator(seed * 1_000_003 + step))

    def loss(model: nn.Module, batch):
        inputs, target = batch
        logits = model(inputs)
        return F.cross_entropy(logits.flatten(0, -2), target.reshape(-1), ignore_index=og.IGNORE)

    def evaluate(model: nn.Module) -> dict[str, float]:
        out = {}
        for name, (inputs, target) in sets.items():
            logits = model({k: v.to(device) if isinstance(v, Tensor) else v for k, v in inputs.items()}).cpu()
            out[name] = _accuracy(logits, target, balanced)
        if extra is not None:
            out.update(extra(model))
        return out

    first = next(iter(evals))
    return Task(model=model, train_batch=train_batch, loss=loss, evaluate=evaluate, metric=first)


def _positive_int(data: dict, key: str) -> int:
    v = data[key]
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        raise ValueError(f"data.{key} must be a positive int, got {v!r}")
    return v


# --------------------------------------------------------------------------- RoPE-Mixed vs axial
_ROPE_DATA = {"grid": 8, "eval_grid": 16, "density": 0.5, "eval_size": 256}


@register_task("validate_vision_rope", defaults={"model": _MODEL, "data": _ROPE_DATA, "validation": {}})
def build_rope(cfg: dict, encoder: str, seed: int, device: torch.device) -> Task:
    """Diagonal pairs on 8 x 8 grids, tested on 16 x 16; ``margin@*``: the rotary plans' range check."""
    d = cfg["data"]
    size, big = _positive_int(d, "grid"), _positive_int(d, "eval_grid")
    model = _build_model(cfg, encoder, 2, 3, (size, size), ("h", "w"))

    def make(n: int, s: int, g: torch.Generator):
        marks, target = og.diagonal_pairs(n, s, g, d["density"])
        return {"ids": marks}, target

    def margins(model: nn.Module) -> dict[str, float]:
        plans = _plans(model)
        if not plans:
            return {}
        diag = [(1, 1), (-1, -1)]
        return {f"margin@{k}": max(rotary_margin(p, diag, s) for p in plans) for k, s in (("1x", size), ("2x", big))}

    evals = {
        "acc": lambda g: make(d["eval_size"], size, g),
        "acc@2x": lambda g: make(d["eval_size"] // 4 or 1, big, g),
    }
    return _task(model, cfg, seed, device, lambda step, g: make(cfg["batch_size"], size, g), evals, extra=margins)


# --------------------------------------------------------------------------- CPE / PEG
_PEG_DATA = {"grid": 8, "num_objects": 8, "density": 0.5, "eval_size": 256}


@register_task("validate_vision_peg", defaults={"model": _MODEL, "data": _PEG_DATA, "validation": {}})
def build_peg(cfg: dict, encoder: str, seed: int, device: torch.device) -> Task:
    """Copy the left neighbour; objects in the left half while training, the right half / a 2x grid at test."""
    d = cfg["data"]
    s, k = _positive_int(d, "grid"), _positive_int(d, "num_objects")
    if s % 2:
        raise ValueError(f"data.grid must be even (a left and a right half), got {s}")
    model = _build_model(cfg, encoder, k + 1, k + 1, (s, s), ("h", "w"))

    def make(n: int, size: int, cols: tuple[int, int], g: torch.Generator):
        tokens, target = og.left_neighbour(n, size, size, cols, k, g, d["density"])
        return {"ids": tokens}, target

    evals = {
        "acc": lambda g: make(d["eval_size"], s, (0, s // 2), g),
        "acc@right": lambda g: make(d["eval_size"], s, (s // 2, s), g),
        "acc@2x": lambda g: make(d["eval_size"] // 4 or 1, 2 * s, (0, s), g),
    }
    # the diagnostic: accuracy of the worst-copied identity on the training layout (its own fixed set)
    id_set = make(d["eval_size"], s, (0, s // 2), _generator(10**9 + 1000 * seed + len(evals)))

    def worst_identity(model: nn.Module) -> dict[str, float]:
        inputs, target = id_set
        pred = model({k: v.to(device) for k, v in inputs.items()}).argmax(-1).cpu()  # (B, H * W)
        return {"acc:worst_id": min_class_accuracy(pred, target.reshape(pred.shape))}

    return _task(
        model,
        cfg,
        seed,
        device,
        lambda step, g: make(cfg["batch_size"], s, (0, s // 2), g),
        evals,
        extra=worst_identity,
    )


_PAD_DATA = {"grid": 8, "num_tokens": 8, "eval_size": 256}


@register_task("validate_vision_peg_padding", defaults={"model": _MODEL, "data": _PAD_DATA, "validation": {}})
def build_peg_padding(cfg: dict, encoder: str, seed: int, device: torch.device) -> Task:
    """Is this cell on the border? Balanced accuracy at the training grid and at 2x."""
    d = cfg["data"]
    s, k = _positive_int(d, "grid"), _positive_int(d, "num_tokens")
    model = _build_model(cfg, encoder, k, 2, (s, s), ("h", "w"))

    def make(n: int, size: int, g: torch.Generator):
        tokens, target = og.border(n, size, size, k, g)
        return {"ids": tokens}, target

    evals = {
        "bacc": lambda g: make(d["eval_size"], s, g),
        "bacc@2x": lambda g: make(d["eval_size"] // 4 or 1, 2 * s, g),
    }
    return _task(model, cfg, seed, device, lambda step, g: make(cfg["batch_size"], s, g), evals, balanced=True)


# --------------------------------------------------------------------------- ViTAR fuzzy PE
_FUZZY_DATA = {
    "grid": 8,  # the learned tables' grid
    "train_grids": [6, 8, 12],  # multi-resolution training: step t uses train_grids[t % len]
    "eval_grids": {"acc@1.25x": 10, "acc@1.75x": 14, "acc@2x": 16},
    "eval_shifts": [],  # sub-patch shifts (fractions of a cell, both axes) on the training grid: acc@shift<s>
    "num_tokens": 8,
    "num_bands": 4,
    "eval_size": 128,
}


@register_task("validate_vision_fuzzy", defaults={"model": _MODEL, "data": _FUZZY_DATA, "validation": {}})
def build_fuzzy(cfg: dict, encoder: str, seed: int, device: torch.device) -> Task:
    """Name the cell's region of a 4 x 4 partition; trained on several grids, tested at 1.25x / 1.75x / 2x."""
    d = cfg["data"]
    s, k, nb = _positive_int(d, "grid"), _positive_int(d, "num_tokens"), _positive_int(d, "num_bands")
    grids = list(d["train_grids"])
    if not grids or not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in grids):
        raise ValueError(f"data.train_grids must be a non-empty list of positive ints, got {grids!r}")
    model = _build_model(cfg, encoder, k, nb * nb, (s, s), ("h", "w"))

    shifts = list(d["eval_shifts"])
    for x in shifts:
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not -0.5 < x < 0.5:
            raise ValueError(f"data.eval_shifts must be fractions of a cell in (-0.5, 0.5), got {shifts!r}")

    def make(n: int, size: int, g: torch.Generator, shift: float = 0.0):
        tokens, target = og.bands(n, size, size, k, nb, g, shift=shift)
        inputs: dict[str, Any] = {"ids": tokens}
        if shift:
            inputs["shift"] = (float(shift), float(shift))
        return inputs, target

    evals = {"acc": lambda g: make(d["eval_size"], s, g)}
    for name, size in dict(d["eval_grids"]).items():
        evals[name] = lambda g, size=size: make(max(d["eval_size"] * s * s // (size * size), 1), size, g)
    for x in shifts:
        evals[f"acc@shift{float(x):g}"] = lambda g, x=float(x): make(d["eval_size"], s, g, x)
    return _task(model, cfg, seed, device, lambda step, g: make(cfg["batch_size"], grids[step % len(grids)], g), evals)


# --------------------------------------------------------------------------- iRPE bias vs contextual
_IRPE_DATA = {"grid": 8, "eval_grid": 12, "num_values": 8, "tokens": "oracle", "eval_size": 256}


@register_task("validate_vision_irpe", defaults={"model": _MODEL, "data": _IRPE_DATA, "validation": {}})
def build_irpe(cfg: dict, encoder: str, seed: int, device: torch.device) -> Task:
    """Copy the neighbour the token points at; ``data.tokens: digits`` shows real digits (train/test images)."""
    d = cfg["data"]
    s, big, v = _positive_int(d, "grid"), _positive_int(d, "eval_grid"), _positive_int(d, "num_values")
    if d["tokens"] not in ("oracle", "digits"):
        raise ValueError(f"data.tokens must be 'oracle' or 'digits', got {d['tokens']!r}")
    digits = d["tokens"] == "digits"
    if digits and v != 10:
        raise ValueError(f"data.num_values must be 10 with data.tokens=digits (the digit classes), got {v}")
    if digits:
        from ..data.digits import digit_images  # scikit-learn (the data extra)

    model = _build_model(
        cfg, encoder, 0 if digits else v, v, (s, s), ("h", "w"), pixels=64 if digits else 0, directions=4
    )

    def make(n: int, size: int, g: torch.Generator, split: str):
        values, dirs, target = og.directed_neighbour(n, size, size, v, g)
        inputs = {"ids": values, "dirs": dirs}
        if digits:
            inputs["pixels"] = digit_images(values, split, g)
        return inputs, target

    evals = {
        "acc": lambda g: make(d["eval_size"], s, g, "test"),
        "acc@1.5x": lambda g: make(max(d["eval_size"] * s * s // (big * big), 1), big, g, "test"),
    }
    return _task(model, cfg, seed, device, lambda step, g: make(cfg["batch_size"], s, g, "train"), evals)


# --------------------------------------------------------------------------- learnable Fourier features
_FOURIER_DATA = {"points": 8, "extent": 8.0, "num_tokens": 8, "eval_scales": [0.5, 2.0], "ratio": 1.5, "eval_size": 256}


@register_task("validate_vision_fourier", defaults={"model": _MODEL, "data": _FOURIER_DATA, "validation": {}})
def build_fourier(cfg: dict, encoder: str, seed: int, device: torch.device) -> Task:
    """Name the nearest point's token; points in ``[0, extent]^2`` while training, rescaled at test."""
    d = cfg["data"]
    n, k = _positive_int(d, "points"), _positive_int(d, "num_tokens")
    extent = float(d["extent"])
    if not extent > 0:
        raise ValueError(f"data.extent must be a positive number, got {d['extent']!r}")
    model = _build_model(cfg, encoder, k, k, None, ("x", "y"))

    def make(b: int, scale: float, g: torch.Generator):
        xy, tokens, target = og.nearest_neighbour_points(b, n, k, g, scale, d["ratio"])
        return {"ids": tokens, "xy": xy}, target

    evals = {"acc": lambda g: make(d["eval_size"], extent, g)}
    for scale in d["eval_scales"]:
        if not float(scale) > 0:
            raise ValueError(f"data.eval_scales must be positive numbers, got {d['eval_scales']!r}")
        evals[f"acc@{float(scale):g}x"] = lambda g, scale=float(scale): make(d["eval_size"], scale * extent, g)
    return _task(model, cfg, seed, device, lambda step, g: make(cfg["batch_size"], extent, g), evals)
