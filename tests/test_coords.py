"""Tests for :mod:`mmpos.coords`: builders, views, validation, and ``Coords`` as a pytree input."""

import io
import math
import warnings

import pytest
import torch
from torch.export import Dim
from torch.utils import _pytree as pytree

import mmpos
from mmpos import Coords, Modality
from mmpos.nn import Transformer


def test_grid_2d_non_square_with_prefix():
    c = Coords.grid(3, 5, num_prefix_tokens=2, batch=4)
    assert c.pos.shape == (4, 2 + 15, 2)
    assert c.axes == ("h", "w")
    assert c.grid_shape == (3, 5) and c.num_prefix_tokens == 2
    assert torch.equal(c.pos[0, :2], torch.zeros(2, 2))
    # row-major: token 2 + r * 5 + col sits at (r, col)
    assert c.pos[0, 2 + 2 * 5 + 3].tolist() == [2.0, 3.0]
    assert (c.modality[:, :2] == Modality.SPECIAL).all() and (c.modality[:, 2:] == Modality.IMAGE).all()


def test_grid_3d_axes_and_modality():
    c = Coords.grid(2, 3, 4)
    assert c.axes == ("t", "h", "w") and c.num_tokens == 24
    assert c.pos[0, -1].tolist() == [1.0, 2.0, 3.0]
    assert (c.modality == Modality.VIDEO).all()


def test_sequence_start_and_batch():
    c = Coords.sequence(5, batch=2, start=3)
    assert c.pos.shape == (2, 5, 1) and c.pos[1, :, 0].tolist() == [3, 4, 5, 6, 7]


def test_points_and_mask():
    xyz = torch.randn(7, 3)
    c = Coords.points(xyz, mask=torch.ones(7, dtype=torch.bool))
    assert c.axes == ("x", "y", "z") and c.pos.shape == (1, 7, 3) and c.mask.shape == (1, 7)


def test_stack_right_and_left_padding():
    a, b = Coords.sequence(3), Coords.sequence(5)
    right = Coords.stack([a, b])
    assert right.mask.tolist() == [[True] * 3 + [False] * 2, [True] * 5]
    left = Coords.stack([a, b], padding_side="left")
    assert left.mask[0].tolist() == [False, False, True, True, True]
    assert left.pos[0, :, 0].tolist() == [0, 0, 0, 1, 2]


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: Coords(torch.tensor([[[float("nan")]]]), ("seq",)), "finite"),
        (lambda: Coords(torch.tensor([[[float("inf")]]]), ("seq",)), "finite"),
        (lambda: Coords(torch.zeros(1, 3, 1), ("seq",), mask=torch.ones(1, 4, dtype=torch.bool)), "mask"),
        (lambda: Coords(torch.zeros(1, 3, 2), ("h", "w"), grid_shape=(2, 2)), "grid_shape"),
        (lambda: Coords(torch.zeros(1, 3, 2), ("h",)), "axes"),
        (lambda: Coords.grid(0, 4), "sizes"),
        (lambda: Coords.grid(2, -1), "sizes"),
        (lambda: Coords.grid(2, 2, num_prefix_tokens=-1), "prefix"),
        (lambda: Coords.stack([Coords.sequence(2)], padding_side="top"), "padding_side"),
        (lambda: Coords.stack([Coords.sequence(2), Coords.grid(2, 2)]), "axes"),
        (lambda: Coords.points(torch.zeros(5)), "xyz"),
    ],
)
def test_bad_input_names_the_argument(build, match):
    with pytest.raises(ValueError, match=match):
        build()


def test_scaled_shifted_keep_prefix_at_zero():
    c = Coords.grid(2, 3, num_prefix_tokens=1)
    s = c.shifted((10, 20)).scaled(2)
    assert s.pos[0, 0].tolist() == [0, 0]
    assert s.pos[0, 1].tolist() == [20, 40]
    with pytest.raises(ValueError, match="offset"):
        c.shifted((1, 2, 3))


