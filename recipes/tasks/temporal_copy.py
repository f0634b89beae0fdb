"""``temporal_copy``: the M-RoPE family on long clips of oracle tokens (a small V-NIAH-D).

Papers and the claims measured:

* chunked M-RoPE (Wang et al. 2024, Qwen2-VL, arXiv:2409.12191, Sec. 2.1) gives time the
  highest-frequency chunk of pairs; MRoPE-Interleave and MHRoPE (Huang et al. 2025,
  arXiv:2510.23095, Sec. 3-4) spread time over the whole spectrum (interleaved pairs, or whole
  heads) and claim better long-video extrapolation;
* VRoPE (Liu et al. 2025, arXiv:2502.11664, Sec. 3) and HoPE (Li et al. 2025, arXiv:2505.20444,
  Sec. 4: hybrid allocation with temporal NoPE, and temporal scaling for videos at other speeds)
  are evaluated on V-NIAH-D, the needle-in-a-haystack with periodic distractors of VideoRoPE
  (Wei et al. 2025, arXiv:2502.05173, Sec. 4).

Task (:mod:`recipes.data.temporal_copy`): every cell of a clip of ``rows x cols`` oracle
tokens per frame predicts the value of the same cell ``data.lag`` frames earlier (a fixed
``(-lag, 0, 0)`` offset in ``(t, h, w)``: dense targets, one hop). Train on clips of
``data.train_frames`` frames, evaluate on ``data.eval_frames`` (``acc@T``; the longest ranks
runs), and on the longest clips at twice the frame rate (every content frame shown twice, the
copy reaching back ``2 * lag`` frames: ``fps2_acc``), where HoPE uses its temporal scale
``data.fps_scale`` (0.5: the positions of the original frame rate) and every other scheme its
usual positions.

Encoders: layout schemes of :data:`mmpos.schemes.SCHEMES` (``flat``: 1-D RoPE over the
raster order, the positive control: with one fixed grid the offset is a constant
``lag * rows * cols`` tokens; ``qwen2-vl`` (chunked M-RoPE, the baseline), ``mrope-i``,
``mhrope``, ``vrope``, ``hope``). HoPE trains at temporal scale 1 (its random per-video
scale draw would make the copy offset, in positions, random: the task fixes it in frames),
a deviation from its recipe stated here.

The range check: ``margin@T`` is the best single-head margin the scheme's rotary plan allows
at clip length ``T``: for the clip's last token as query, the largest ``m`` such that some
``score(k) = sum_p a_p cos(phi_qk,p) + b_p sin(phi_qk,p)`` with ``sum_p |a_p| + |b_p| <= 1``
exceeds the score of every other causal key by ``m`` at the target key (a linear program,
:func:`scipy.optimize.linprog`; ``margin_t@T`` the same against the keys of the same cell
only, the periodic distractors); per-head plans (MHRoPE) report their best head. It is
computed when the task is built, printed, and reported with the metrics: a plan whose margin
is near 0 cannot solve the task with one head.

Shapes: tokens ``(B, T * rows * cols)`` long in ``(t, h, w)`` raster order; logits
``(B, L, vocab)``.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmpos.encoders import RotaryEncoder
from mmpos.layout import Video, build
from mmpos.nn import Transformer
from mmpos.runner.tasks import NUMBER, Task, parse_encoders, register_task
from mmpos.schemes import SCHEMES

from ..data.temporal_copy import copy_clips

__all__ = ["CopyModel", "plan_margin"]

SCHEMES_TAKEN = ("flat", "qwen2-vl", "mrope-i", "mhrope", "vrope", "hope")

DEFAULTS: dict[str, Any] = {
    "model": {"dim": 64, "depth": 2, "num_heads": 4, "num_kv_heads": 4, "theta": 100.0},
    "data": {
        "rows": 2,
        "cols": 2,
        "lag": 2,
        "vocab": 16,
        "train_frames": [8, 16],
        "eval_frames": [16, 64],
        "eval_size": 64,
        "fps_scale": 0.5,
        "check_margin": True,
    },
}


class CopyModel(nn.Module):
    """Oracle-token embedding -> causal :class:`mmpos.nn.Transformer` with the scheme's rotary encoder -> logits.

    ``forward(tokens (B, L), coords) -> (B, L, vocab)``; ``coords`` from :func:`mmpos.layout.build`.
    """

    def __init__(self, vocab: int, scheme: str, dim: int, depth: int, num_heads: int, num_kv_heads: int, theta: float):
        super().__init__()
        if scheme not in SCHEMES:
            raise ValueError(f"scheme must be one of {sorted(SCHEMES)}, got {scheme!r}")
        encoder = SCHEMES[scheme].encoder
        self.embed = nn.Embedding(vocab, dim)
        self.decoder = Transformer(
            dim,
            depth,
            num_heads,
            pos=encoder,
            pos_kwargs={encoder: {"theta": float(theta)}},
            num_kv_heads=num_kv_heads,
            causal=True,
            conv_after=(),
        )
        self.head = nn.Linear(dim, vocab)

    @property
    def rotary(self) -> RotaryEncoder:
        """The decoder's rotary encoder (read by the range check)."""
        return next(m for m in self.modules() if isinstance(m, RotaryEncoder))

    def forward(self, tokens: Tensor, coords) -> Tensor:
        return self.head(self.decoder(self.embed(tokens), coords))


