"""ONNX through torch.onnx.export(..., dynamo=True), run with onnxruntime: outputs equal eager."""

import pytest
import torch
from torch import nn
from torch.export import Dim

from mmpos import Coords
from mmpos.export import to_onnx
from mmpos.nn import Transformer, VisionTransformer

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")


class MRopeDecoder(nn.Module):
    """A small causal decoder with M-RoPE, fed Hugging Face ``(3, B, L)`` position ids."""

    def __init__(self, vocab: int = 50, dim: int = 32):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.net = Transformer(dim, 2, 2, pos="mrope", causal=True, mlp_ratio=2)
        self.head = nn.Linear(dim, vocab)

    def forward(self, input_ids, position_ids):
        coords = Coords(position_ids.permute(1, 2, 0).float(), ("t", "h", "w"))
        return self.head(self.net(self.embed(input_ids), coords))


def _run_onnx(program, tmp_path, inputs):
    path = tmp_path / "model.onnx"
    program.save(str(path))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    return torch.from_numpy(session.run(None, {k: v.numpy() for k, v in zip(names, inputs)})[0])


def _vit(pos: str, img=(16, 20), **pos_kwargs):
    torch.manual_seed(0)
    kw = {pos: pos_kwargs} if pos_kwargs else None
    model = VisionTransformer(img, 4, dim=32, depth=2, num_heads=2, pos=pos, pos_kwargs=kw, num_classes=5).eval()
    for p in model.parameters():
        if not p.any():  # zero-initialised tables and biases: make them matter
            nn.init.normal_(p, std=0.2)
    return model


IMAGE_DIMS = ({0: Dim("b", min=1, max=8), 2: 4 * Dim("h", min=2, max=32), 3: 4 * Dim("w", min=2, max=32)},)


@pytest.mark.slow
@pytest.mark.parametrize("pos", ["rope-axial", "peg"])
def test_vit_onnx_with_dynamic_image_size_matches_eager(tmp_path, pos):
    model = _vit(pos)
    program = to_onnx(model, (torch.randn(2, 3, 16, 20),), dynamic_shapes=IMAGE_DIMS)
    other = torch.randn(3, 3, 24, 32)  # another batch and a 6 x 8 token grid
    torch.testing.assert_close(_run_onnx(program, tmp_path, [other]), model(other), atol=1e-4, rtol=1e-4)


@pytest.mark.slow
def test_irpe_vit_onnx_matches_eager(tmp_path):
    model = _vit("irpe", img=16, rpe_on="qkv")
    program = to_onnx(model, (torch.randn(2, 3, 16, 16),), dynamic_shapes=({0: Dim("b", min=1, max=8)},))
    images = torch.randn(3, 3, 16, 16)
    torch.testing.assert_close(_run_onnx(program, tmp_path, [images]), model(images), atol=1e-4, rtol=1e-4)


@pytest.mark.slow
def test_mrope_decoder_onnx_with_3_row_position_ids_matches_eager(tmp_path):
    from mmpos.layout import Image, Text, build

    torch.manual_seed(0)
    model = MRopeDecoder().eval()
    b, n = Dim("b", min=1, max=8), Dim("n", min=2, max=512)
    ids = torch.randint(0, 50, (2, 9))
    program = to_onnx(model, (ids, torch.arange(9).expand(3, 2, 9)), dynamic_shapes=({0: b, 1: n}, {1: b, 2: n}))
    layout = build([[Text(3), Image((1, 4, 6)), Text(4)]] * 2, "qwen2-vl")  # (3, 2, 13) ids of a prompt
    ids2 = torch.randint(0, 50, (2, 13))
    expected = model(ids2, layout.position_ids)
    torch.testing.assert_close(
        _run_onnx(program, tmp_path, [ids2, layout.position_ids]), expected, atol=1e-4, rtol=1e-4
    )


def test_onnx_export_with_a_dynamic_grid_names_the_static_encoder():
    model = _vit("learned", img=16)
    dims = ({2: 4 * Dim("h", min=2, max=16), 3: 4 * Dim("w", min=2, max=16)},)
    with pytest.raises(
        ValueError, match=r"transformer\.pos_encoders\.learned \(LearnedPositionEmbedding\) picks or resamples"
    ):
        to_onnx(model, (torch.randn(2, 3, 16, 16),), dynamic_shapes=dims)
