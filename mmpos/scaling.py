"""Length and resolution scaling of rotary frequency plans: PI, NTK, YaRN and their kin, per axis.

Every rule is a transform of a :class:`~mmpos.rotary.FrequencyPlan`, so one implementation serves
1-D RoPE, axial and mixed 2-D/3-D RoPE and every M-RoPE scheme. A factor (and an original size)
is given per axis of the plan; a scalar applies to every axis. Pair ``p`` reading axis ``a`` at
frequency ``f`` is rescaled with the numbers of axis ``a``.

==============  ==================================================================  ==================
rule            pair frequency ``f`` becomes (``s`` the axis factor)                 source
==============  ==================================================================  ==================
linear          ``f / s`` (positions divided by ``s``)                              Chen et al. 2023, PI
ntk             ``f * s ** (-k / (n - 1))``: base ``theta * s ** (n / (n - 1))``    bloc97 2023, NTK-aware
theta           ``f * s ** (-k / n)``: base ``theta * s``                           CineScale / Wan ``ntk_alpha``
dynamic         ``ntk`` with ``s' = s L / L0 - (s - 1)`` once the length ``L > L0``  emozilla 2023, HF ``dynamic``
ntk-by-parts    ``f / s`` below ``beta_slow`` turns per ``L0``, ``f`` above           Peng et al. 2023, YaRN sec. 3.2
                ``beta_fast``, a linear ramp over the pair index between
yarn            ``ntk-by-parts`` and the attention factor ``0.1 ln s + 1``            Peng et al. 2023, YaRN
llama3          ``f / s`` for wavelengths above ``L0 / low_freq_factor``, ``f``       Meta Llama 3.1
                below ``L0 / high_freq_factor``, smooth in between
longrope        ``f / short_factor[p]`` (``L <= L0``) or ``f / long_factor[p]``      Ding et al. 2024, LongRoPE
                (``L > L0``); attention factor ``sqrt(1 + ln s / ln L0)``
ref-shape       ``f * L0 / L``: the current extent ``L`` is mapped onto ``L0``       timm ``ref_feat_shape`` (EVA-02)
==============  ==================================================================  ==================

``k`` is the index of the pair in its *spectrum* of ``n`` pairs (``f = theta ** (-k / n)``) and
``L0`` the original size of the axis (HF ``original_max_position_embeddings``, or a grid side).
The spectrum is ``"axis"`` (the pairs reading one axis are that axis's own spectrum: 1-D RoPE,
axial 2-D/3-D RoPE, the per-axis rules of image and video generation models) or ``"shared"``
(all pairs of the plan are one spectrum, sectioned over the axes: M-RoPE, MRoPE-I, MHRoPE, VRoPE,
HoPE, as vLLM and Hugging Face apply YaRN to the full 1-D ``inv_freq`` and then section it).

On 1-D text the rules equal Hugging Face transformers' ``ROPE_INIT_FUNCTIONS``
(``modeling_rope_utils.py``: ``linear``, ``dynamic``, ``yarn``, ``longrope``, ``llama3``; inverse
frequencies to float32 rounding and attention factors exactly; ``linear``, ``llama3`` and ``dynamic`` at a
tensor length, as Hugging Face's ``forward`` passes it, bit for bit); the tests compare on 4.57 and 5.x.
The ramp of ``ntk-by-parts`` / ``yarn`` is linear in the pair index with the correction range
rounded outwards (``truncate=True``), as the reference implementation (jquesnelle/yarn,
``scaled_rope/LlamaYaRNScaledRotaryEmbedding.py``) and Hugging Face compute it; the paper writes
the same ramp as a function of ``r = L0 / wavelength``.

Per-axis attention factor: YaRN and LongRoPE define one temperature for the whole attention; with
per-axis factors it is computed from the largest factor (equal to the 1-D rule when one scalar
applies to every axis, e.g. text through M-RoPE). Pass ``attention_factor`` to choose another.

Dynamic rules (``dynamic``, ``longrope``, ``ref-shape``) read the current length of each axis,
``L = max(pos) + 1`` over the batch (Hugging Face's ``torch.max(position_ids) + 1``), as a device
tensor inside ``forward``: the rescaled frequencies are a few elementwise operations on the
``(A, P)`` plan, with no host synchronisation and no data-dependent branch, so
``torch.compile(fullgraph=True)`` and ``torch.export`` trace them. Below the threshold the
result equals the unscaled plan bit for bit (``s' = 1``). Unlike Hugging Face, whose ``dynamic``
keeps the frequencies of the longest length seen until the length drops below ``L0``, the rule is
a function of the current call's length only (the same for a growing length, as in generation).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import Tensor, nn

from ._validate import check_bool, check_choice, check_float
from .coords import Coords
from .rotary import FrequencyPlan

__all__ = [
    "DYNAMIC_RULES",
    "POSITION_RULES",
    "RAMPS",
    "RULES",
    "SPECTRA",
    "PlanRescale",
    "RopeScaling",
    "as_scaling",
    "build_scaling",
    "cinescale_ntk",
    "dynamic_ntk",
    "grid_scaling",
    "llama3",
    "longrope",
    "ntk_aware",
    "ntk_by_parts",
    "position_interpolation",
    "reference_shape",
    "rescaled_weight",
    "resolution_interpolation",
    "scale_plan",
    "theta_scaling",
    "timm_ref_feat_shape",
    "yarn",
    "yarn_attention_factor",
]

RULES = ("linear", "ntk", "theta", "dynamic", "ntk-by-parts", "yarn", "llama3", "longrope", "ref-shape")
#: rules whose frequencies depend on the current length of each axis (computed in ``forward``)
DYNAMIC_RULES = ("dynamic", "longrope", "ref-shape")
#: rules that only rescale positions: defined on any plan, dense learned ones (RoPE-Mixed) included
POSITION_RULES = ("linear", "ref-shape")
SPECTRA = ("axis", "shared")
#: the ramps of ``ntk-by-parts`` / ``yarn`` (:class:`RopeScaling`)
RAMPS = ("index", "ratio")
_NEEDS_ORIGINAL = ("dynamic", "ntk-by-parts", "yarn", "llama3", "longrope", "ref-shape")
_SPECTRAL = ("ntk", "theta", "dynamic", "ntk-by-parts", "yarn")  # need k, n (and theta) of each pair


def _per_axis(value: Any, name: str, allow_int: bool = False) -> float | tuple[float, ...] | dict[str, float]:
    """A positive finite number, a non-empty tuple of them (one per plan axis, in plan order) or a non-empty
    mapping ``axis name -> number`` (resolved against the plan's axes by name)."""
    if isinstance(value, Mapping):
        if not value or any(not isinstance(k, str) for k in value):
            raise ValueError(f"{name} must map axis names to positive numbers, got {dict(value)!r}")
        return {k: check_float(v, f"{name}[{k!r}]") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        if not value:
            raise ValueError(f"{name} must be a positive number or one per axis, got {value!r}")
        return tuple(check_float(v, f"{name}[{i}]") for i, v in enumerate(value))
    return check_float(value, name)


def _floats(value: Any, name: str) -> tuple[float, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or not value:
        raise ValueError(
            f"{name} must be a non-empty sequence of positive numbers (one per rotary pair), got {value!r}"
        )
    return tuple(check_float(v, f"{name}[{i}]") for i, v in enumerate(value))


@dataclass(frozen=True)
class RopeScaling:
    """One scaling rule and its numbers; validated here, applied by :func:`scale_plan`.

    Args:
        rule: one of :data:`RULES` (see the module table).
        factor: the scale ``s`` (target / original length): a number (every axis), one per axis of the plan in
            its order, or a mapping ``axis name -> number`` (``{"h": 2, "w": 2}``: any plan reading ``h`` and
            ``w``, whatever its axis order). Required for every rule but ``ref-shape``, which reads the scale off
            the coordinates.
        original_size: ``L0``, the training length (text) or grid side (images) per axis, given as ``factor``;
            required for ``dynamic``, ``ntk-by-parts``, ``yarn``, ``llama3``, ``longrope``, ``ref-shape``.
        beta_fast, beta_slow: YaRN's rotation bounds (32, 1); ``ntk-by-parts`` and ``yarn`` only.
        truncate: round YaRN's correction range outwards to whole pairs (Hugging Face's default).
        mscale, mscale_all_dim: DeepSeek's YaRN attention factor
            ``(0.1 mscale ln s + 1) / (0.1 mscale_all_dim ln s + 1)``; ``yarn`` only.
        attention_factor: the factor ``cos`` / ``sin`` are multiplied by, overriding the rule's
            default; ``yarn`` and ``longrope`` only.
        low_freq_factor, high_freq_factor: Llama 3.1's wavelength bounds (1, 4); ``llama3`` only.
        short_factor, long_factor: LongRoPE's per-pair divisors, one per rotary pair of the plan
            in pair order; ``longrope`` only (both required).
        ramp: ``ntk-by-parts`` / ``yarn``: ``"index"`` (the reference implementation and Hugging Face: linear
            in the pair index between the correction dimensions, which keeps the fastest pair unscaled
            even when ``L0 < 2 pi beta_slow``) or ``"ratio"`` (the paper's eq. 18: linear in
            ``r = L0 / wavelength`` between ``beta_slow`` and ``beta_fast``, per pair).
    """

    rule: str
    factor: float | tuple[float, ...] | None = None
    original_size: float | tuple[float, ...] | None = None
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True
    mscale: float | None = None
    mscale_all_dim: float | None = None
    attention_factor: float | None = None
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    short_factor: tuple[float, ...] | None = None
    long_factor: tuple[float, ...] | None = None
    ramp: str = "index"

    def __post_init__(self) -> None:
        rule = check_choice(self.rule, "rule", RULES)
        put = object.__setattr__
        if rule == "ref-shape":
            if self.factor is not None:
                raise ValueError(
                    "factor must be None for rule 'ref-shape' (the scale is the current extent / original_size)"
                )
        elif self.factor is None:
            raise ValueError(f"factor is required for rule {rule!r} (the scale, target / original length, per axis)")
        else:
            put(self, "factor", _per_axis(self.factor, "factor"))
        if self.original_size is None:
            if rule in _NEEDS_ORIGINAL:
                raise ValueError(
                    f"original_size is required for rule {rule!r} (the training length or grid side per axis)"
                )
        else:
            put(self, "original_size", _per_axis(self.original_size, "original_size"))
        beta_fast, beta_slow = check_float(self.beta_fast, "beta_fast"), check_float(self.beta_slow, "beta_slow")
        if beta_fast <= beta_slow:
            raise ValueError(f"beta_fast must exceed beta_slow, got beta_fast={beta_fast} and beta_slow={beta_slow}")
        put(self, "beta_fast", beta_fast)
        put(self, "beta_slow", beta_slow)
        check_choice(self.ramp, "ramp", RAMPS)
        if self.ramp != "index" and rule not in ("ntk-by-parts", "yarn"):
            raise ValueError(
                f"ramp applies to rules ntk-by-parts / yarn only, got ramp={self.ramp!r} with rule {rule!r}"
            )
        check_bool(self.truncate, "truncate")
        low, high = (
            check_float(self.low_freq_factor, "low_freq_factor"),
            check_float(self.high_freq_factor, "high_freq_factor"),
        )
        if high <= low:
            raise ValueError(f"high_freq_factor must exceed low_freq_factor, got {high} and {low}")
        put(self, "low_freq_factor", low)
        put(self, "high_freq_factor", high)
        only = {"mscale": ("yarn",), "mscale_all_dim": ("yarn",), "attention_factor": ("yarn", "longrope")}
        for name, rules in only.items():
            value = getattr(self, name)
            if value is not None:
                if rule not in rules:
                    raise ValueError(f"{name} applies to rule {' / '.join(rules)} only, got it with rule {rule!r}")
                put(self, name, check_float(value, name, strict=name != "attention_factor"))
        for name in ("short_factor", "long_factor"):
            value = getattr(self, name)
            if rule == "longrope":
                put(self, name, _floats(value, name))
            elif value is not None:
                raise ValueError(f"{name} applies to rule 'longrope' only, got it with rule {rule!r}")
        if rule == "longrope" and len(self.short_factor) != len(self.long_factor):
            raise ValueError(
                f"short_factor and long_factor must have one entry per rotary pair each, got "
                f"{len(self.short_factor)} and {len(self.long_factor)}"
            )

    # ------------------------------------------------------------------ helpers
    @property
    def dynamic(self) -> bool:
        """``True`` when the frequencies depend on the current length (:data:`DYNAMIC_RULES`)."""
        return self.rule in DYNAMIC_RULES

    def per_axis(self, name: str, axes: Sequence[str]) -> tuple[float, ...]:
        """``factor`` or ``original_size`` with one entry per axis of ``axes`` (a scalar is repeated)."""
        value = getattr(self, name)
        if value is None:
            return (1.0,) * len(axes)
        if isinstance(value, dict):
            missing, extra = [a for a in axes if a not in value], sorted(set(value) - set(axes))
            if missing or extra:
                raise ValueError(
                    f"{name} must name every plan axis {tuple(axes)} and no other, got {value} "
                    f"(missing {missing}, not in the plan {extra})"
                )
            return tuple(value[a] for a in axes)
        if isinstance(value, tuple):
            if len(value) != len(axes):
                raise ValueError(f"{name} must hold one value per plan axis {tuple(axes)}, got {list(value)}")
            return value
        return (value,) * len(axes)

    def to_dict(self) -> dict[str, Any]:
        """The arguments that differ from the defaults, as plain data (tuples as lists): YAML / JSON, a
        checkpoint read with ``weights_only=True``; :meth:`from_dict` rebuilds the rule."""
        kept = {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) != f.default}
        return {k: list(v) if isinstance(v, tuple) else dict(v) if isinstance(v, dict) else v for k, v in kept.items()}

    @classmethod
    def from_dict(cls, value: Mapping[str, Any]) -> RopeScaling:
        """From a mapping of the constructor's arguments (a YAML config); unknown keys are an error."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(value) - names)
        if unknown:
            raise ValueError(f"scaling has unknown keys {unknown}; RopeScaling takes {sorted(names)}")
        return cls(**dict(value))

    @classmethod
    def from_hf(cls, rope_scaling: Mapping[str, Any], max_position_embeddings: int | None = None) -> RopeScaling | None:
        """From a Hugging Face ``rope_scaling`` / ``rope_parameters`` dict (``None`` for ``default``).

        ``max_position_embeddings`` is the config's: ``dynamic`` scales against it (as transformers
        does), ``yarn`` / ``longrope`` derive ``factor`` from it when the dict has none.
        """
        params = dict(rope_scaling)
        rule = params.pop("rope_type", None) or params.pop("type", None) or "default"
        params.pop("type", None)
        for key in ("rope_theta", "partial_rotary_factor", "mrope_section", "mrope_interleaved"):
            params.pop(key, None)  # plan settings, not scaling
        if rule in ("default", "mrope"):
            return None
        if rule == "proportional":
            raise ValueError(
                "rope_type 'proportional' is a plan, not a scaling rule: its first pairs keep the full-head spectrum "
                "and the rest are NoPE (FrequencyPlan.from_assignment with axis -1), under rule 'linear'"
            )
        original = params.pop("original_max_position_embeddings", None)
        if rule == "dynamic":
            original = max_position_embeddings
        if rule in ("yarn", "longrope") and original is None:
            original = max_position_embeddings
        if rule in ("yarn", "longrope") and params.get("factor") is None and max_position_embeddings and original:
            params["factor"] = max_position_embeddings / original
        for key in ("beta_fast", "beta_slow"):
            if key in params and params[key] is None:
                del params[key]
        return cls.from_dict({"rule": rule, "original_size": original, **params})


# ---------------------------------------------------------------------- spectrum of a plan
def _one_hot(weight: Tensor, rule: str) -> Tensor:
    """``(..., A, P)`` bool: where the plan is non-zero; each pair may read one axis only."""
    nonzero = weight != 0
    if (nonzero.sum(-2) > 1).any():
        raise ValueError(
            f"rule {rule!r} rescales each pair by the numbers of the one axis it reads, but this plan mixes axes "
            f"in a pair (RoPE-Mixed's learned plan); only rules {POSITION_RULES} (position rescaling) apply to it"
        )
    return nonzero


def _spectrum(weight: Tensor, spectrum: str, rule: str) -> tuple[Tensor, Tensor, Tensor]:
    """Per entry of ``weight`` ``(..., A, P)``: the pair's index ``k`` in its spectrum, the spectrum's size ``n``
    and ``ln theta`` (float64, same shape; zero where the plan is zero).

    Checks that every spectrum is a RoPE spectrum ``f_k = theta ** (-k / n)`` (``ln theta`` fitted by least
    squares over its pairs); a plan already rescaled, or learned, is refused by the spectral rules.
    """
    nonzero = _one_hot(weight, rule)
    rows = weight.double().reshape(-1, *weight.shape[-2:])  # (R, A, P)
    mask = nonzero.reshape(rows.shape)
    k, n, log_theta = (torch.zeros_like(rows) for _ in range(3))
    pairs = rows.shape[-1]
    for r in range(rows.shape[0]):
        groups = [mask[r, a] for a in range(rows.shape[1])]  # "axis": the pairs reading axis a
        if spectrum == "shared":
            groups = [mask[r].any(0)]
        for group in groups:
            if spectrum == "shared":
                idx, count = torch.arange(pairs, dtype=torch.float64), float(pairs)
            else:
                idx, count = group.cumsum(0).double() - 1, float(group.sum())
            if not group.any():
                continue
            freq = rows[r].sum(0)[group]
            kk = idx[group]
            if kk.max() == 0:
                raise ValueError(
                    f"rule {rule!r} needs at least 2 pairs per spectrum to know its base; a {spectrum!r} spectrum of "
                    f"this plan has 1"
                )
            if (freq <= 0).any():
                raise ValueError(f"rule {rule!r} needs positive pair frequencies, got {freq.min().item()}")
            lt = float(-count * (kk * freq.log()).sum() / (kk * kk).sum())  # least squares: ln f = -k ln theta / n
            err = (freq.log() + kk * lt / count).abs().max().item()
            if not lt > 0 or err > 1e-4:
                raise ValueError(
                    f"rule {rule!r} needs each {spectrum!r} spectrum of the plan to be a RoPE spectrum "
                    f"theta ** (-k / n) (a plan already rescaled or learned is not); the pair frequencies are off "
                    f"by {err:.2g} in log"
                )
            for a in range(rows.shape[1]):
                sel = group & mask[r, a]
                k[r, a, sel], n[r, a, sel], log_theta[r, a, sel] = idx[sel], count, lt
    return k.reshape(weight.shape), n.reshape(weight.shape), log_theta.reshape(weight.shape)


def _axis_column(values: Sequence[float], weight: Tensor, dtype: torch.dtype = torch.float64) -> Tensor:
    """``(A, 1)`` per-axis numbers that broadcast against ``(..., A, P)``."""
    return torch.tensor(values, dtype=dtype, device=weight.device).view(-1, 1)


def _rebuilt(plan: FrequencyPlan, weight: Tensor) -> FrequencyPlan:
    return FrequencyPlan(weight.to(plan.weight.dtype), plan.axes, plan.head_dim, plan.convention)


# ---------------------------------------------------------------------- the rules (pure functions of a plan)
def position_interpolation(plan: FrequencyPlan, factor: float | Sequence[float]) -> FrequencyPlan:
    """PI (Chen et al. 2023, https://arxiv.org/abs/2306.15595): positions on axis ``a`` divided by ``factor[a]``.

    Any plan, dense ones included: ``weight[..., a, :] / factor[a]`` (Hugging Face ``linear``: ``inv_freq /= factor``).
    """
    s = RopeScaling("linear", factor).per_axis("factor", plan.axes)
    w = plan.weight.clone()
    for a, sa in enumerate(s):
        w[..., a, :] = plan.weight[..., a, :] / sa
    return _rebuilt(plan, w)


def _exponent_scaled(plan: FrequencyPlan, s: Sequence[float], spectrum: str, rule: str, minus_one: bool) -> Tensor:
    k, n, _ = _spectrum(plan.weight, spectrum, rule)
    denom = (n - 1) if minus_one else n
    exponent = torch.where(denom > 0, k / denom.clamp_min(1), torch.zeros_like(k))
    return plan.weight.double() * _axis_column(s, plan.weight) ** (-exponent)


def ntk_aware(plan: FrequencyPlan, factor: float | Sequence[float], spectrum: str = "axis") -> FrequencyPlan:
    """NTK-aware scaling (bloc97, 2023): base ``theta * s ** (n / (n - 1))`` per spectrum of ``n`` pairs.

    Pair ``k`` is divided by ``s ** (k / (n - 1))``: the first (fastest) pair is kept, the last one is
    interpolated by ``s``. Hugging Face's ``dynamic`` at one length is this rule at ``s' = s L / L0 - (s - 1)``.
    """
    s = RopeScaling("ntk", factor).per_axis("factor", plan.axes)
    return _rebuilt(plan, _exponent_scaled(plan, s, check_choice(spectrum, "spectrum", SPECTRA), "ntk", True))


def theta_scaling(plan: FrequencyPlan, factor: float | Sequence[float], spectrum: str = "axis") -> FrequencyPlan:
    """Base ``theta * factor`` per axis (``f * factor ** (-k / n)``): CineScale's and Wan's ``ntk_alpha``.

    Reference: Eyeline-Labs/CineScale ``diffsynth/models/wan_video_dit.py`` (``precompute_freqs_cis_ntk``:
    ``theta = theta * ntk_factor``; ``set_ntk([1, 20, 20])`` for ``(t, h, w)``).
    """
    s = RopeScaling("theta", factor).per_axis("factor", plan.axes)
    return _rebuilt(plan, _exponent_scaled(plan, s, check_choice(spectrum, "spectrum", SPECTRA), "theta", False))


def dynamic_ntk(
    plan: FrequencyPlan,
    factor: float | Sequence[float],
    original_size: float | Sequence[float],
    length: float | Sequence[float],
    spectrum: str = "axis",
) -> FrequencyPlan:
    """Dynamic NTK (emozilla, 2023; Hugging Face ``dynamic``) at the current ``length`` per axis.

    ``s' = s * max(L, L0) / L0 - (s - 1)`` and then :func:`ntk_aware` with ``s'``: the plan is unchanged up to
    ``L0``. Encoders evaluate the same formula on the device at every call (:class:`PlanRescale`).
    """
    scaling = RopeScaling("dynamic", factor, original_size)
    table = _dynamic_table(plan, scaling, check_choice(spectrum, "spectrum", SPECTRA))
    lengths = _lengths(length, plan.axes, plan.weight)
    return _rebuilt(plan, _dynamic_weight(plan.weight, table, lengths, "dynamic", _base_exponent(table, plan.weight)))


def _ramp(
    k: Tensor,
    n: Tensor,
    log_theta: Tensor,
    s: Tensor,
    original: Tensor,
    beta_fast: float,
    beta_slow: float,
    truncate: bool,
) -> Tensor:
    """YaRN's ``1 - ramp``: 1 where a pair is extrapolated (kept), 0 where interpolated, per entry."""
    out = torch.ones_like(k)
    for key in {
        (float(a), float(b), float(c))
        for a, b, c in zip(n.flatten(), log_theta.flatten(), original.expand_as(n).flatten())
        if a > 0
    }:
        count, lt, l0 = key
        low = count * math.log(l0 / (beta_fast * 2 * math.pi)) / lt  # Hugging Face's find_correction_dim, dim = 2 n
        high = count * math.log(l0 / (beta_slow * 2 * math.pi)) / lt
        if truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, 2 * count - 1)
        if low == high:
            high += 0.001  # as the reference: no zero-width ramp
        sel = (n == count) & (log_theta == lt) & (original.expand_as(n) == l0)
        ramp = ((k[sel].float() - low) / (high - low)).clamp(0, 1)  # float32, as Hugging Face
        out[sel] = (1 - ramp).double()
    return out


def ntk_by_parts(
    plan: FrequencyPlan,
    factor: float | Sequence[float],
    original_size: float | Sequence[float],
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
    truncate: bool = True,
    spectrum: str = "axis",
    ramp: str = "index",
) -> FrequencyPlan:
    """NTK-by-parts (Peng et al. 2023, YaRN, https://arxiv.org/abs/2309.00071, sec. 3.2), per axis.

    Pairs that turn fewer than ``beta_slow`` times over ``L0`` are interpolated (``f / s``), pairs that turn
    more than ``beta_fast`` times are kept, with a linear ramp over the pair index between. YaRN without
    its attention factor. ``ramp="ratio"``: the paper's ramp in ``r = L0 / wavelength`` (:class:`RopeScaling`).
    """
    scaling = RopeScaling("ntk-by-parts", factor, original_size, beta_fast, beta_slow, truncate, ramp=ramp)
    return _rebuilt(plan, _by_parts_weight(plan, scaling, check_choice(spectrum, "spectrum", SPECTRA)))


def _by_parts_weight(plan: FrequencyPlan, scaling: RopeScaling, spectrum: str) -> Tensor:
    s = _axis_column(scaling.per_axis("factor", plan.axes), plan.weight)
    l0 = _axis_column(scaling.per_axis("original_size", plan.axes), plan.weight)
    if scaling.ramp == "ratio":  # the paper's gamma(r), r = L0 / wavelength = L0 f / (2 pi), per pair
        _one_hot(plan.weight, scaling.rule)
        r = l0 * plan.weight.double() / (2 * math.pi)
        keep = ((r - scaling.beta_slow) / (scaling.beta_fast - scaling.beta_slow)).clamp(0, 1).float()
    else:
        k, n, log_theta = _spectrum(plan.weight, spectrum, scaling.rule)
        keep = _ramp(k, n, log_theta, s, l0, scaling.beta_fast, scaling.beta_slow, scaling.truncate).float()
    f = plan.weight.float()
    return (f / s.float()) * (1 - keep) + f * keep  # Hugging Face's order of operations


def yarn_attention_factor(scaling: RopeScaling, axes: Sequence[str]) -> float:
    """YaRN's ``cos`` / ``sin`` factor ``0.1 ln s + 1`` (``sqrt(1 / t)`` of the paper, eq. 22), from the largest
    per-axis factor; DeepSeek's ``mscale`` / ``mscale_all_dim`` ratio when both are set."""
    if scaling.attention_factor is not None:
        return scaling.attention_factor
    s = max(scaling.per_axis("factor", axes))

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if scaling.mscale and scaling.mscale_all_dim:
        return float(mscale(s, scaling.mscale) / mscale(s, scaling.mscale_all_dim))
    return mscale(s)


def yarn(
    plan: FrequencyPlan,
    factor: float | Sequence[float],
    original_size: float | Sequence[float],
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
    truncate: bool = True,
    mscale: float | None = None,
    mscale_all_dim: float | None = None,
    attention_factor: float | None = None,
    spectrum: str = "axis",
    ramp: str = "index",
) -> tuple[FrequencyPlan, float]:
    """YaRN (Peng et al. 2023, https://arxiv.org/abs/2309.00071): :func:`ntk_by_parts` and the attention factor.

    Returns the plan and the factor ``cos`` / ``sin`` are multiplied by (:func:`yarn_attention_factor`).
    """
    scaling = RopeScaling(
        "yarn",
        factor,
        original_size,
        beta_fast,
        beta_slow,
        truncate,
        mscale,
        mscale_all_dim,
        attention_factor,
        ramp=ramp,
    )
    weight = _by_parts_weight(plan, scaling, check_choice(spectrum, "spectrum", SPECTRA))
    return _rebuilt(plan, weight), yarn_attention_factor(scaling, plan.axes)


def llama3(
    plan: FrequencyPlan,
    factor: float | Sequence[float],
    original_size: float | Sequence[float],
    low_freq_factor: float = 1.0,
    high_freq_factor: float = 4.0,
) -> FrequencyPlan:
    """Llama 3.1 scaling (Meta, ``meta-llama/llama-models`` ``apply_scaling``; Hugging Face ``llama3``), per axis.

    Wavelengths ``2 pi / f`` above ``L0 / low_freq_factor`` are interpolated by ``s``, those below
    ``L0 / high_freq_factor`` kept, and between them ``f`` is blended with ``(L0 / wavelength - low) / (high - low)``.
    Needs no spectrum: each pair is read by its own wavelength.
    """
    scaling = RopeScaling(
        "llama3", factor, original_size, low_freq_factor=low_freq_factor, high_freq_factor=high_freq_factor
    )
    _one_hot(plan.weight, "llama3")
    w = plan.weight.clone()
    for a, (s, l0) in enumerate(
        zip(scaling.per_axis("factor", plan.axes), scaling.per_axis("original_size", plan.axes))
    ):
        f = plan.weight[..., a, :]
        low_wavelen, high_wavelen = l0 / low_freq_factor, l0 / high_freq_factor
        wavelen = 2 * math.pi / f
        scaled = torch.where(wavelen > low_wavelen, f / s, f)
        smooth = (l0 / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
        smoothed = (1 - smooth) * scaled / s + smooth * scaled
        medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
        w[..., a, :] = torch.where(medium, smoothed, scaled)
    return _rebuilt(plan, w)


def _longrope_attention(scaling: RopeScaling, axes: Sequence[str]) -> float:
    if scaling.attention_factor is not None:
        return scaling.attention_factor
    factors = scaling.per_axis("factor", axes)
    a = max(range(len(axes)), key=lambda i: factors[i])
    s, l0 = factors[a], scaling.per_axis("original_size", axes)[a]
    return 1.0 if s <= 1.0 else math.sqrt(1 + math.log(s) / math.log(l0))


def longrope(
    plan: FrequencyPlan,
    short_factor: Sequence[float],
    long_factor: Sequence[float],
    original_size: float | Sequence[float],
    factor: float | Sequence[float],
    length: float | Sequence[float] | None = None,
    attention_factor: float | None = None,
) -> tuple[FrequencyPlan, float]:
    """LongRoPE (Ding et al. 2024, https://arxiv.org/abs/2402.13753; Hugging Face ``longrope``, Phi-3).

    Pair ``p`` is divided by ``short_factor[p]`` while the length of its axis is at most ``L0`` and by
    ``long_factor[p]`` beyond (``length=None``: the short factors). The attention factor is
    ``sqrt(1 + ln s / ln L0)`` (1 for ``s <= 1``).
    """
    scaling = RopeScaling(
        "longrope",
        factor,
        original_size,
        attention_factor=attention_factor,
        short_factor=short_factor,
        long_factor=long_factor,
    )
    table = _dynamic_table(plan, scaling, "axis")
    lengths = _axis_column(scaling.per_axis("original_size", plan.axes), plan.weight, torch.float32).view(-1)
    if length is not None:
        lengths = _lengths(length, plan.axes, plan.weight)
    weight = _dynamic_weight(plan.weight, table, lengths, "longrope")
    return _rebuilt(plan, weight), _longrope_attention(scaling, plan.axes)


def reference_shape(
    plan: FrequencyPlan, original_size: float | Sequence[float], size: float | Sequence[float]
) -> FrequencyPlan:
    """timm's ``ref_feat_shape`` (EVA-02): positions ``x * ref / size`` per axis, so a grid of ``size`` spans the
    reference (pretraining) grid ``original_size``. Reference: timm ``layers/pos_embed_sincos.py``
    (``_build_grid``: ``t = [x / f * r for x, f, r in zip(t, feat_shape, ref_feat_shape)]``)."""
    scaling = RopeScaling("ref-shape", original_size=original_size)
    table = _dynamic_table(plan, scaling, "axis")
    return _rebuilt(plan, _dynamic_weight(plan.weight, table, _lengths(size, plan.axes, plan.weight), "ref-shape"))


# ---------------------------------------------------------------------- dynamic rules: tables and the in-graph formula
def _lengths(length: float | Sequence[float], axes: Sequence[str], weight: Tensor) -> Tensor:
    """``(A,)`` float32 current lengths: a positive number per axis (a scalar is repeated)."""
    values = _per_axis(tuple(length) if isinstance(length, Sequence) else length, "length")
    values = values if isinstance(values, tuple) else (values,) * len(axes)
    if len(values) != len(axes):
        raise ValueError(f"length must hold one value per plan axis {tuple(axes)}, got {list(values)}")
    return torch.tensor(values, dtype=torch.float32, device=weight.device)


def _dynamic_table(plan: FrequencyPlan, scaling: RopeScaling, spectrum: str) -> Tensor:
    """``(R, ..., A, P)`` float32: row 0 ``s`` and row 1 ``L0`` per axis (broadcast over the pairs), then the
    rule's per-pair numbers (``dynamic``: the NTK exponent ``k / (n - 1)``, the spectrum's ``theta``, ``k / n``
    and ``n`` in rows 2-5; ``longrope``: short and long factors in rows 2 and 3)."""
    w = plan.weight
    s = _axis_column(scaling.per_axis("factor", plan.axes), w, torch.float32).expand(w.shape)
    l0 = _axis_column(scaling.per_axis("original_size", plan.axes), w, torch.float32).expand(w.shape)
    if scaling.rule == "dynamic":
        k, n, log_theta = _spectrum(w, spectrum, "dynamic")
        k_over_n = torch.where(n > 0, (2 * k).float() / (2 * n).float().clamp_min(1), torch.zeros_like(k).float())
        extra = [
            torch.where(n > 1, k / (n - 1).clamp_min(1), torch.zeros_like(k)).float(),
            _float32_base(w, k_over_n, log_theta, spectrum),
            k_over_n,
            n.float(),
        ]
    elif scaling.rule == "longrope":
        _one_hot(w, "longrope")
        if len(scaling.short_factor) != plan.pairs:
            raise ValueError(
                f"short_factor and long_factor must hold one divisor per rotary pair ({plan.pairs}), got "
                f"{len(scaling.short_factor)}"
            )
        extra = [
            torch.tensor(f, dtype=torch.float32, device=w.device).expand(w.shape)
            for f in (scaling.short_factor, scaling.long_factor)
        ]
    elif scaling.rule == "ref-shape":
        extra = []
    else:
        raise ValueError(f"rule {scaling.rule!r} is not dynamic")
    return torch.stack([s, l0, *extra]).contiguous()


def _float32_base(weight: Tensor, k_over_n: Tensor, log_theta: Tensor, spectrum: str) -> Tensor:
    """``(..., A, P)`` float32: each axis row's ``theta`` (0 for an axis without pairs), broadcast over the pairs.

    The least-squares ``theta`` of :func:`_spectrum` is snapped to the float32 number (within 8 ulps) whose spectrum
    ``1 / theta ** (k / n)`` is the plan's float32 weight bit for bit (a plan built from a float32 ``theta``, as
    mmpos and Hugging Face build them), the shortest decimal among several; else the fit rounded to float32."""
    base = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
    heads = weight.reshape(-1, *weight.shape[-2:])  # (R, A, P)
    flat_base, flat_kn, flat_lt = (t.reshape(heads.shape) for t in (base, k_over_n, log_theta))
    for r in range(heads.shape[0]):
        # a spectrum: every axis row of the head ("shared", one-hot: their sum is the 1-D spectrum), or one row
        groups = [list(range(heads.shape[1]))] if spectrum == "shared" else [[a] for a in range(heads.shape[1])]
        for group in groups:
            row, kn = heads[r, group].sum(0), flat_kn[r, group].sum(0)  # (P,)
            sel = row != 0
            if not sel.any():
                continue
            fit = torch.tensor(math.exp(float(flat_lt[r, group][:, sel].max())), dtype=torch.float32)
            candidates = [fit]
            for direction in (math.inf, -math.inf):
                step = fit
                for _ in range(8):
                    step = torch.nextafter(step, torch.tensor(direction, dtype=torch.float32))
                    candidates.append(step)
            # the whole row at once: pow takes another path on a shorter tensor
            exact = [float(c) for c in candidates if torch.equal((1.0 / (float(c) ** kn))[sel], row[sel].float())]
            chosen = min(exact, key=lambda c: len(repr(c))) if exact else float(fit)
            flat_base[r, group] = chosen
    return base


def _base_exponent(table: Tensor, weight: Tensor) -> float | None:
    """``n / (n - 1)`` when every spectrum of a ``dynamic`` table has the same size ``n`` (1-D RoPE, the M-RoPE
    family, axial RoPE with as many pairs per axis), else ``None``; read on the host, outside ``forward``."""
    sizes = table[5][(weight != 0).expand_as(table[5])].unique().tolist()
    return sizes[0] / (sizes[0] - 1) if len(sizes) == 1 and sizes[0] > 1 else None


def _dynamic_weight(
    weight: Tensor, table: Tensor, lengths: Tensor, rule: str, base_exponent: float | None = None
) -> Tensor:
    """The rescaled ``weight`` ``(..., A, P)`` at the current ``lengths`` ``(A,)``: tensor operations only.

    ``dynamic`` with one spectrum size (``base_exponent`` ``n / (n - 1)``, :func:`_base_exponent`) recomputes the
    frequencies as Hugging Face does, ``1 / (theta * s' ** (n / (n - 1))) ** (k / n)`` in float32 with the exponent
    a Python float (bit-equal to its ``dynamic`` inv_freq); otherwise the plan is multiplied by
    ``s' ** (-k / (n - 1))`` (the same number to float32 rounding). Up to ``L0`` the plan itself."""
    length = lengths.to(table.dtype).view(-1, 1)  # (A, 1)
    s, l0 = table[0], table[1]
    if rule == "dynamic":
        grown = torch.where(length > l0, s * length / l0 - (s - 1), torch.ones_like(s))  # exactly 1 up to L0
        if base_exponent is None:
            return weight * grown ** (-table[2])
        s1, l1, theta = table[0][..., :1], table[1][..., :1], table[3][..., :1]  # (..., A, 1) per axis
        grown = torch.where(length > l1, s1 * length / l1 - (s1 - 1), torch.ones_like(s1))
        scaled = 1.0 / (theta * grown**base_exponent) ** table[4]  # (..., A, P); inf where the plan is 0
        return torch.where((length > l0) & (weight != 0), scaled.to(weight.dtype), weight)
    if rule == "longrope":
        return weight / torch.where(length > l0, table[3], table[2])
    return weight * (l0 / length)  # ref-shape


class PlanRescale(nn.Module):
    """What an encoder keeps of a scaling rule that must act in ``forward``: ``forward(weight, pos) -> weight``.

    For a dynamic rule (:data:`DYNAMIC_RULES`) the per-axis and per-pair numbers are one float32 buffer
    ``table`` and the rescaled weight is computed from the current lengths ``max(pos) + 1`` on the device; for a
    position rule on a learned plan (RoPE-Mixed) ``table`` is the ``(A, 1)`` divisor of every axis row, applied
    to the parameter in ``forward`` so that gradients reach it. ``base_exponent``: ``dynamic``'s ``n / (n - 1)``
    when every spectrum has ``n`` pairs (the frequencies are then recomputed in Hugging Face's order of operations).
    Built by :func:`build_scaling`.
    """

    def __init__(self, rule: str, table: Tensor, base_exponent: float | None = None) -> None:
        super().__init__()
        self.rule = rule
        self.base_exponent = base_exponent
        self.register_buffer("table", table, persistent=False)

    def _apply(self, fn, recurse=True):
        # keep the table in float32 under ``model.to(torch.bfloat16)``: it only moves
        table = self._buffers["table"]
        super()._apply(fn, recurse)
        if self._buffers["table"].dtype != table.dtype:
            self._buffers["table"] = table.to(self._buffers["table"].device)
        return self

    def forward(self, weight: Tensor, pos: Tensor) -> Tensor:
        """``weight`` ``(..., A, P)``, ``pos`` ``(B, N, A)`` the positions the plan reads."""
        if self.rule not in DYNAMIC_RULES:  # a position rule on a learned plan
            return weight / self.table
        lengths = pos.detach().to(self.table.dtype).amax(dim=(0, 1)) + 1  # (A,) on the device: no host sync
        return _dynamic_weight(weight, self.table, lengths, self.rule, self.base_exponent)

    def extra_repr(self) -> str:
        return f"rule={self.rule!r}"


# ---------------------------------------------------------------------- one entry point
def scale_plan(
    plan: FrequencyPlan,
    scaling: RopeScaling,
    spectrum: str = "axis",
    length: float | Sequence[float] | None = None,
) -> tuple[FrequencyPlan, float]:
    """Apply ``scaling`` to ``plan``; returns the new plan and its attention factor (1 for most rules).

    ``spectrum``: ``"axis"`` or ``"shared"`` (module docstring). ``length``: the current length per axis for
    a dynamic rule (default ``original_size``: ``dynamic`` gives the plan unchanged, ``longrope`` the short
    factors); ``ref-shape`` needs it. Static rules take no ``length``.
    """
    if not isinstance(scaling, RopeScaling):
        raise TypeError(f"scaling must be a RopeScaling, got {type(scaling).__name__}")
    spectrum = check_choice(spectrum, "spectrum", SPECTRA)
    rule = scaling.rule
    if length is not None and rule not in DYNAMIC_RULES:
        raise ValueError(f"length applies to the dynamic rules {DYNAMIC_RULES} only, got it with rule {rule!r}")
    if rule == "linear":
        return position_interpolation(plan, scaling.factor), 1.0
    if rule == "ntk":
        return ntk_aware(plan, scaling.factor, spectrum), 1.0
    if rule == "theta":
        return theta_scaling(plan, scaling.factor, spectrum), 1.0
    if rule == "ntk-by-parts":
        return _rebuilt(plan, _by_parts_weight(plan, scaling, spectrum)), 1.0
    if rule == "yarn":
        return _rebuilt(plan, _by_parts_weight(plan, scaling, spectrum)), yarn_attention_factor(scaling, plan.axes)
    if rule == "llama3":
        return (
            llama3(plan, scaling.factor, scaling.original_size, scaling.low_freq_factor, scaling.high_freq_factor),
            1.0,
        )
    if rule == "ref-shape" and length is None:
        raise ValueError("rule 'ref-shape' needs the current size (length=) to give a plan")
    table = _dynamic_table(plan, scaling, spectrum)
    lengths = _lengths(
        scaling.per_axis("original_size", plan.axes) if length is None else length, plan.axes, plan.weight
    )
    exponent = _base_exponent(table, plan.weight) if rule == "dynamic" else None
    weight = _dynamic_weight(plan.weight, table, lengths, rule, exponent)
    factor = _longrope_attention(scaling, plan.axes) if rule == "longrope" else 1.0
    return _rebuilt(plan, weight), factor


def as_scaling(value: RopeScaling | Mapping[str, Any] | None) -> RopeScaling | None:
    """A :class:`RopeScaling` from itself, a mapping of its arguments (YAML), or ``None``."""
    if value is None or isinstance(value, RopeScaling):
        return value
    if isinstance(value, Mapping):
        return RopeScaling.from_dict(value)
    raise TypeError(f"scaling must be a RopeScaling, a mapping of its arguments or None, got {type(value).__name__}")


def build_scaling(
    plan: FrequencyPlan,
    scaling: RopeScaling | Mapping[str, Any] | None,
    spectrum: str = "axis",
    learnable: bool = False,
) -> tuple[FrequencyPlan, float, PlanRescale | None]:
    """What a rotary encoder stores: ``(plan, attention_factor, rescale)``.

    A static rule on a fixed plan is folded into the returned plan (``rescale`` is ``None``: nothing happens in
    ``forward``). A dynamic rule returns the unscaled plan and a :class:`PlanRescale` evaluated in ``forward``.
    On a learned plan (``learnable``, RoPE-Mixed) only position rules are defined (``linear``, ``ref-shape``):
    the learned frequencies are no RoPE spectrum for the spectral rules to act on.
    """
    scaling = as_scaling(scaling)
    if scaling is None:
        return plan, 1.0, None
    spectrum = check_choice(spectrum, "spectrum", SPECTRA)
    if learnable and scaling.rule not in POSITION_RULES:
        raise ValueError(
            f"rule {scaling.rule!r} rescales a RoPE spectrum, but this encoder learns its frequencies (RoPE-Mixed); "
            f"only the position rules {POSITION_RULES} are defined for a learned plan"
        )
    if scaling.dynamic:
        _, factor = scale_plan(plan, scaling, spectrum, scaling.per_axis("original_size", plan.axes))
        table = _dynamic_table(plan, scaling, spectrum)
        exponent = _base_exponent(table, plan.weight) if scaling.rule == "dynamic" else None
        return plan, factor, PlanRescale(scaling.rule, table, exponent)
    if learnable:  # linear on a learned plan: divide in forward, keep the parameter as it is
        divisor = _axis_column(scaling.per_axis("factor", plan.axes), plan.weight, torch.float32)
        return plan, 1.0, PlanRescale("linear", divisor)
    new, factor = scale_plan(plan, scaling, spectrum)
    return new, factor, None


def rescaled_weight(weight: Tensor, rescale: PlanRescale | None, coords: Coords, axes: tuple[str, ...]) -> Tensor:
    """``weight`` after ``rescale`` at ``coords`` (the positions of ``axes``); ``weight`` itself without one."""
    if rescale is None:
        return weight
    pos = coords.pos if coords.axes == axes else coords.select(*axes).pos
    return rescale(weight, pos)


# ---------------------------------------------------------------------- the published 2-D rules, as presets
def resolution_interpolation(train_grid: Sequence[int], test_grid: Sequence[int]) -> RopeScaling:
    """Position interpolation per axis from the training to the test grid (``factor = test / train``).

    The resolution interpolation that RoPE-ViT (Heo et al. 2024, https://arxiv.org/abs/2403.13298) contrasts
    with plain extrapolation (``scaling=None``, its default for multi-resolution inference): the test grid's
    positions are squeezed onto the training extent, as PI does for text (Chen et al. 2023).
    """
    train, test = _grid(train_grid, "train_grid"), _grid(test_grid, "test_grid")
    if len(train) != len(test):
        raise ValueError(f"train_grid and test_grid must have the same axes, got {list(train)} and {list(test)}")
    return RopeScaling("linear", tuple(t / r for t, r in zip(test, train)), train)


def grid_scaling(
    rule: str,
    train_grid: Sequence[int],
    target_grid: Sequence[int] | None = None,
    axes: Sequence[str] = ("h", "w"),
    **numbers: Any,
) -> RopeScaling:
    """``rule`` for a model trained on ``train_grid`` and run on ``target_grid`` ("train at 14x14, run at 28x28").

    ``factor = target / train`` and ``original_size = train`` per named axis (``axes``: the names of the grid's
    sides, ``("h", "w")`` for images), as axis-name mappings, so the rule fits any plan that reads those axes,
    whatever its axis order. ``ref-shape`` takes no factor (it reads the current size; ``target_grid`` must then
    be ``None``); ``numbers``: the rule's other arguments (``beta_fast``, ``ramp``, ...; :class:`RopeScaling`).
    ``grid_scaling("linear", train, test)`` is :func:`resolution_interpolation` by axis name.
    """
    check_choice(rule, "rule", RULES)
    train = _grid(train_grid, "train_grid")
    if isinstance(axes, str) or not isinstance(axes, Sequence) or len(set(axes)) != len(axes):
        raise ValueError(f"axes must be a sequence of distinct axis names, got {axes!r}")
    if len(axes) != len(train):
        raise ValueError(f"train_grid must hold one side per axis {tuple(axes)}, got {list(train)}")
    original = dict(zip(axes, train))
    if rule == "ref-shape":
        if target_grid is not None:
            raise ValueError("target_grid must be None for rule 'ref-shape' (it reads the current grid at every call)")
        return RopeScaling(rule, original_size=original, **numbers)
    if target_grid is None:
        raise ValueError(f"target_grid is required for rule {rule!r} (its factor is target_grid / train_grid)")
    target = _grid(target_grid, "target_grid")
    if len(target) != len(train):
        raise ValueError(f"train_grid and target_grid must have the same axes, got {list(train)} and {list(target)}")
    factor = {a: t / r for a, t, r in zip(axes, target, train)}
    return RopeScaling(rule, factor, original, **numbers)


def timm_ref_feat_shape(ref_feat_shape: Sequence[int]) -> RopeScaling:
    """timm's ``ref_feat_shape`` rescaling (EVA-02; timm ``layers/pos_embed_sincos.py``, ``_build_grid``).

    Every grid is mapped onto the reference (pretraining) grid, larger and smaller ones alike: positions
    ``x * ref / size``, with ``size`` read off the coordinates at every call (rule ``ref-shape``).
    """
    return RopeScaling("ref-shape", original_size=_grid(ref_feat_shape, "ref_feat_shape"))


def cinescale_ntk(ntk_alpha: Sequence[float] = (1.0, 20.0, 20.0)) -> RopeScaling:
    """Per-axis NTK of CineScale (Qiu et al. 2025) on Wan video models: base ``theta * alpha`` per ``(t, h, w)``.

    Reference: Eyeline-Labs/CineScale ``diffsynth/models/wan_video_dit.py`` (``set_ntk([1.0, 20.0, 20.0])``,
    ``precompute_freqs_cis_ntk``); rule ``theta``. The authors report that tuning-free generation at higher
    resolution works better with this large spatial alpha than with the theoretical NTK value
    (CineScale issue #7).
    """
    return RopeScaling("theta", _per_axis(tuple(ntk_alpha), "ntk_alpha"))


def _grid(value: Any, name: str) -> tuple[float, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or not value:
        raise ValueError(f"{name} must be a sequence of positive grid sides, got {value!r}")
    return tuple(check_float(v, f"{name}[{i}]") for i, v in enumerate(value))