def _lp_margin(feat_target: np.ndarray, feat_other: np.ndarray) -> float:
    """max m s.t. c . (f_target - f_k) >= m for every row k of ``feat_other``, ||c||_1 <= 1."""
    from scipy.optimize import linprog

    diff = feat_target[None] - feat_other  # (K, F)
    k, f = diff.shape
    # variables: c+ (F), c- (F), m; minimise -m
    a_ub = np.concatenate([np.concatenate([-diff, diff, np.ones((k, 1))], 1), [[1.0] * (2 * f) + [0.0]]], 0)
    b_ub = np.concatenate([np.zeros(k), [1.0]])
    cost = np.zeros(2 * f + 1)
    cost[-1] = -1.0
    res = linprog(cost, A_ub=a_ub, b_ub=b_ub, bounds=[(0, None)] * (2 * f) + [(None, None)], method="highs")
    if not res.success:
        raise RuntimeError(f"range check: linprog failed ({res.message})")
    return float(-res.fun)


def plan_margin(angles: Tensor, query: int, target: int, keys: Tensor) -> float:
    """Best single-head margin of the target key over ``keys`` (indices) for ``query``.

    ``angles``: ``(N, P)`` (shared plan) or ``(H, N, P)`` (per-head plan, the best head counts).
    """
    a = angles.double().unsqueeze(0) if angles.dim() == 2 else angles.double()
    best = -float("inf")
    for head in a:  # (N, P)
        phi = head[query][None] - head  # (N, P): relative angles q - k
        feat = torch.cat([phi.cos(), phi.sin()], -1).numpy()
        best = max(best, _lp_margin(feat[target], feat[keys.numpy()]))
    return best


def _layout(scheme: str, frames: int, rows: int, cols: int, batch: int, scale: float | None):
    options = {"temporal_scale": scale} if scheme == "hope" else {}
    return build([[Video((frames, rows, cols))]] * batch, scheme, spatial_merge_size=1, **options).coords


@lru_cache(maxsize=32)
def _margins(scheme: str, theta: float, dim: int, heads: int, kv: int, frames: int, rows: int, cols: int, lag: int):
    model = CopyModel(2, scheme, dim, 1, heads, kv, theta)
    angles = model.rotary.angles(_layout(scheme, frames, rows, cols, 1, 1.0))[0]  # (N, P) or (H, N, P)
    cells = rows * cols
    query = frames * cells - 1
    target = query - lag * cells
    others = torch.tensor([k for k in range(query + 1) if k != target])
    same_cell = torch.tensor([k for k in range(cells - 1, query + 1, cells) if k != target])
    return plan_margin(angles, query, target, others), plan_margin(angles, query, target, same_cell)