def test_normalized_cell_centres():
    c = Coords.grid(2, 4, num_prefix_tokens=1).normalized()
    assert c.pos[0, 0].tolist() == [0, 0]
    h = c.pos[0, 1:, 0].unique().tolist()
    w = c.pos[0, 1:, 1].unique().tolist()
    assert h == pytest.approx([-0.5, 0.5]) and w == pytest.approx([-0.75, -0.25, 0.25, 0.75])
    with pytest.raises(ValueError, match="grid"):
        Coords.points(torch.randn(4, 3)).normalized()


def test_select_flattened_to_expand():
    c = Coords.grid(2, 3, 4, num_prefix_tokens=1)
    hw = c.select("w", "h")
    assert hw.axes == ("w", "h") and hw.grid_shape is None
    assert torch.equal(hw.pos[..., 0], c.pos[..., 2])
    flat = c.flattened()
    assert flat.axes == ("seq",) and flat.pos[0, :, 0].tolist() == [0] + list(range(24))
    assert c.to(dtype=torch.float64).pos.dtype == torch.float64
    assert c.expand(3).pos.shape == (3, 25, 3)
    with pytest.raises(ValueError, match="batch size 1"):
        c.expand(3).expand(2)
    with pytest.raises(ValueError, match="axis"):
        c.select("x")


def test_check_tokens():
    c = Coords.grid(4, 4, num_prefix_tokens=1)
    c.check_tokens(8, 17)
    with pytest.raises(ValueError, match="17 tokens"):
        c.check_tokens(8, 16)
    assert math.prod(c.grid_shape) + c.num_prefix_tokens == 17


def test_token_count_errors_name_the_likely_cause():
    """197 tokens on a 14 x 14 grid: a class token the coords lack; q as (B, N, H, D): swapped dims."""
    from mmpos import create
    from mmpos.nn import attention

    grid = Coords.grid(14, 14)
    with pytest.raises(ValueError, match=r"N = 197 = 196 \+ 1: .* pass num_prefix_tokens=1 \(Coords.grid\(14, 14, "):
        grid.check_tokens(2, 197)
    with pytest.raises(ValueError, match=r"N = 200 = 197 \+ 3: .* num_prefix_tokens=4"):
        Coords.grid(14, 14, num_prefix_tokens=1).check_tokens(2, 200)
    q = torch.randn(2, 197, 4, 16)  # (B, N, H, D): heads and tokens swapped
    coords = Coords.grid(14, 14, num_prefix_tokens=1)
    with pytest.raises(ValueError, match=r"q must be \(B, H, N, D\) but looks like \(B, N, H, D\)"):
        attention(q, q, q, coords, [create("rope-axial", head_dim=16)])
    with pytest.raises(ValueError, match=r"q must be \(B, H, N, D\) but looks like \(B, N, H, D\)"):
        create("rope-axial", head_dim=16).rotate(q, q, coords)
    for coords, tokens in ((Coords.grid(14, 14), 190), (Coords.sequence(196), 197)):  # fewer tokens; not a grid
        with pytest.raises(ValueError) as err:
            coords.check_tokens(2, tokens)
        assert "num_prefix_tokens" not in str(err.value) and "looks like" not in str(err.value)


# ----------------------------------------------------------------------------- reliability
def test_select_reordering_axes_drops_grid_shape():
    c = Coords.grid(3, 5)
    wh = c.select("w", "h")
    assert wh.grid_shape is None  # tokens stay in (h, w) row-major order; (5, 3) would misdescribe them
    assert c.select("h", "w").grid_shape == (3, 5)
    # encoders that read the grid refuse it instead of reading a wrong layout
    with pytest.raises(ValueError, match="grid"):
        mmpos.create("peg", dim=4)(torch.zeros(1, 15, 4), wh)
    with pytest.raises(ValueError, match="grid"):
        mmpos.create("learned", dim=4, grid_size=(5, 3)).embed(wh)


def test_grid_too_large_is_refused_before_allocating():
    with pytest.raises(ValueError, match="10,000,000,000 tokens"):
        Coords.grid(100000, 100000)
    with pytest.raises(ValueError, match="n="):
        Coords.sequence(2**31)


