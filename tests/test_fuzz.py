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
import json
import math
import os
from collections import Counter

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mmpos
from mmpos import Coords

#: ``MMPOS_FUZZ_SCALE`` multiplies every family's example count (CI: 1; benchmarks/fuzz_table.py: more)
SCALE = float(os.environ.get("MMPOS_FUZZ_SCALE", "1"))


def _n(examples: int) -> int:
    return max(1, round(examples * SCALE))


FUZZ = settings(
    max_examples=_n(40),
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
COUNTS: Counter = Counter()
#: (family, outcome) -> inputs; outcome: clear / unhelpful / silent / valid (see docs/reliability.md)
TALLY: Counter = Counter()
#: test name prefix -> family of the table
FAMILIES = {
    "test_grid_builder": "coordinate builders",
    "test_huge_grid": "coordinate builders",
    "test_sequence_builder": "coordinate builders",
    "test_points_builder": "coordinate builders",
    "test_every_encoder": "encoder constructors",
    "test_encoder_arguments": "encoder constructors",
    "test_encoders_on_free": "encoders on free coordinates",
    "test_token_id_batches": "token-id batches (get_rope_index)",
    "test_media_files": "media files (image_patches)",
    "test_tables": "tables (mmpos.table.build)",
    "test_graphs": "graphs (maglap_eigenpairs)",
    "test_damaged_run_folders": "damaged run folders (mmpos run --resume)",
    "test_cli_arguments": "CLI arguments (mmpos run / cp / list)",
    "test_frequency_plans": "frequency plans (FrequencyPlan builders)",
    "test_video_frame_sampling": "video frame sampling (sample_frame_indices)",
    "test_layout_positions": "layouts with large positions (layout.build)",
}


@pytest.fixture(autouse=True)
def _attribute(request):
    """Attribute each test's counts to its family of the table (unclassified inputs fail their test)."""
    before = COUNTS.copy()
    yield
    family = next((f for prefix, f in FAMILIES.items() if request.node.name.startswith(prefix)), "other")
    delta = COUNTS - before
    for outcome in ("clear", "unhelpful", "silent", "valid"):
        TALLY[family, outcome] += delta[outcome]
    TALLY[family, "tried"] += delta["tried"]
    TALLY[family, "tracebacks"] += delta["tracebacks"]


@pytest.fixture(scope="module", autouse=True)
def _report():
    yield
    print(
        f"\nfuzz: {COUNTS['tried']} inputs tried, {COUNTS['clear']} clear errors, {COUNTS['valid']} valid results, "
        f"{COUNTS['silent']} silent wrong results, {COUNTS['unhelpful']} unhelpful errors (each one fails its test)"
    )
    path = os.environ.get("MMPOS_FUZZ_TABLE")
    if path:  # benchmarks/fuzz_table.py renders docs/reliability.md's table from this
        rows = {}
        for (family, outcome), n in TALLY.items():
            rows.setdefault(family, {})[outcome] = n
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"scale": SCALE, "families": rows}, f, indent=1)


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


@settings(FUZZ, max_examples=_n(100))
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


# ---------------------------------------------------------------------------- classification of one input


def _outcome(fn, names: list[str], check=None) -> str:
    """Run ``fn`` and classify it: ``clear`` (ValueError / TypeError naming one of ``names``), ``unhelpful``
    (another exception, or a message naming none of them), ``valid`` (``check(result)`` holds; no ``check``:
    any result) or ``silent`` (a result that ``check`` finds wrong). Counted in ``COUNTS``."""
    COUNTS["tried"] += 1
    try:
        out = fn()
    except (ValueError, TypeError) as e:
        outcome = "clear" if any(n in str(e) for n in names) and "\n" not in str(e).strip() else "unhelpful"
        detail = f"{type(e).__name__}: {e}"
    except Exception as e:  # noqa: BLE001 -- any other exception type is an unhelpful error
        outcome, detail = "unhelpful", f"{type(e).__name__}: {e}"
    else:
        ok, detail = (True, "") if check is None else check(out)
        outcome = "valid" if ok else "silent"
    COUNTS[outcome] += 1
    assert outcome in ("clear", "valid"), f"{outcome}: {detail[:500]}"
    return outcome


# ---------------------------------------------------------------------------- token-id batches

IMAGE_ID, START_ID, END_ID = 151655, 151652, 151653


def _qwen2_vl_config():
    pytest.importorskip("transformers")
    from transformers import Qwen2VLConfig

    return Qwen2VLConfig()


