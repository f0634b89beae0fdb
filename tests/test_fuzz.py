"""Fuzz suite (hypothesis): bad or borderline input gives a clear error or a finite, valid result.

Property, for coordinates builders and for every registered encoder (``mmpos.list_encoders()``):
either a ``ValueError`` / ``TypeError`` whose message names the argument, or a result that is
finite and satisfies the documented invariants (shapes; rotary encoders preserve norms; prefix
rows of additive encoders are zero) -- never a non-finite value, never another exception type
(``RuntimeError``, ``ZeroDivisionError``, ``IndexError``... from torch or numpy).

Deterministic (``derandomize=True``) with fixed ``max_examples``; the counts of inputs tried,
clear errors and valid results are printed at the end of the module (``pytest -s``) and
recorded in ``docs/reliability.md``.
"""

from __future__ import annotations

import inspect
import math
from collections import Counter

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mmpos
from mmpos import Coords

FUZZ = settings(
    max_examples=100,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
COUNTS: Counter = Counter()


@pytest.fixture(scope="module", autouse=True)
def _report():
    yield
    print(
        f"\nfuzz: {COUNTS['tried']} inputs tried, {COUNTS['clear']} clear errors, {COUNTS['valid']} valid results, "
        f"{COUNTS['silent']} silent wrong results (each one fails its test)"
    )


def _classify(fn, names: list[str]):
    """Run ``fn``; a clear error must be ValueError/TypeError naming one of ``names``. Returns the result or None."""
    COUNTS["tried"] += 1
    try:
        out = fn()
    except (ValueError, TypeError) as e:
        msg = str(e)
        assert any(n in msg for n in names), f"{type(e).__name__} does not name one of {names}: {msg}"
        COUNTS["clear"] += 1
        return None
    return out


# ---------------------------------------------------------------------------- coordinates

BAD_SCALARS = [0, -1, 2.5, 3.0, math.nan, math.inf, -math.inf, True, None, "4", (), (2,)]
size = st.one_of(st.integers(-2, 9), st.sampled_from(BAD_SCALARS))


@FUZZ
@given(
    sizes=st.lists(size, min_size=0, max_size=4),
    prefix=st.one_of(st.integers(-1, 3), st.sampled_from(BAD_SCALARS)),
    batch=st.one_of(st.integers(0, 3), st.sampled_from(BAD_SCALARS)),
)
def test_grid_builder(sizes, prefix, batch):
    c = _classify(
        lambda: Coords.grid(*sizes, num_prefix_tokens=prefix, batch=batch), ["sizes", "prefix", "batch", "axes"]
    )
    if c is None:
        return
    assert c.num_tokens == prefix + math.prod(sizes) and c.batch_size == batch and c.grid_shape == tuple(sizes)
    assert torch.isfinite(c.pos).all() and (c.pos[:, :prefix] == 0).all()
    for a, s in enumerate(sizes):  # row-major integer indices in [0, size)
        assert c.pos[..., prefix:, a].min() >= 0 and c.pos[..., prefix:, a].max() <= s - 1
    COUNTS["valid"] += 1


@FUZZ
@given(sizes=st.lists(st.integers(50_000, 10**7), min_size=2, max_size=3))
def test_huge_grid_is_refused_before_allocating(sizes):
    COUNTS["tried"] += 1
    with pytest.raises(ValueError, match="sizes"):
        Coords.grid(*sizes)
    COUNTS["clear"] += 1


@FUZZ
@given(
    n=st.one_of(st.integers(-1, 12), st.sampled_from(BAD_SCALARS)),
    start=st.one_of(st.floats(allow_nan=True, allow_infinity=True, width=32), st.sampled_from(BAD_SCALARS)),
)
def test_sequence_builder(n, start):
    c = _classify(lambda: Coords.sequence(n, start=start), ["n", "start", "pos"])
    if c is None:
        return
    assert c.pos.shape == (1, n, 1) and torch.isfinite(c.pos).all()
    COUNTS["valid"] += 1


@FUZZ
@given(
    values=st.lists(st.floats(allow_nan=True, allow_infinity=True, width=32), min_size=1, max_size=12),
    dims=st.integers(1, 3),
)
def test_points_builder(values, dims):
    xyz = torch.tensor(values[: len(values) // dims * dims] or values[:1] * dims).view(-1, dims)
    c = _classify(lambda: Coords.points(xyz), ["pos", "xyz", "axes"])
    if c is None:
        assert not torch.isfinite(xyz).all()  # only non-finite points are refused
        return
    assert torch.isfinite(c.pos).all() and c.pos.shape == (1, *xyz.shape)
    COUNTS["valid"] += 1


# ---------------------------------------------------------------------------- encoders

DIM, HEADS = 32, 4
BASE = {"dim": DIM, "num_heads": HEADS, "head_dim": DIM // HEADS, "grid_size": (3, 4), "k": 4}
# argument -> values to try besides the valid default
POOLS = {
    "dim": [0, -8, 32.0, "32", True, None, 31],
    "num_heads": [0, -1, 3, 4.0, "4", True],
    "head_dim": [0, 7, 15, 8.0, "8", True],
    "grid_size": [(3,), (3, 4, 5, 6), (0, 4), (3.5, 4), (True, 4), "34", (), None],
    "theta": [0, -1.0, math.nan, math.inf, "1e4", True, 1e-30, 1e30],
    "temperature": [0, -1.0, math.nan, math.inf, "1e4", 1e-30],
    "std": [0, -0.1, math.nan, math.inf, "0.02"],
    "jitter": [-0.1, 0.6, math.nan, math.inf],
    "gamma": [0, -1.0, math.nan, math.inf],
    "ratio": [0, -1.0, math.nan, math.inf, "2"],
    "axes": [(), "hw", ("h", "h"), ("h",), ("t", "h", "w"), ("x", 3), None],
    "sections": [(1.5, 2.5), (1, 1), (-1, 5), (4, 0), "22"],
    "mrope_section": [(0.5, 1.5, 2.0), (1.9, 1, 2), (1, 1), (2, 1, 1), (-1, 3, 2), "112"],
    "rotary_dim": [0, 3, 16, 4.0],
    "kernel_size": [0, 2, 4.0, -3, True],
    "num_prefix_tokens": [-1, 1.5, True],
    "interpolation": ["bicubik", 3],
    "convention": ["halfs", 1],
    "method": ["eucl", 2],
    "mode": ["biass", ["ctx"]],
    "rpe_on": ["", "kk", "x", 3],
    "coordinates": ["grids"],
    "fourier_dim": [0, 3, 8.0],
    "hidden_dim": [0, -1, 8.0],
    "groups": [0, 2, 1.0],
    "num_kv_heads": [0, 3, 2.0],
    "head_sections": [(1, 1), (5, 0, 0), (1.5, 1, 1)],
}


def _factories():
    out = {}
    for info in mmpos.list_encoders():
        params = inspect.signature(info.factory).parameters
        out[info.name] = (info, {k: v for k, v in BASE.items() if k in params}, list(params))
    return out


FACTORIES = _factories()
COORDS = [Coords.grid(3, 4, num_prefix_tokens=1), Coords.grid(2, 3, 4), Coords.sequence(6), Coords.grid(3, 4)]


def _apply(enc, info, coords: Coords, dim: int = DIM) -> None:
    """Run the encoder at its hook point and check finiteness and its invariants."""
    n = coords.num_tokens
    torch.manual_seed(0)
    if info.kind in ("additive", "conv"):
        x = torch.randn(2, n, dim)
        out = enc(x, coords)
        assert out.shape == x.shape and torch.isfinite(out).all()
        if info.kind == "additive" and coords.num_prefix_tokens:
            assert torch.equal(
                out[:, : coords.num_prefix_tokens], x[:, : coords.num_prefix_tokens]
            )  # prefix tokens get no position
    elif info.kind == "rotary":
        q, k = torch.randn(2, HEADS, n, enc.head_dim), torch.randn(2, HEADS, n, enc.head_dim)
        qr, kr = enc.rotate(q, k, coords)
        assert qr.shape == q.shape and torch.isfinite(qr).all() and torch.isfinite(kr).all()
        torch.testing.assert_close(qr.norm(dim=-1), q.norm(dim=-1), rtol=1e-4, atol=1e-4)  # a rotation
    elif info.kind == "bias":
        q, k = torch.randn(2, HEADS, n, enc.head_dim), torch.randn(2, HEADS, n, enc.head_dim)
        b = enc.bias(q, k, coords)
        assert b.shape[-2:] == (n, n) and torch.isfinite(b).all()
        if enc.has_output:
            o = enc.output(torch.softmax(torch.randn(2, HEADS, n, n), -1), coords)
            assert o.shape == q.shape and torch.isfinite(o).all()


# integer arguments: a float, bool or string there must be refused, never truncated or coerced
INT_ARGS = {
    "dim", "num_heads", "head_dim", "grid_size", "sections", "mrope_section", "head_sections", "kernel_size",
    "num_prefix_tokens", "rotary_dim", "fourier_dim", "hidden_dim", "groups", "num_kv_heads",
}  # fmt: skip
# Known gaps (encoder name, argument) that may still coerce a non-integer; none at present
# (the M-RoPE family's section counts were the last, fixed in issue 12).
KNOWN_GAPS: set[tuple[str, str]] = set()


def _not_int(v) -> bool:
    if isinstance(v, (list, tuple)):
        return any(_not_int(x) for x in v)
    return isinstance(v, (bool, float, str))


def _run_encoder(name: str, kwargs: dict) -> None:
    info, _, _ = FACTORIES[name]
    enc = _classify(lambda: mmpos.create(name, **kwargs), [*kwargs, "dim", "head"])
    if enc is None and info.kind != "none":
        return
    coerced = [k for k, v in kwargs.items() if k in INT_ARGS and (name, k) not in KNOWN_GAPS and _not_int(v)]
    if coerced:
        COUNTS["silent"] += 1
    assert not coerced, f"{name}: {coerced} accepted a non-integer {[kwargs[k] for k in coerced]}"
    COUNTS["valid"] += 1
    if info.kind == "none":
        return
    for coords in COORDS:
        COUNTS["tried"] += 1
        try:
            _apply(enc, info, coords, kwargs.get("dim", DIM))
        except (ValueError, TypeError):  # these coordinates do not fit this encoder: a clear refusal
            COUNTS["clear"] += 1
            continue
        COUNTS["valid"] += 1


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_every_encoder_builds_and_runs_with_base_arguments(name):
    _, base, _ = FACTORIES[name]
    if name == "maglap":
        pytest.skip("graph encoder: reads Laplacian eigenvectors, not token coordinates; not covered by this suite")
    _run_encoder(name, base)


@st.composite
def encoder_call(draw):
    name = draw(st.sampled_from(sorted(n for n in FACTORIES if n != "maglap")))
    _, base, params = FACTORIES[name]
    kwargs = dict(base)
    mutable = [p for p in params if p in POOLS]
    if mutable:
        for p in draw(st.lists(st.sampled_from(mutable), min_size=1, max_size=2, unique=True)):
            kwargs[p] = draw(st.sampled_from(POOLS[p]))
    if draw(st.booleans()) and "head_dim" in kwargs and "dim" in kwargs:
        kwargs.pop(draw(st.sampled_from(["head_dim", "dim"])))  # the two ways to give the head size
    return name, kwargs


@settings(FUZZ, max_examples=250)
@given(call=encoder_call())
def test_encoder_arguments(call):
    name, kwargs = call
    _run_encoder(name, kwargs)


positions = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, width=32)


@FUZZ
@given(
    name=st.sampled_from(["rope", "rope-axial", "rope-mixed", "sincos", "fourier", "mrope", "vrope", "hope"]),
    values=st.lists(positions, min_size=24, max_size=24),
)
def test_encoders_on_free_coordinates(name, values):
    """Continuous encoders on arbitrary finite positions (large and fractional) stay finite."""
    info, base, _ = FACTORIES[name]
    enc = mmpos.create(name, **base)
    fixed = {"rope": ("seq",), "sincos": ("x", "y", "z"), "fourier": ("x", "y", "z")}
    axes = fixed.get(name) or enc.axes
    pos = torch.tensor(values[: 6 * len(axes)]).view(1, 6, len(axes))
    coords = Coords(pos, axes)
    COUNTS["tried"] += 1
    try:
        _apply(enc, info, coords)
    except (ValueError, TypeError):
        COUNTS["clear"] += 1
        return
    COUNTS["valid"] += 1
