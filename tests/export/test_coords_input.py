"""A ``Coords`` as an exported input (a pytree node): ONNX through ``torch.onnx.export(..., dynamo=True)``,
run with onnxruntime, equals eager; the ONNX inputs are the coordinates' tensors."""

import pytest
import torch
from torch.export import Dim

from mmpos import Coords
from mmpos.export import export, to_onnx
from mmpos.nn import Transformer

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")


class Decoder(torch.nn.Module):
    """``forward(x (B, N, D), coords)``: the coordinates arrive as an input, built outside the model."""

    def __init__(self, pos: str):
        super().__init__()
        torch.manual_seed(0)
        self.net = Transformer(32, 1, 4, pos=pos, causal=True)

    def forward(self, x, coords):
        return self.net(x, coords)


def _coords(b: int, n: int, seed: int) -> Coords:
    g = torch.Generator().manual_seed(seed)
    return Coords(torch.randint(0, 40, (b, n, 3), generator=g).float(), ("t", "h", "w"))


def test_onnx_takes_coords_and_runs_at_other_sizes(tmp_path):
    model = Decoder("mrope").eval()
    x, coords = torch.randn(2, 10, 32), _coords(2, 10, 0)
    b, n = Dim("b", min=1, max=64), Dim("n", min=2, max=512)
    dims = ({0: b, 1: n}, [{0: b, 1: n}, None, None])  # Coords children: pos, mask, modality
    program = to_onnx(model, (x, coords), str(tmp_path / "m.onnx"), dynamic_shapes=dims)
    program.save(str(tmp_path / "m.onnx"))
    session = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    assert names == ["x", "coords_pos"]  # mask and modality are None here: no input
    for batch, tokens in ((2, 10), (3, 23)):
        x2, c2 = torch.randn(batch, tokens, 32), _coords(batch, tokens, tokens)
        got = session.run(None, {"x": x2.numpy(), "coords_pos": c2.pos.numpy()})[0]
        assert torch.allclose(torch.from_numpy(got), model(x2, c2), atol=1e-5)


def test_mmpos_export_accepts_coords_inputs():
    model = Decoder("rope-axial").eval()
    x, coords = torch.randn(2, 12, 32), Coords.grid(3, 4, batch=2)
    program = export(model, (x, coords), dynamic_shapes=({0: Dim("b")}, [{0: Dim("b")}, None, {0: Dim("b")}]))
    x3, c3 = torch.randn(3, 12, 32), Coords.grid(3, 4, batch=3)
    assert torch.allclose(program.module()(x3, c3), model(x3, c3), atol=1e-6)