def _reference_positions(tokens: list[int], grids: list[tuple[int, int, int]], merge: int = 2) -> list[list[int]]:
    """Qwen2-VL M-RoPE positions of one unpadded prompt, written from the paper's rule (an independent
    computation): text advances by 1; an image of ``(t, h, w)`` patches takes ``t x h/m x w/m`` tokens at
    ``start + (ti, hi, wi)``; the next token starts at the block's largest position + 1."""
    rows, pos, i, g = [[], [], []], 0, 0, iter(grids)
    while i < len(tokens):
        if tokens[i] != IMAGE_ID:
            for r in rows:
                r.append(pos)
            pos, i = pos + 1, i + 1
            continue
        t, h, w = next(g)
        h, w = h // merge, w // merge
        for ti in range(t):
            for hi in range(h):
                for wi in range(w):
                    rows[0].append(pos + ti), rows[1].append(pos + hi), rows[2].append(pos + wi)
        pos, i = pos + max(t, h, w), i + t * h * w
    return rows


@st.composite
def token_batch(draw):
    samples = []
    for _ in range(draw(st.integers(1, 3))):
        tokens, grids = [], []
        for _ in range(draw(st.integers(1, 3))):
            tokens += draw(st.lists(st.integers(0, 1000), min_size=1, max_size=4))
            if draw(st.booleans()):
                grid = (1, 2 * draw(st.integers(1, 3)), 2 * draw(st.integers(1, 3)))
                tokens += [START_ID] + [IMAGE_ID] * (grid[1] * grid[2] // 4) + [END_ID]
                grids.append(grid)
        samples.append((tokens, grids))
    damage = draw(
        st.sampled_from(
            [None] * 6
            + ["drop-grid", "extra-grid", "odd-grid", "drop-token", "float-ids", "1d-ids", "zero-grid", "mask-shape"]
        )
    )
    return samples, draw(st.sampled_from(["right", "left"])), damage


@settings(FUZZ, max_examples=_n(60))
@given(batch=token_batch())
def test_token_id_batches(batch):
    from mmpos.integrations.hf_rope_index import get_rope_index

    samples, side, damage = batch
    config = _qwen2_vl_config()
    length = max(len(t) for t, _ in samples)
    ids = torch.zeros(len(samples), length, dtype=torch.long)
    mask = torch.zeros(len(samples), length, dtype=torch.long)
    for b, (tokens, _) in enumerate(samples):
        cols = slice(0, len(tokens)) if side == "right" else slice(length - len(tokens), length)
        ids[b, cols], mask[b, cols] = torch.tensor(tokens), 1
    grids = [g for _, gs in samples for g in gs]
    grid = torch.tensor(grids, dtype=torch.long).view(-1, 3) if grids else None
    if damage == "drop-grid" and grids:
        grid = grid[:-1]
    elif damage == "extra-grid":
        grid = torch.cat([grid if grid is not None else torch.zeros(0, 3, dtype=torch.long), torch.tensor([[1, 2, 2]])])
    elif damage == "odd-grid" and grids:
        grid = grid.clone()
        grid[0, 1] += 1
    elif damage == "drop-token" and grids:
        where = (ids == IMAGE_ID).nonzero()[0]
        ids[where[0], where[1]] = 7
    elif damage == "float-ids":
        ids = ids.float()
    elif damage == "1d-ids":
        ids, mask = ids[0], mask[0]
    elif damage == "zero-grid" and grids:
        grid = grid.clone()
        grid[0, 0] = 0
    elif damage == "mask-shape":
        mask = mask[:, :-1]
    intact = damage is None or (damage in ("drop-grid", "odd-grid", "drop-token", "zero-grid") and not grids)

    def check(out):
        if not intact:
            return False, f"damage {damage!r} accepted"
        position_ids, _ = out
        for b, (tokens, gs) in enumerate(samples):
            real = mask[b].bool()
            got = position_ids[:, b, real].tolist()
            want = _reference_positions(tokens, gs)
            if got != want:
                return False, f"sample {b}: {got} != {want}"
        return True, ""

    names = ["input_ids", "image_grid_thw", "attention_mask", "image", "grid", "tokens"]
    _outcome(lambda: get_rope_index(config, ids, image_grid_thw=grid, attention_mask=mask), names, check)


# ---------------------------------------------------------------------------- media files


def _image_bytes(mode: str, h: int, w: int, fmt: str, seed: int, bright: bool) -> bytes:
    import io

    import numpy as np
    from PIL import Image as PILImage

    rng = np.random.default_rng(seed)
    if mode in ("I;16", "I"):
        top = 65535 if bright else 255
        img = PILImage.fromarray(rng.integers(0, top + 1, (h, w)).astype(np.uint16 if mode == "I;16" else np.int32))
    elif mode == "F":
        img = PILImage.fromarray((rng.random((h, w)) * (1000 if bright else 255)).astype(np.float32))
    elif mode == "1":
        img = PILImage.fromarray(rng.random((h, w)) > 0.5)
    else:
        rgb = PILImage.fromarray(rng.integers(0, 256, (h, w, 3)).astype(np.uint8))
        img = rgb.convert(mode) if mode != "P" else rgb.quantize(8)
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    return buf.getvalue()


MEDIA_MODES = {"L": "PNG", "LA": "PNG", "P": "PNG", "RGB": "PNG", "RGBA": "PNG", "CMYK": "JPEG", "1": "PNG",
               "I;16": "PNG", "I": "TIFF", "F": "TIFF"}  # fmt: skip


@st.composite
def media_file(draw):
    mode = draw(st.sampled_from(sorted(MEDIA_MODES)))
    h, w = draw(st.integers(1, 48)), draw(st.integers(1, 48))
    data = _image_bytes(mode, h, w, MEDIA_MODES[mode], draw(st.integers(0, 9)), draw(st.booleans()))
    damage = draw(st.sampled_from([None] * 5 + ["truncated", "garbage", "empty", "huge-header", "tall"]))
    if damage == "truncated":
        data = data[: draw(st.integers(0, len(data) - 1))]
    elif damage == "garbage":
        data = bytes(draw(st.lists(st.integers(0, 255), min_size=1, max_size=64)))
    elif damage == "empty":
        data = b""
    elif damage == "huge-header":
        side = draw(st.sampled_from([20_000, 100_000, 2**31 - 1]))
        data = _png_header(side, side)
    elif damage == "tall":
        data = _image_bytes("RGB", 600, 2, "PNG", 0, False)
    return mode, (h, w), data, damage


def _png_header(width: int, height: int) -> bytes:
    import struct
    import zlib

    def chunk(kind: bytes, payload: bytes) -> bytes:
        return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 4)) + chunk(b"IEND", b"")