@register_task("temporal_copy", defaults={**DEFAULTS, "validation": {}})
def build_task(cfg: dict, encoder: str, seed: int, device: torch.device) -> Task:
    ((scheme, option),) = parse_encoders(encoder, {"hope": (NUMBER,)}, combine=False).items
    if scheme not in SCHEMES_TAKEN:
        raise ValueError(f"temporal_copy: encoder must be one of {SCHEMES_TAKEN}, got {encoder!r}")
    m, d = cfg["model"], cfg["data"]
    rows, cols, lag, vocab = d["rows"], d["cols"], d["lag"], d["vocab"]
    lo, hi = d["train_frames"]
    if not lag < lo <= hi:
        raise ValueError(f"data.train_frames must be [lo, hi] with data.lag < lo <= hi, got {d['train_frames']!r}")
    eval_scale = float(option) if option is not None else 1.0
    model = CopyModel(vocab, scheme, m["dim"], m["depth"], m["num_heads"], m["num_kv_heads"], m["theta"])

    margins: dict[str, float] = {}
    if d["check_margin"]:
        for frames in d["eval_frames"]:
            full, temporal = _margins(
                scheme, m["theta"], m["dim"], m["num_heads"], m["num_kv_heads"], frames, rows, cols, lag
            )
            margins[f"margin@{frames}"], margins[f"margin_t@{frames}"] = full, temporal
        print(f"temporal_copy range check ({encoder}): " + ", ".join(f"{k} {v:.3f}" for k, v in margins.items()))

    coords_cache: dict[tuple[int, int, float], Any] = {}

    def coords(frames: int, batch: int, scale: float):
        key = (frames, batch, scale)
        if key not in coords_cache:
            coords_cache[key] = _layout(scheme, frames, rows, cols, batch, scale).to(device)
        return coords_cache[key]

    def train_batch(step: int):
        gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
        frames = int(torch.randint(lo, hi + 1, (1,), generator=gen))
        values, targets = copy_clips(cfg["batch_size"], frames, rows, cols, lag, vocab, gen)
        return values.flatten(1), targets

    def loss(model: nn.Module, batch):
        tokens, targets = batch
        logits = model(tokens, coords(tokens.shape[1] // (rows * cols), tokens.shape[0], 1.0))
        keep = targets >= 0
        out = F.cross_entropy(logits[keep], targets[keep])
        return out, {"train_acc": (logits[keep].argmax(-1) == targets[keep]).float().mean().item()}

    evals = {}
    for frames in d["eval_frames"]:
        gen = torch.Generator().manual_seed(10_000 + frames)  # the same clips for every encoder and seed
        evals[f"acc@{frames}"] = (*copy_clips(d["eval_size"], frames, rows, cols, lag, vocab, gen), 1, eval_scale)
    longest = max(d["eval_frames"])
    gen = torch.Generator().manual_seed(20_000 + longest)
    fps_scale = float(d["fps_scale"]) if scheme == "hope" else 1.0
    evals["fps2_acc"] = (*copy_clips(d["eval_size"], longest, rows, cols, lag, vocab, gen, hold=2), 2, fps_scale)

    def evaluate(model: nn.Module) -> dict[str, float]:
        out = dict(margins)
        for name, (values, targets, _, scale) in evals.items():
            tokens = values.flatten(1).to(device)
            hits = total = 0
            for i in range(0, len(tokens), 32):
                t, y = tokens[i : i + 32], targets[i : i + 32].to(device)
                pred = model(t, coords(t.shape[1] // (rows * cols), t.shape[0], scale)).argmax(-1)
                keep = y >= 0
                hits += (pred[keep] == y[keep]).sum().item()
                total += keep.sum().item()
            out[name] = hits / total
        return out

    return Task(
        model=model,
        train_batch=train_batch,
        loss=loss,
        evaluate=evaluate,
        metric=f"acc@{longest}",
        chance=1.0 / vocab,  # values drawn uniformly
    )