@pytest.mark.parametrize("dtype, exact", [(torch.float16, 2048), (torch.bfloat16, 256)])
def test_half_precision_coordinates_warn(dtype, exact):
    with pytest.warns(UserWarning, match=f"exactly only up to {exact}"):
        c = Coords.sequence(4000, dtype=dtype)
    assert c.pos.unique().numel() < 4000  # what the warning is about
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Coords.sequence(4000)  # float32: no warning


# ----------------------------------------------------------------------------- pytree input
class _Net(torch.nn.Module):
    """A model that takes coordinates as an input: ``forward(x (B, N, D), coords)``."""

    def __init__(self, pos: str = "mrope"):
        super().__init__()
        torch.manual_seed(0)
        self.net = Transformer(32, 1, 4, pos=pos)

    def forward(self, x, coords):
        return self.net(x, coords)


def _mrope_coords(b: int, n: int, seed: int = 0) -> Coords:
    g = torch.Generator().manual_seed(seed)
    pos = torch.randint(0, 50, (b, n, 3), generator=g).float()
    mask = torch.ones(b, n, dtype=torch.bool)
    mask[0, n - 2 :] = False  # padding in the first sample
    return Coords(pos, ("t", "h", "w"), mask=mask, modality=torch.zeros(b, n, dtype=torch.long))


def test_flatten_unflatten_round_trip_keeps_every_field():
    c = Coords.grid(3, 4, num_prefix_tokens=1, batch=2)
    leaves, spec = pytree.tree_flatten(c)
    tensors = [leaf for leaf in leaves if leaf is not None]  # mask None (a leaf or no leaf, by torch release)
    assert len(tensors) == 2 and tensors[0] is c.pos and tensors[1] is c.modality
    back = pytree.tree_unflatten(leaves, spec)
    assert isinstance(back, Coords) and back.pos is c.pos and back.modality is c.modality and back.mask is None
    assert (back.axes, back.num_prefix_tokens, back.grid_shape) == (("h", "w"), 1, (3, 4))
    doubled = pytree.tree_map(lambda t: t * 2 if t is not None and t.is_floating_point() else t, c)  # statics kept
    assert torch.equal(doubled.pos, 2 * c.pos) and doubled.grid_shape == (3, 4)
    keyed, _ = pytree.tree_flatten_with_path(_mrope_coords(2, 5))
    assert [pytree.keystr(k) for k, _ in keyed] == [".pos", ".mask", ".modality"]


def test_torch_export_takes_coords_as_an_input_with_dynamic_batch_and_tokens():
    model = _Net().eval()
    x, coords = torch.randn(2, 10, 32), _mrope_coords(2, 10)
    b, n = Dim("b", min=1, max=64), Dim("n", min=2, max=512)
    program = torch.export.export(
        model, (x, coords), dynamic_shapes=({0: b, 1: n}, [{0: b, 1: n}, {0: b, 1: n}, {0: b, 1: n}])
    )
    for batch, tokens in ((2, 10), (3, 17)):
        x2, c2 = torch.randn(batch, tokens, 32), _mrope_coords(batch, tokens, seed=tokens)
        assert torch.allclose(program.module()(x2, c2), model(x2, c2), atol=1e-5)
    buffer = io.BytesIO()  # the program saves and loads (the context is written as JSON)
    torch.export.save(program, buffer)
    buffer.seek(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback to an unsafe load of the example inputs
        loaded = torch.export.load(buffer)
    assert torch.allclose(loaded.module()(x, coords), model(x, coords), atol=1e-5)


def test_torch_export_of_grid_coords_keeps_the_grid():
    model = _Net("rope-axial").eval()
    x, coords = torch.randn(2, 13, 32), Coords.grid(3, 4, num_prefix_tokens=1, batch=2)
    program = torch.export.export(model, (x, coords))
    assert torch.allclose(program.module()(x, coords), model(x, coords), atol=1e-6)


def test_torch_compile_fullgraph_takes_coords():
    model = _Net().eval()
    compiled = torch.compile(model, fullgraph=True, backend="eager")
    for n in (8, 8, 12):
        x, coords = torch.randn(2, n, 32), _mrope_coords(2, n, seed=n)
        assert torch.allclose(compiled(x, coords), model(x, coords), atol=1e-5)