@settings(FUZZ, max_examples=_n(60))
@given(case=media_file())
def test_media_files(case):
    """Every generated file is patchified correctly or refused naming it (and why); never a silent white-out."""
    import io

    import numpy as np
    from PIL import Image as PILImage

    from mmpos.media import image_patches, smart_resize

    mode, (h, w), data, damage = case

    def check(out):
        rows, size = out.pixel_values, out.size
        if damage is not None:
            return False, f"damaged file ({damage}) accepted"
        want = smart_resize(h, w, 28, 56 * 56, 28 * 28 * 1280)
        if tuple(size) != want or rows.shape[0] != (want[0] // 14) * (want[1] // 14) or not torch.isfinite(rows).all():
            return False, f"size {size} rows {tuple(rows.shape)} for a {h}x{w} image"
        source = PILImage.open(io.BytesIO(data))
        if mode in ("I;16", "I", "F"):
            values = np.asarray(source, dtype=np.float64)
            if values.max() > 255:
                return False, f"a {mode} image with values up to {values.max()} was accepted (it saturates)"
        return True, ""

    _outcome(lambda: image_patches(data), ["image <bytes>", "aspect ratio"], check)


# ---------------------------------------------------------------------------- tables

cell_count = st.one_of(st.integers(1, 4), st.sampled_from([0, -1, 1.5, True, "2", None]))


@st.composite
def table_case(draw):
    from mmpos.table import Table

    rows = draw(st.lists(st.lists(cell_count, min_size=0, max_size=4), min_size=0, max_size=4))
    col_sep = draw(st.one_of(st.integers(0, 2), st.sampled_from([-1, 1.0, True])))
    row_end = draw(st.one_of(st.integers(0, 2), st.sampled_from([-1, "1"])))
    orders = draw(st.sampled_from([("row", "col"), ("row", "col", "diag"), ("col",), (), ("row", "row"), ("rows",)]))
    text = draw(st.integers(0, 3))
    return Table, rows, col_sep, row_end, orders, text


@settings(FUZZ, max_examples=_n(60))
@given(case=table_case())
def test_tables(case):
    """Tables lay out every token once under every order (independent count), or are refused naming the field."""
    from mmpos.layout import Text
    from mmpos.table import build

    Table, rows, col_sep, row_end, orders, text = case

    def run():
        table = Table(rows, col_sep=col_sep, row_end=row_end, rule_rows=False)  # the count below: no rule rows
        segments = ([Text(text)] if text else []) + [table]
        return table, build([segments], orders=orders)

    def check(out):
        table, lay = out
        tokens = sum(sum(r) + col_sep * len(r) + row_end for r in table.cells)  # the serialisation rule
        n = text + tokens
        pos = lay.order_coords.pos[0]
        if pos.shape != (n, len(orders)) or not lay.mask.all():
            return False, f"{tuple(pos.shape)} positions for {n} tokens"
        for k in range(len(orders)):  # every order is a permutation of 0..n-1 with the text first
            if sorted(pos[:, k].long().tolist()) != list(range(n)) or pos[:text, k].tolist() != list(range(text)):
                return False, f"order {orders[k]!r} is not a permutation of the {n} positions"
        if "row" in orders and pos[:, orders.index("row")].long().tolist() != list(range(n)):
            return False, "the row order is not the serialisation order"
        return True, ""

    _outcome(run, ["Table.", "orders", "cells", "samples"], check)


# ---------------------------------------------------------------------------- graphs


@st.composite
def graph_case(draw):
    n = draw(st.sampled_from([1, 2, 3, 5, 8, 0, -1, 2.0]))
    m = draw(st.integers(0, 12))
    top = n if isinstance(n, int) and n > 0 else 3
    edges = [[draw(st.integers(0, top - 1)) for _ in range(m)], [draw(st.integers(0, top - 1)) for _ in range(m)]]
    damage = draw(st.sampled_from([None] * 5 + ["out-of-range", "negative", "float", "shape", "k0", "q-nan"]))
    return n, edges, draw(st.integers(1, 4)), draw(st.sampled_from([0.0, 0.1, 0.25])), damage


@settings(FUZZ, max_examples=_n(50))
@given(case=graph_case())
def test_graphs(case):
    """Magnetic-Laplacian eigenpairs: orthonormal eigenvectors with ``L v = lambda v`` (L rebuilt densely with
    numpy from the edge list and the definition), eigenvalues ascending in [0, 2]; bad graphs refused."""
    import numpy as np

    from mmpos.graph import maglap_eigenpairs

    n, edges, k, q, damage = case
    edge_index = torch.tensor(edges, dtype=torch.long).view(2, -1)
    if damage == "out-of-range" and edge_index.numel():
        edge_index[0, 0] = 99
    elif damage == "negative" and edge_index.numel():
        edge_index[1, 0] = -1
    elif damage == "float":
        edge_index = edge_index.float()
    elif damage == "shape":
        edge_index = edge_index.reshape(-1)
    k = 0 if damage == "k0" else k
    q = math.nan if damage == "q-nan" else q
    broken = damage in ("float", "shape", "k0", "q-nan") or (damage in ("out-of-range", "negative") and edges[0])

    def check(out):
        if broken or not (isinstance(n, int) and n > 0):
            return False, f"damage {damage!r} / num_nodes={n!r} accepted"
        a = np.zeros((n, n))
        for u, v in zip(*edges):
            a[u, v] = 1.0  # binarised: multi-edges collapse
        sym = ((a + a.T) > 0).astype(float)  # A_s
        one_way = int(((a == 1) & (a.T == 0)).sum())
        qq = q / max(min(one_way, n), 1)  # the reference's relative potential
        phase = np.exp(1j * 2 * np.pi * qq * (a - a.T))
        inv = 1 / np.sqrt(np.maximum(sym.sum(1), 1))  # degrees clipped at 1 inside D^-1/2
        lap = np.eye(n) - inv[:, None] * sym * phase * inv[None, :]
        real = out.mask.numpy()
        vals = out.eigval.numpy()[0][real]
        vecs = out.eigvec.numpy()[:, 0][:, real]
        if real.sum() != min(k, n):
            return False, f"{real.sum()} eigenpairs for k={k}, n={n}"
        if (np.diff(vals) < -1e-8).any() or vals.min() < -1e-8 or vals.max() > 2 + 1e-8:
            return False, f"eigenvalues {vals}"
        if (
            np.abs(lap @ vecs - vecs * vals).max() > 1e-6
            or np.abs(vecs.conj().T @ vecs - np.eye(len(vals))).max() > 1e-6
        ):
            return False, "not eigenpairs of the magnetic Laplacian"
        return True, ""

    names = ["edge_index", "num_nodes", "k", "q"]
    _outcome(lambda: maglap_eigenpairs(edge_index, n, k, q=q), names, check)


# ---------------------------------------------------------------------------- damaged run folders, CLI arguments


def _register_toy():
    import torch.nn.functional as F
    from torch import nn

    from mmpos.runner import Task, list_tasks, register_task

    if "fuzz_toy" in list_tasks():
        return

    @register_task("fuzz_toy", defaults={})
    def _build(cfg, encoder, seed, device):
        g = torch.Generator().manual_seed(seed)
        x, y = torch.randn(64, 6, generator=g), torch.randint(3, (64,), generator=g)
        model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))

        def train_batch(step):
            if step == _STOP["at"]:
                raise KeyboardInterrupt("fuzz: simulated kill")
            rows = torch.randint(64, (16,), generator=torch.Generator().manual_seed(seed * 1000 + step))
            return x[rows], y[rows]

        def evaluate(m):
            return {"acc": (m(x).argmax(-1) == y).float().mean().item(), "loss": F.cross_entropy(m(x), y).item()}

        return Task(model, train_batch, lambda m, b: F.cross_entropy(m(b[0]), b[1]), evaluate, metric="acc")


_STOP = {"at": None}
TOY_RECIPE = "task: fuzz_toy\nsteps: 12\neval_every: 4\nlog_every: 2\nencoders: [none]\ndevice: cpu\nprogress: false\n"


@pytest.fixture(scope="module")
def run_folders(tmp_path_factory):
    """A finished reference run, and the same run killed at step 10 (last.pt: step 8, prev.pt: step 4)."""
    from mmpos.runner import run_recipe

    _register_toy()
    root = tmp_path_factory.mktemp("fuzz-runs")
    (root / "toy.yaml").write_text(TOY_RECIPE)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("mmpos.runner.plots.plot_results", lambda *a, **k: None)  # no figure: speed only
        run_recipe(root / "toy.yaml", ["name=full"], out=root / "runs")
        _STOP["at"] = 10
        try:
            with pytest.raises(KeyboardInterrupt):
                run_recipe(root / "toy.yaml", ["name=cut"], out=root / "runs")
        finally:
            _STOP["at"] = None
    return root / "runs" / "toy" / "full", root / "runs" / "toy" / "cut"


def _damage(folder, target: str, op: str, arg: float) -> None:
    import shutil

    pair = folder / "none" / "seed0"
    path = folder / target if target == "config.yaml" else pair / target
    if op == "swap":
        last, prev = pair / "last.pt", pair / "prev.pt"
        data = last.read_bytes()
        last.write_bytes(prev.read_bytes())
        prev.write_bytes(data)
        return
    if op == "leftover":
        (pair / ".last.pt.tmp4242").write_bytes(b"half")
        (folder / ".results.md.tmp7").write_bytes(b"half")
        return
    if op == "delete":
        path.unlink()
        return
    if op == "pair-deleted":
        shutil.rmtree(folder / "none")
        return
    data = path.read_bytes()
    if op == "truncate":
        data = data[: int(len(data) * arg)]
    elif op == "flip":
        i = min(int(len(data) * arg), len(data) - 1)
        data = data[:i] + bytes([data[i] ^ 0x04]) + data[i + 1 :]
    elif op == "garbage":
        data = b"\x00\xff garbage \x8f" * 8
    elif op == "latin1":
        data = data.replace(b"none", b"n\xf6ne", 1)
    elif op in ("drop-line", "dup-line"):
        lines = data.decode().splitlines(keepends=True)
        i = int(arg) % len(lines)
        lines = lines[:i] + lines[i + 1 :] if op == "drop-line" else lines[: i + 1] + lines[i:]
        data = "".join(lines).encode()
    elif op == "torn":
        data += b'{"step": 11, "lo'
    path.write_bytes(data)


DAMAGES = (
    [(f, "truncate", a) for f in ("config.yaml", "last.pt", "prev.pt", "metrics.jsonl") for a in (0, 0.25, 0.5, 0.9, 0.999)]
    + [(f, "flip", a) for f in ("config.yaml", "last.pt", "prev.pt", "metrics.jsonl") for a in (0.02, 0.2, 0.5, 0.8, 0.98)]
    + [(f, "delete", 0) for f in ("config.yaml", "last.pt", "prev.pt", "metrics.jsonl")]
    + [(f, "garbage", 0) for f in ("config.yaml", "last.pt", "prev.pt", "metrics.jsonl")]
    + [("config.yaml", "latin1", 0), ("metrics.jsonl", "latin1", 0)]
    + [("metrics.jsonl", op, i) for op in ("drop-line", "dup-line") for i in (0, 2, 5, -1)]
    + [("metrics.jsonl", "torn", 0), ("last.pt", "swap", 0), ("last.pt", "leftover", 0), ("none", "pair-deleted", 0)]
)  # fmt: skip
FINISHED_DAMAGES = [
    ("final.json", op, a) for op, a in (("truncate", 0.5), ("garbage", 0), ("delete", 0), ("flip", 0.3))
]
_STEP = max(1, round(4 / SCALE))  # CI: every 4th damage; benchmarks/fuzz_table.py (MMPOS_FUZZ_SCALE >= 4): all


@pytest.mark.parametrize(
    "finished, target, op, arg",
    [(False, *d) for d in DAMAGES[::_STEP]] + [(True, *d) for d in FINISHED_DAMAGES[:: max(1, _STEP // 2)]],
    ids=lambda v: str(v),
)
def test_damaged_run_folders(run_folders, tmp_path, capsys, monkeypatch, finished, target, op, arg):
    """``mmpos run --resume`` of a damaged folder: the exact metrics of the uninterrupted run, or one line
    naming the damaged file (exit 2 / 1); never a traceback, never other metrics."""
    import shutil

    from mmpos.cli import main

    full, cut = run_folders
    folder = tmp_path / "toy" / "run"
    shutil.copytree(full if finished else cut, folder)
    _damage(folder, target, op, arg)
    monkeypatch.setattr("mmpos.runner.plots.plot_results", lambda *a, **k: None)
    capsys.readouterr()

    def resume():
        code = main(["run", "--resume", str(folder), "progress=false"])
        err = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("mmpos run: warning:")]
        if code == 0:
            return code, err
        if len(err) != 1:
            raise RuntimeError(f"exit {code} with {len(err)} lines: {err}")
        raise ValueError(err[0])  # classified by the names below

    def check(out):
        def metrics(f):
            return json.loads((f / "none" / "seed0" / "final.json").read_text())["metrics"]

        def records(f):
            return (f / "none" / "seed0" / "metrics.jsonl").read_text()

        same = metrics(folder) == metrics(full) and records(folder) == records(full)
        return same, "" if same else f"resumed to other metrics: {metrics(folder)} != {metrics(full)}"

    try:
        _outcome(resume, ["config.yaml", "last.pt", "prev.pt", "metrics.jsonl", "final.json"], check)
    except AssertionError:
        raise
    except BaseException as e:  # a traceback out of the CLI
        COUNTS["tracebacks"] += 1
        raise AssertionError(f"traceback from mmpos run --resume: {type(e).__name__}: {e}") from e
    assert not [p for p in folder.rglob("*") if ".tmp" in p.name]


CLI_WORDS = [
    "run", "cp", "list", "recipes", "quickstrat", "@toy", "steps", "=3", "a..b=1", "encoders=rope", "seeds=0",
    "--steps", "10", "--out", "@file", "optim.lr=x", "optim.lr=-1", "device=tpu", "name=../x", "profile=nope",
    "--resume", "@missing", "stepz=3", "logger=wandb", "batch_size=0", "--force", "encoders=[ropee]", "optim.betas=[2]",
    "task_module=nope", "name=ok", "optim=3", "encoders=[]", "--help-me", "-x", "@dest",
]  # fmt: skip


@settings(FUZZ, max_examples=_n(60))
@given(words=st.lists(st.sampled_from(CLI_WORDS), min_size=1, max_size=5))
def test_cli_arguments(words):
    """Any mix of commands, arguments, overrides and options: exit 0, or one line on stderr with exit 2."""
    import contextlib
    import io
    import tempfile

    from mmpos.cli import main

    _register_toy()
    with tempfile.TemporaryDirectory() as tmp:
        from pathlib import Path

        root = Path(tmp)
        (root / "toy.yaml").write_text(TOY_RECIPE + "steps: 2\n".replace("steps: 2\n", ""))
        (root / "file").write_text("")
        subs = {"@toy": str(root / "toy.yaml"), "@file": str(root / "file"), "@missing": str(root / "nope"),
                "@dest": str(root / "copy.yaml")}  # fmt: skip
        argv = [subs.get(w, w) for w in words]
        if "--out" not in argv:
            argv += ["--out", str(root / "runs")] if argv[0] == "run" else []
        err = io.StringIO()

        def call():
            try:
                with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                    code = main(argv)
            except SystemExit as e:  # argparse's own exits (help, usage errors)
                code = e.code
            lines = [line for line in err.getvalue().splitlines() if ": warning: " not in line]
            if code == 0:
                return code
            if code in (1, 2) and len(lines) == 1:
                raise ValueError(lines[0])
            raise RuntimeError(f"exit {code} with stderr {lines}")

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr("mmpos.runner.plots.plot_results", lambda *a, **k: None)
            try:
                _outcome(call, ["mmpos"])
            except AssertionError:
                raise
            except BaseException as e:
                COUNTS["tracebacks"] += 1
                raise AssertionError(f"traceback from mmpos {argv}: {type(e).__name__}: {e}") from e


# ---------------------------------------------------------------------------- frequency plans

plan_count = st.one_of(st.integers(-1, 6), st.sampled_from([1.5, 2.0, 2.5, True, "2", None]))


@st.composite
def plan_case(draw):
    builder = draw(st.sampled_from(["axial", "chunked_axes", "cyclic_axes", "per_head"]))
    head_dim = draw(st.one_of(st.sampled_from([8, 12, 16, 24]), st.sampled_from([7, 0, -8, 16.0, True, "16"])))
    axes = draw(st.sampled_from([("t", "h", "w"), ("h", "w"), ("x",), ("h", "h"), "hw", ()]))
    sections = draw(st.lists(plan_count, min_size=0, max_size=4))
    if draw(st.booleans()) and isinstance(head_dim, int) and head_dim > 0 and not head_dim % 2 and axes:
        # a valid split of the pairs (or of the heads) over the axes, to exercise the result check too
        total = draw(st.integers(1, 6)) if builder == "per_head" else head_dim // 2
        cuts = sorted(draw(st.lists(st.integers(0, total), min_size=len(axes) - 1, max_size=len(axes) - 1)))
        sections = [b - a for a, b in zip([0, *cuts], [*cuts, total])]
    heads = draw(st.one_of(st.integers(1, 8), st.sampled_from([0, 2.0, True])))
    return builder, head_dim, axes, sections, heads, draw(st.sampled_from([10000.0, 100.0]))


def _plan_reference(builder, head_dim, axes, sections, heads, theta):
    """(axis, frequency) of every pair (per head for per_head), computed from the definitions in float64."""
    pairs = head_dim // 2
    spectrum = [theta ** (-2 * i / head_dim) for i in range(pairs)]  # the shared 1-D RoPE spectrum
    if builder == "axial":  # each section its own spectrum theta ** (-k / s)
        return [(a, theta ** (-k / s)) for a, s in enumerate(sections) for k in range(s)]
    if builder == "chunked_axes":
        return [(a, spectrum[p]) for p, a in enumerate(a for a, s in enumerate(sections) for _ in range(s))]
    if builder == "cyclic_axes":  # pair p reads p mod A while p < A * sections[p mod A], else axis 0
        n = len(axes)
        return [((p % n) if p < n * sections[p % n] else 0, spectrum[p]) for p in range(pairs)]
    owner = [a for a, s in enumerate(sections) for _ in range(s)] + [-1] * (heads - sum(sections))
    return [[(owner[h], spectrum[p]) for p in range(pairs)] for h in range(heads)]


@settings(FUZZ, max_examples=_n(80))
@given(case=plan_case())
def test_frequency_plans(case):
    """FrequencyPlan builders: a plan whose every pair reads the axis and frequency its definition gives,
    or a clear error -- never a float section truncated into a plan of another shape."""
    from mmpos.rotary import FrequencyPlan

    builder, head_dim, axes, sections, heads, theta = case
    build = getattr(FrequencyPlan, builder)
    if builder == "per_head":
        fn = lambda: build(head_dim, heads, sections, axes=axes, theta=theta)
    elif builder == "axial":
        fn = lambda: build(head_dim, axes, sections, theta=theta)
    else:
        fn = lambda: build(head_dim, sections, axes=axes, theta=theta)

    def check(plan):
        ok_sections = all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in sections)
        if not ok_sections or len(sections) != len(axes):
            return False, f"sections {sections!r} for axes {axes!r} accepted"
        want = _plan_reference(builder, head_dim, axes, list(sections), heads, theta)
        w = plan.weight.double()
        rows = [w] if w.dim() == 2 else list(w)
        want = [want] if w.dim() == 2 else want
        for got, ref in zip(rows, want):
            if got.shape != (len(axes), len(ref)):
                return False, f"weight {tuple(got.shape)} for {len(ref)} pairs over {axes}"
            for p, (a, f) in enumerate(ref):
                col = got[:, p]
                expect = torch.zeros(len(axes), dtype=torch.float64)
                if a >= 0:
                    expect[a] = f
                if not torch.allclose(col, expect, rtol=1e-6, atol=0):
                    return False, f"pair {p}: weight {col.tolist()}, definition {expect.tolist()}"
        return True, ""

    _outcome(fn, ["head_dim", "sections", "head_sections", "axes", "num_heads"], check)


# ---------------------------------------------------------------------------- video frame sampling


@st.composite
def frame_case(draw):
    total = draw(st.one_of(st.integers(1, 400), st.sampled_from([0, -3, 12.0, True, 10**12])))
    fps = draw(st.one_of(st.sampled_from([24.0, 29.97, 30.0, 1.0]), st.sampled_from([0.0, -5.0, math.nan, math.inf])))
    rule = draw(st.sampled_from(["qwen2-vl", "qwen3-vl"]))
    want = draw(
        st.sampled_from([{}, {"fps": 2.0}, {"fps": 0.5}, {"num_frames": 1}, {"num_frames": 6}, {"num_frames": 500}])
    )
    extra = draw(st.sampled_from([{}, {"min_frames": 0}, {"max_frames": 3}]))
    return total, fps, rule, {**want, **extra}


def _frame_count(total, fps, rule, spec):
    """How many frames the processors keep (transformers' Qwen2-VL / Qwen3-VL video processors, by hand)."""
    tp = spec.temporal_patch_size
    if rule == "qwen3-vl":
        if spec.num_frames is not None:
            return spec.num_frames
        if spec.fps is not None:
            return min(max(int(total / fps * spec.fps), spec.min_frames), spec.max_frames, total)
        return min(max(total, spec.min_frames), spec.max_frames)
    if spec.num_frames is not None:
        return round(spec.num_frames / tp) * tp
    if spec.fps is not None:
        top = min(spec.max_frames, total) // tp * tp
        return int(min(max(total / fps * spec.fps, spec.min_frames), top, total) // tp * tp)
    return total


@settings(FUZZ, max_examples=_n(80))
@given(case=frame_case())
def test_video_frame_sampling(case):
    """sample_frame_indices: sorted in-range int64 indices, as many as the processor keeps (Qwen2-VL sampling:
    the reference's own indices); 0 frames, a clip too short, a frame rate of 0 / negative / NaN / inf and huge
    clips are clear errors."""
    import dataclasses

    import numpy as np

    from mmpos import media

    total, fps, rule, want = case
    base = media.VIDEO_SPECS[rule]
    fields = {"fps": None, "num_frames": None, **want} if "num_frames" in want else {"num_frames": None, **want}

    def build():
        spec = dataclasses.replace(base, **fields)
        return spec, media.sample_frame_indices(total, fps, spec)

    def check(out):
        spec, idx = out
        if not (isinstance(total, int) and not isinstance(total, bool) and total > 0):
            return False, f"total_frames={total!r} accepted"
        if not (math.isfinite(fps) and fps > 0):
            return False, f"video_fps={fps!r} accepted"
        n = _frame_count(total, fps, rule, spec)
        sampled = spec.fps is not None or spec.num_frames is not None  # else every frame (padded when patchified)
        if rule == "qwen2-vl" and sampled:
            # the reference's arange(0, total, total / n) -- which float rounding can make n + 1 long (367 frames,
            # n = 30: 31 indices); mmpos follows it
            want = torch.arange(0, total, total / n).int().numpy()
            if want[-1] >= total:  # where the reference would index past the clip: the n evenly spaced frames
                want = np.arange(n) * total // n
            if not np.array_equal(idx, want):
                return False, f"indices {idx[:8]}... differ from the reference's arange for n={n}"
        elif idx.dtype != np.int64 or len(idx) != n or n < 1:
            return False, f"{len(idx)} indices ({idx.dtype}), the processor keeps {n}"
        if idx.dtype != np.int64 or (np.diff(idx) < 0).any() or idx.min() < 0 or idx.max() >= total:
            return False, f"indices {idx[:8]} ({idx.dtype}) not sorted within [0, {total})"
        if rule == "qwen2-vl" and len(set(idx.tolist())) != len(idx):
            return False, "Qwen2-VL sampling repeated a frame"
        return True, ""

    names = ["total_frames", "video_fps", "frames", "MediaSpec", "frame indices"]
    _outcome(build, names, check)


# ---------------------------------------------------------------------------- layouts with large positions


@st.composite
def layout_case(draw):
    scheme = draw(st.sampled_from(["qwen2-vl", "qwen2.5-vl", "qwen3-vl", "mrope-i", "vrope", "flat", "hope"]))
    seconds = draw(st.sampled_from([0.5, 1.0, 1e6, 1e7, 3.3e7, 1e9]))
    frames = draw(st.sampled_from([2, 4, 6]))
    lead = draw(st.integers(0, 5))
    scale = draw(st.sampled_from([1.0, 1e7])) if scheme == "hope" else None
    return scheme, seconds, frames, lead, scale


@settings(FUZZ, max_examples=_n(50))
@given(case=layout_case())
def test_layout_positions(case):
    """mmpos.layout.build: coords equal the position ids (every row an axis), exactly, also past 2**24 where
    float32 coordinates merged neighbours; the positions follow Qwen2.5-VL's rule where it applies."""
    import warnings

    from mmpos.layout import Text, Video, build

    scheme, seconds, frames, lead, scale = case
    segments = [Text(lead)] if lead else []
    segments += [Video((frames, 4, 4), second_per_grid=seconds), Text(3)]
    options = {"temporal_scale": scale} if scale is not None else {}

    def run():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # float32 position ids past 2**24 warn (hope): checked below
            return build([segments], scheme, **options)

    def check(lay):
        a = len(lay.coords.axes)
        real = lay.attention_mask[0].bool()
        pos = lay.coords.pos[0][real].double()  # (L, A)
        exact = pos.abs().max() <= 2**24 or lay.coords.pos.dtype == torch.float64
        if not exact:
            return False, f"positions up to {pos.abs().max():.0f} in {lay.coords.pos.dtype}"
        if not lay.position_ids.dtype.is_floating_point:
            ids = lay.position_ids[:a, 0][:, real].T.double()  # (L, A)
            if not torch.equal(pos, ids):
                return False, "coords differ from the integer position ids"
        if scheme == "qwen2.5-vl":  # t = lead + frame * tokens_per_second (2) * seconds, floored per frame
            t = pos[lead : lead + frames // 2 * 4, 0].view(frames // 2, 4)[:, 0]
            ref = torch.tensor([lead + int(f * 2 * seconds) for f in range(frames // 2)], dtype=torch.float64)
            if not torch.equal(t, ref):
                return False, f"temporal positions {t.tolist()}, Qwen2.5-VL's rule gives {ref.tolist()}"
            if pos[-1, 0] != pos[lead:-3].max() + 3:
                return False, "the text after the video does not continue from the largest position + 1"
        return True, ""

    _outcome(run, ["second_per_grid", "temporal_scale", "positions"], check)
